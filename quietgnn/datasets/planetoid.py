"""The Planetoid raw files (Cora, CiteSeer, PubMed), read without running anything they hold.

``ind.<name>.{x,tx,allx,y,ty,ally,graph}`` are Python 2 pickles (kimiyoung/planetoid): feature
rows as ``scipy.sparse.csr_matrix``, one-hot label rows as ``numpy.ndarray``, the adjacency as
``collections.defaultdict(list)``; ``ind.<name>.test.index`` is text, one node id a line. PyG
reads the pickles with a bare ``pickle.load``, so a planted file whose ``__reduce__`` names
``os.system`` runs it. Here they go through :class:`_Unpickler`, whose ``find_class`` admits
only what those files hold (``_ADMITTED``, checked to build nothing but arrays, sparse
matrices, lists and dicts); any other global is refused, before it is called, with one line
naming the file and the global.

:func:`read_planetoid` then builds what PyG's ``read_planetoid_data`` builds (CiteSeer's
isolated test nodes padded with zero rows, the test rows put back in id order; the public
split: the first ``len(y)`` nodes train, the next 500 validate, ``test.index`` tests).
``tests/test_datasets.py`` checks the graph equals PyG's, array for array, on the real Cora
and CiteSeer.
"""

from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from ..heap import mem_available_mb

__all__ = ["PLANETOID_FILES", "PlanetoidArrays", "read_planetoid"]

#: the raw files, in PyG's order (``ind.<name>.<suffix>``)
PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_ORIGINAL = "https://github.com/kimiyoung/planetoid/tree/master/data"

# numpy's own pickling functions, taken from numpy itself: their module is numpy.core under
# numpy 1 and numpy._core under numpy 2, and the pickles name either
_RECONSTRUCT = np.zeros(0).__reduce__()[0]
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]


class _Refused(pickle.UnpicklingError):
    """A global that no Planetoid file holds (its name is the message)."""


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    # what ndarray.__reduce__ writes: an empty ndarray, filled by its __setstate__ (BUILD)
    if subtype is not np.ndarray or tuple(shape) != (0,):
        raise _Refused(f"numpy _reconstruct({subtype!r}, {shape!r})")
    return _RECONSTRUCT(subtype, shape, dtype)


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    # how pickle protocol 2 stores bytes under Python 3: _codecs.encode(str, 'latin1')
    if not isinstance(text, str) or encoding != "latin1":
        raise _Refused(f"_codecs.encode(..., {encoding!r})")
    return text.encode("latin1")


