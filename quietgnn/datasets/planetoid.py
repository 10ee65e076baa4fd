"""The Planetoid raw files (Cora, CiteSeer, PubMed), read without running anything they hold.

``ind.<name>.{x,tx,allx,y,ty,ally,graph}`` are Python 2 pickles (kimiyoung/planetoid): feature
rows as ``scipy.sparse.csr_matrix``, one-hot label rows as ``numpy.ndarray``, the adjacency as
``collections.defaultdict(list)``; ``ind.<name>.test.index`` is text, one node id a line. PyG
reads the pickles with a bare ``pickle.load``, so a planted file whose ``__reduce__`` names
``os.system`` runs it. Here they go through :class:`_Unpickler`, whose ``find_class`` admits
only the globals those files name (``_Unpickler.admitted``); any other is refused, before it is
called, with one line naming the file and the global.

Nothing a file sets reaches a numpy or scipy object: the admitted names stand for inert
records of this module (the pickle's BUILD step calls their ``__setstate__``, which checks its
state), and the arrays are rebuilt from checked parts afterwards:

- ``numpy.dtype(name, align, copy)`` + state ``(3, endian, None, None, None, ...)``: a plain
  ``[biuf][1248]`` type (:class:`_DType`);
- ``_reconstruct(ndarray, (0,), 'b')`` + state ``(1, shape, dtype, fortran, raw)``, or
  ``_frombuffer(raw, dtype, shape, order)`` (protocol 5): a 1-D or 2-D array whose
  ``rows * cols * itemsize`` is exactly ``len(raw)``, kept as a view of those bytes
  (:class:`_Array`); ``numpy.ndarray`` is only ever that first argument, never called;
- ``csr_matrix`` (NEWOBJ) + state ``{data, indices, indptr, _shape}`` (and the flags ``format``,
  ``maxprint``, ``..has_sorted_indices``, which are ignored): :class:`_Csr`; any other key
  (a shadowed ``check_format``) is refused. :func:`_dense` builds a fresh ``csr_matrix`` from
  the four and checks every index before scipy's C code densifies it;
- ``defaultdict(list)`` + SETITEMS: a plain dict; ``list`` is only ever that argument.

A pickle can share one object many times (its memo) at the cost of a few bytes: that makes
nothing bigger here, as no admitted call copies anything the file has not paid for
(``_Unpickler.budget``), and :func:`_edges` refuses a graph whose lists hold more entries than
the file has bytes. Dense matrices are checked against available memory before they exist.
Before any of it, :func:`_prescan` reads the opcodes for what would harm CPython's unpickler
itself (a huge memo slot, tuples nested past the C stack).

:func:`read_planetoid` then builds what PyG's ``read_planetoid_data`` builds (CiteSeer's
isolated test nodes padded with zero rows, the test rows put back in id order; the public
split: the first ``len(y)`` nodes train, the next 500 validate, ``test.index`` tests).
``tests/test_datasets.py`` checks the graph equals PyG's, array for array, on the real Cora
and CiteSeer.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import re
import reprlib
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

#: a csr_matrix's pickled attributes: the four read, then flags scipy (old and new) writes
_CSR_PARTS = ("data", "indices", "indptr", "_shape")
_CSR_FLAGS = frozenset({"format", "maxprint", "_cs_matrix__has_sorted_indices",
                        "_has_sorted_indices", "_has_canonical_format"})
_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
#: CPython 3.11 hashes a tuple by recursing into it, unguarded: a 200,000-deep tuple as a dict
#: key (2 MB of TUPLE1) overflows the C stack. Nesting needs one opcode a level; a Planetoid
#: file builds about 20 tuples.
_TUPLE_OPS, _MAX_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "FROZENSET"}), 1000


class _Refused(pickle.UnpicklingError):
    """A global that no Planetoid file names, or names but never calls (the message says)."""


class _Bad(pickle.UnpicklingError):
    """Contents no Planetoid file holds (the message says what was found)."""


class _Marker:
    """A global a Planetoid pickle passes as an argument only (``numpy.ndarray`` to
    ``_reconstruct``, ``list`` to ``defaultdict``): calling it is refused."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __setattr__(self, key: str, value: Any) -> None:
        raise _Bad(f"sets {self.name}.{key}")    # BUILD's slot state: markers are shared

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _Refused(f"{self.name} directly")

    def __repr__(self) -> str:
        return self.name


_NDARRAY, _LIST = _Marker("numpy.ndarray"), _Marker("builtins.list")