#: every global a Planetoid pickle may name (Python 2 and 3 spellings) -> what it gets
_ADMITTED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
    ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
    ("_codecs", "encode"): _latin1,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ADMITTED.get((module, name))
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _unpickle(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return _Unpickler(f, encoding="latin1").load()
    except _Refused as exc:
        raise ValueError(f"{path}: refused: this pickle calls {exc}, which no Planetoid file "
                         f"holds (they hold numpy arrays, a scipy csr_matrix or a dict of "
                         f"lists); quietgnn never unpickles anything else, as it could run "
                         f"code. Replace the file with the original ({_ORIGINAL})") from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise ValueError(f"{path}: not a readable Planetoid file ({_one_line(exc)}); replace "
                         f"it with the original ({_ORIGINAL})") from None


def _matrix(obj: Any, path: Path) -> Tensor:
    """float32 ``[rows, cols]`` of a feature or one-hot label file, as PyG converts it."""
    if type(obj) is sp.csr_matrix:
        try:
            obj.check_format(full_check=True)    # scipy's dense conversion trusts its arrays
            rows, cols = (int(v) for v in obj.shape)
        except Exception as exc:  # noqa: BLE001 - any attribute BUILD may have set
            raise ValueError(f"{path}: not a valid sparse matrix ({_one_line(exc)}); replace "
                             f"it with the original ({_ORIGINAL})") from None
        need_mb = rows * cols * obj.dtype.itemsize / 2 ** 20
        if need_mb > mem_available_mb():
            raise ValueError(f"{path}: a sparse matrix of shape ({rows}, {cols}) would need "
                             f"{need_mb:.0f} MiB dense, more than the {mem_available_mb():.0f} "
                             f"MiB available; the file is not a Planetoid file: replace it "
                             f"with the original ({_ORIGINAL})")
        obj = np.asarray(obj.todense())
    if type(obj) is not np.ndarray or obj.ndim != 2 or obj.dtype.kind not in "biuf":
        what = f"an array {obj.dtype} of shape {obj.shape}" if isinstance(obj, np.ndarray) \
            else f"a {type(obj).__name__}"
        raise ValueError(f"{path}: holds {what}; expected a 2-D numeric matrix (csr_matrix or "
                         f"ndarray), one row per node. Replace it with the original "
                         f"({_ORIGINAL})")
    return torch.from_numpy(obj).to(torch.float)


def _edges(graph: Any, path: Path, n: int) -> Tensor:
    """``[2, E]`` (node, neighbour) from the adjacency dict ``{node: [neighbours]}``."""
    if not isinstance(graph, dict) or not all(isinstance(v, list) for v in graph.values()):
        raise ValueError(f"{path}: holds a {type(graph).__name__}; expected a dict of lists "
                         f"(node id -> neighbour ids). Replace it with the original "
                         f"({_ORIGINAL})")
    ids = [*graph.keys(), *(u for v in graph.values() for u in v)]
    if not all(isinstance(u, (int, np.integer)) and not isinstance(u, bool) for u in ids):
        raise ValueError(f"{path}: node ids must be integers; replace the file with the "
                         f"original ({_ORIGINAL})")
    rows = np.repeat(np.fromiter(graph.keys(), np.int64, len(graph)),
                     [len(v) for v in graph.values()])
    cols = np.fromiter((u for v in graph.values() for u in v), np.int64, rows.size)
    ei = np.stack([rows, cols])
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        bad = int(ei.min()) if ei.min() < 0 else int(ei.max())
        raise ValueError(f"{path}: holds node id {bad}, outside [0, {n}) where {n} is the "
                         f"number of nodes the label files give; the files do not belong "
                         f"together: replace them with the originals ({_ORIGINAL})")
    return torch.from_numpy(ei)


def _test_index(path: Path) -> Tensor:
    try:
        idx = np.loadtxt(path, dtype=np.int64, ndmin=1)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: {_one_line(exc)}; expected one integer node id per line")
    if idx.ndim != 1 or idx.size == 0:
        raise ValueError(f"{path}: expected one integer node id per line, found shape "
                         f"{idx.shape}")
    return torch.from_numpy(idx)


@dataclass
class PlanetoidArrays:
    """What PyG's ``Data`` holds: ``edge_index [2, E]`` (as stored: one way, duplicates and
    self-loops kept), ``x [N, F]`` float32, ``y [N]`` int64, the public split's masks ``[N]``."""

    edge_index: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor


def read_planetoid(raw: Path, name: str) -> PlanetoidArrays:
    """Read ``raw/ind.<name>.*`` (see the module docstring); every problem is a ``ValueError``
    naming the file."""
    stem = name.lower()
    path = {s: raw / f"ind.{stem}.{s}" for s in PLANETOID_FILES}
    x, tx, allx, y, ty, ally = (_matrix(_unpickle(path[s]), path[s])
                                for s in ("x", "tx", "allx", "y", "ty", "ally"))
    graph = _unpickle(path["graph"])
    test_index = _test_index(path["test.index"])
    _check_shapes(path, x, tx, allx, y, ty, ally, test_index, stem == "citeseer")
    # from here on PyG's read_planetoid_data, step for step
    train_index = torch.arange(y.size(0), dtype=torch.long)
    val_index = torch.arange(y.size(0), y.size(0) + 500, dtype=torch.long)
    sorted_test_index = test_index.sort()[0]
    if stem == "citeseer":
        # isolated nodes have no test row: zero rows fill the gaps in the test ids
        span = int(test_index.max() - test_index.min()) + 1
        tx_ext = torch.zeros(span, tx.size(1), dtype=tx.dtype)
        tx_ext[sorted_test_index - test_index.min(), :] = tx
        ty_ext = torch.zeros(span, ty.size(1), dtype=ty.dtype)
        ty_ext[sorted_test_index - test_index.min(), :] = ty
        tx, ty = tx_ext, ty_ext
    n = allx.size(0) + tx.size(0)
    if int(test_index.max()) >= n or y.size(0) + 500 > n:
        raise ValueError(f"{path['test.index']}: test ids reach {int(test_index.max())} and "
                         f"{y.size(0)} training + 500 validation nodes are expected, but the "
                         f"feature files hold {n} nodes; the files do not belong together: "
                         f"replace them with the originals ({_ORIGINAL})")
    x = torch.cat([allx, tx], dim=0)
    x[test_index] = x[sorted_test_index]
    y = torch.cat([ally, ty], dim=0).max(dim=1)[1]
    y[test_index] = y[sorted_test_index]
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for m, idx in zip(masks, (train_index, val_index, test_index)):
        m[idx] = True
    return PlanetoidArrays(_edges(graph, path["graph"], n), x, y, *masks)


def _check_shapes(path: dict[str, Path], x: Tensor, tx: Tensor, allx: Tensor, y: Tensor,
                  ty: Tensor, ally: Tensor, test_index: Tensor, citeseer: bool) -> None:
    """The files agree: as many label rows as feature rows, one test row per test id (and,
    but for CiteSeer, consecutive test ids), the same feature and class widths, ids >= 0."""
    def fail(s: str, what: str) -> ValueError:
        return ValueError(f"{path[s]}: {what}; the files do not belong together: replace "
                          f"them with the originals ({_ORIGINAL})")
    for s, m in (("x", x), ("tx", tx)):
        if m.size(1) != allx.size(1):
            raise fail(s, f"{m.size(1)} feature columns, ind.*.allx has {allx.size(1)}")
    for s, m in (("y", y), ("ty", ty)):
        if m.size(1) != ally.size(1):
            raise fail(s, f"{m.size(1)} classes, ind.*.ally has {ally.size(1)}")
    for (s, m), (t, ref) in ((("y", y), ("x", x)), (("ally", ally), ("allx", allx)),
                             (("ty", ty), ("tx", tx))):
        if m.size(0) != ref.size(0):
            raise fail(s, f"{m.size(0)} label rows, ind.*.{t} has {ref.size(0)} feature rows")
    if tx.size(0) != test_index.numel():
        raise fail("test.index", f"{test_index.numel()} test ids, ind.*.tx has {tx.size(0)} "
                                 f"rows")
    if int(test_index.min()) < 0 or test_index.unique().numel() != test_index.numel():
        raise fail("test.index", "test ids must be distinct and >= 0")
    span = int(test_index.max() - test_index.min()) + 1
    if not citeseer and span != test_index.numel():
        raise fail("test.index", f"the test ids span {span} nodes but there are "
                                 f"{test_index.numel()} (only CiteSeer's have gaps)")
    if span > 100 * test_index.numel():
        raise fail("test.index", f"the test ids span {span} nodes for "
                                 f"{test_index.numel()} test rows")