class _DType:
    """``numpy.dtype(name, align, copy)``: a plain number type, nothing structured."""

    def __init__(self, name: Any, align: Any = False, copy: Any = True) -> None:
        if not (isinstance(name, str) and re.fullmatch(r"[biuf][1248]", name)):
            raise _Bad(f"holds an array type {_short(name)}; Planetoid arrays are numbers "
                       f"(numpy types b1, i4, f4, ...)")
        self.dtype, self._built = np.dtype(name), False

    def __setstate__(self, state: Any) -> None:
        if (self._built or type(state) is not tuple or len(state) != 8
                or state[1] not in ("<", ">", "|", "=") or state[2:5] != (None,) * 3):
            raise _Bad(f"holds the array type {self.dtype} with state {_short(state)}, which "
                       f"numpy never writes for a plain number type")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])
        self._built = True


class _Array:
    """An array as numpy pickles it: a read-only view of the file's bytes (``array``), or
    ``None`` until its state (``_reconstruct``'s BUILD) arrives."""

    def __init__(self, owner: _Unpickler | None, array: np.ndarray | None = None) -> None:
        self._owner, self.array = owner, array

    def __setstate__(self, state: Any) -> None:
        if self._owner is None or type(state) is not tuple or len(state) != 5 \
                or state[0] != 1 or type(state[3]) is not bool:
            raise _Bad(f"holds array state {_short(state)}; numpy writes (1, shape, dtype, "
                       f"fortran, bytes), once, after _reconstruct")
        _, shape, dtype, fortran, raw = state
        self.array = self._owner.view(raw, dtype, shape, "F" if fortran else "C")
        self._owner = None


class _Csr:
    """A ``csr_matrix``'s pickled attributes (``parts``: the four :func:`_dense` reads); not
    a scipy object, so nothing the file sets can replace a method."""

    def __setstate__(self, state: Any) -> None:
        if hasattr(self, "parts") or type(state) is not dict:
            raise _Bad(f"holds sparse matrix state of type {type(state).__name__}; scipy "
                       f"writes one dict of attributes")
        odd = sorted(_short(k) for k in state if k not in _CSR_PARTS and k not in _CSR_FLAGS)
        missing = [k for k in _CSR_PARTS if k not in state]
        if odd or missing:
            found = f"attribute(s) {', '.join(odd)}" if odd else f"no {', '.join(missing)}"
            raise _Bad(f"refused: holds a sparse matrix with {found}; a csr_matrix's pickle "
                       f"holds {', '.join(_CSR_PARTS)} (and flags) only")
        self.parts = {k: state[k] for k in _CSR_PARTS}


class _Unpickler(pickle.Unpickler):
    """Unpickles ``data`` (one whole file) with only :attr:`admitted`'s globals.

    ``budget``: the bytes the admitted calls may still create by copying (text to bytes);
    it starts at the file's size, as an honest file holds every such string once."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.budget = len(data)
        # every global a Planetoid pickle may name (Python 2 and 3, numpy 1 and 2 spellings)
        self.admitted: dict[tuple[str, str], Any] = {
            ("numpy", "ndarray"): _NDARRAY,
            ("numpy", "dtype"): _dtype,
            ("numpy.core.multiarray", "_reconstruct"): self._reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): self._reconstruct,
            ("numpy.core.numeric", "_frombuffer"): self._frombuffer,
            ("numpy._core.numeric", "_frombuffer"): self._frombuffer,
            ("scipy.sparse.csr", "csr_matrix"): _Csr,
            ("scipy.sparse._csr", "csr_matrix"): _Csr,
            ("collections", "defaultdict"): _defaultdict,
            ("__builtin__", "list"): _LIST,
            ("builtins", "list"): _LIST,
            ("_codecs", "encode"): self._latin1,
        }

    def find_class(self, module: str, name: str) -> Any:
        found = self.admitted.get((module, name))
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found

    def _spend(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise _Bad("decodes more bytes than the file holds (one string used many "
                       "times)")

    def _latin1(self, text: Any, encoding: Any = "latin1") -> bytes:
        # how pickle protocol 2 stores bytes under Python 3: _codecs.encode(str, 'latin1')
        if not isinstance(text, str) or encoding != "latin1":
            raise _Refused(f"_codecs.encode(..., {_short(encoding)})")
        self._spend(len(text))
        return text.encode("latin1")

    def _reconstruct(self, subtype: Any, shape: Any, typecode: Any) -> _Array:
        # what ndarray.__reduce__ writes: an empty array, given its data by BUILD
        if subtype is not _NDARRAY or shape != (0,) or typecode not in ("b", b"b"):
            raise _Refused(f"numpy _reconstruct({_short(subtype)}, {_short(shape)}, "
                           f"{_short(typecode)})")
        return _Array(self)

    def _frombuffer(self, raw: Any, dtype: Any, shape: Any, order: Any) -> _Array:
        if order not in ("C", "F"):
            raise _Bad(f"holds an array in order {_short(order)}; 2-D arrays are 'C' or 'F'")
        return _Array(None, self.view(raw, dtype, shape, order))

    def view(self, raw: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
        """``raw`` as a ``shape`` array of ``dtype``, which must use every byte of it."""
        if not isinstance(dtype, _DType):
            raise _Bad(f"holds an array whose type is a {type(dtype).__name__}")
        if (type(shape) is not tuple or not 1 <= len(shape) <= 2
                or not all(type(s) is int and s >= 0 for s in shape)):
            raise _Bad(f"holds an array of shape {_short(shape)}; expected 1 or 2 sizes >= 0")
        if isinstance(raw, str):      # Python 2's str, read as latin-1 text
            self._spend(len(raw))
            raw = raw.encode("latin1")
        if not isinstance(raw, (bytes, bytearray)):
            raise _Bad(f"holds array data of type {type(raw).__name__}; expected bytes")
        need = math.prod(shape) * dtype.dtype.itemsize
        if need != len(raw):
            raise _Bad(f"holds a {dtype.dtype} array of shape {shape}, {need} bytes, whose "
                       f"data is {len(raw)} bytes")
        if need == 0:
            return np.zeros(shape, dtype.dtype)
        return np.frombuffer(raw, dtype.dtype).reshape(shape, order=order)


def _dtype(name: Any, align: Any = False, copy: Any = True) -> _DType:
    # a function, not the class: NEWOBJ on it is refused (it is not a type)
    return _DType(name, align, copy)


def _defaultdict(factory: Any) -> dict:
    if factory is not _LIST:
        raise _Refused("collections.defaultdict with a default other than list")
    return {}


def _name(obj: Any) -> str:
    if isinstance(obj, _Array):
        return "numpy array" if obj.array is not None else "numpy array without data"
    return {_Csr: "csr_matrix", _DType: "numpy dtype"}.get(type(obj), type(obj).__name__)


def _short(obj: Any) -> str:
    # what a file holds may be nested a million deep or a megabyte long
    return reprlib.repr(obj)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _prescan(data: bytes) -> None:
    """What would harm CPython's own unpickler, found before it runs: a memo slot far beyond
    the opcodes before it (it sizes the memo by the largest slot a PUT names: slot 2**30 in a
    10-byte file allocates and clears 16 GiB; an honest pickle numbers its puts 0, 1, ...),
    and tuples enough to nest past the C stack (``_MAX_TUPLES``)."""
    tuples = 0
    for i, (op, arg, pos) in enumerate(pickletools.genops(data)):
        if op.name in _MEMO_OPS and int(arg) > i:
            raise _Bad(f"names memo slot {arg} at byte {pos}, after {i} opcodes (a pickle "
                       f"numbers them in order)")
        tuples += op.name in _TUPLE_OPS
        if tuples > _MAX_TUPLES:
            raise _Bad(f"builds more than {_MAX_TUPLES} tuples (a Planetoid file builds about "
                       f"20); nested, they overflow the stack when hashed")


def _unpickle(path: Path) -> tuple[Any, int]:
    """What ``path`` holds (its admitted records) and its size in bytes."""
    try:
        data = path.read_bytes()
        _prescan(data)
        return _Unpickler(data).load(), len(data)
    except _Refused as exc:
        raise ValueError(f"{path}: refused: this pickle calls {exc}, which no Planetoid file "
                         f"does (they hold numpy arrays, a scipy csr_matrix or a dict of "
                         f"lists); quietgnn never unpickles anything else, as it could run "
                         f"code. Replace the file with the original ({_ORIGINAL})") from None
    except _Bad as exc:
        raise ValueError(f"{path}: {exc}; it is not a Planetoid file: replace it with the "
                         f"original ({_ORIGINAL})") from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise ValueError(f"{path}: not a readable Planetoid file ({_one_line(exc)}); replace "
                         f"it with the original ({_ORIGINAL})") from None


def _fits(path: Path, what: str, nbytes: int) -> None:
    need_mb, have_mb = nbytes / 2 ** 20, mem_available_mb()
    if need_mb > have_mb:
        raise ValueError(f"{path}: {what} would need {need_mb:.0f} MiB, more than the "
                         f"{have_mb:.0f} MiB available; the file is not a Planetoid file: "
                         f"replace it with the original ({_ORIGINAL})")


def _part(parts: dict[str, Any], key: str, kinds: str, path: Path) -> np.ndarray:
    a = parts[key].array if isinstance(parts[key], _Array) else None
    if a is None or a.ndim != 1 or a.dtype.kind not in kinds:
        what = f"a {a.dtype} array of shape {a.shape}" if a is not None \
            else f"a {_name(parts[key])}"
        raise ValueError(f"{path}: the sparse matrix's {key} is {what}; expected a 1-D "
                         f"array of kind {kinds!r}. Replace the file with the original "
                         f"({_ORIGINAL})")
    return np.asarray(a, np.int64) if kinds == "iu" else a


def _dense(csr: _Csr, path: Path) -> np.ndarray:
    """The matrix a ``_Csr`` record describes, dense, its indices checked before scipy's C
    ``csr_todense`` (which writes wherever they point) sees them."""
    parts = getattr(csr, "parts", None)
    shape = parts and parts["_shape"]
    if type(shape) is not tuple or len(shape) != 2 \
            or not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError(f"{path}: holds a sparse matrix of shape {_short(shape)}; expected "
                         f"(rows, columns). Replace the file with the original ({_ORIGINAL})")
    data = _part(parts, "data", "biuf", path)
    indices, indptr = (_part(parts, k, "iu", path) for k in ("indices", "indptr"))
    try:
        m = sp.csr_matrix((data, indices, indptr), shape=shape)
        sp.csr_matrix.check_format(m, full_check=True)    # the class's, on scipy's own object
    except Exception as exc:  # noqa: BLE001 - whatever scipy finds wrong
        raise ValueError(f"{path}: not a valid sparse matrix ({_one_line(exc)}); replace "
                         f"it with the original ({_ORIGINAL})") from None
    _fits(path, f"a sparse matrix of shape {shape}, dense,", math.prod(shape)
          * (m.dtype.itemsize + 4))
    return m.toarray()


def _matrix(obj: Any, path: Path) -> Tensor:
    """float32 ``[rows, cols]`` of a feature or one-hot label file, as PyG converts it."""
    if isinstance(obj, _Csr):
        obj = _dense(obj, path)
    elif isinstance(obj, _Array) and obj.array is not None:
        obj = obj.array
        _fits(path, f"a {obj.dtype} array of shape {obj.shape}, as float32,", obj.size * 4)
    if type(obj) is not np.ndarray or obj.ndim != 2:
        what = f"an array {obj.dtype} of shape {obj.shape}" if isinstance(obj, np.ndarray) \
            else f"a {_name(obj)}"
        raise ValueError(f"{path}: holds {what}; expected a 2-D numeric matrix (csr_matrix or "
                         f"ndarray), one row per node. Replace it with the original "
                         f"({_ORIGINAL})")
    dense = np.asarray(obj, np.float32)       # native order; the file's bytes are read-only
    return torch.from_numpy(dense if dense.flags.writeable else dense.copy())


def _edges(graph: Any, path: Path, n: int, size: int) -> Tensor:
    """``[2, E]`` (node, neighbour) from the adjacency dict ``{node: [neighbours]}``.

    Each list entry costs the file a byte at least, unless lists are shared (the pickle's
    memo): more entries than ``size`` bytes is a file made to blow up, refused unbuilt."""
    if not isinstance(graph, dict) or not all(type(v) is list for v in graph.values()):
        raise ValueError(f"{path}: holds a {_name(graph)}; expected a dict "
                         f"of lists (node id -> neighbour ids). Replace it with the original "
                         f"({_ORIGINAL})")
    total = sum(len(v) for v in graph.values())
    if total > size:
        raise ValueError(f"{path}: its adjacency lists hold {total} entries in a {size}-byte "
                         f"file, so they share lists (each entry costs a byte otherwise); "
                         f"refused before building them. Replace it with the original "
                         f"({_ORIGINAL})")
    _fits(path, f"{total} edges", total * 16)
    for ids in (graph.keys(), *graph.values()):
        for u in ids:
            if type(u) is not int:
                raise ValueError(f"{path}: holds node id {_short(u)}; node ids are integers: "
                                 f"replace the file with the original ({_ORIGINAL})")
            if not 0 <= u < n:
                raise ValueError(f"{path}: holds node id {u}, outside [0, {n}) where {n} is "
                                 f"the number of nodes the label files give; the files do not "
                                 f"belong together: replace them with the originals "
                                 f"({_ORIGINAL})")
    rows = np.repeat(np.fromiter(graph.keys(), np.int64, len(graph)),
                     [len(v) for v in graph.values()])
    cols = np.fromiter((u for v in graph.values() for u in v), np.int64, total)
    return torch.from_numpy(np.stack([rows, cols]))


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
    x, tx, allx, y, ty, ally = (_matrix(_unpickle(path[s])[0], path[s])
                                for s in ("x", "tx", "allx", "y", "ty", "ally"))
    graph, graph_size = _unpickle(path["graph"])
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
    _fits(path["allx"], f"the {n} x {allx.size(1)} feature matrix", n * allx.size(1) * 4)
    x = torch.cat([allx, tx], dim=0)
    x[test_index] = x[sorted_test_index]
    y = torch.cat([ally, ty], dim=0).max(dim=1)[1]
    y[test_index] = y[sorted_test_index]
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for m, idx in zip(masks, (train_index, val_index, test_index)):
        m[idx] = True
    return PlanetoidArrays(_edges(graph, path["graph"], n, graph_size), x, y, *masks)


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
