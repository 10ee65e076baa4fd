"""The arrays a :class:`~quietgnn.graph.Graph` is built from, checked and normalised once for
every way in: :meth:`Graph.from_edge_index`, :meth:`Graph.from_pyg` and the own-data loaders
(``.npz``, edge lists) all call :func:`graph_inputs`, so the same bad input gets the same
refusal whichever path it came by.

What is accepted (and what it becomes):

* labels ``y``: integers, bool, whole-number floats (``1.0``) or, from files, names (strings;
  class ``k`` is the ``k``-th name in sorted order); ``[N]`` or ``[N, 1]``. A float that is not
  a whole number, NaN, a 2-D (one-hot) ``y`` or negative labels only are refused: cutting
  ``0.7`` to ``0`` would train on other labels than the user's.
* features ``x``: bool, integer or float ``[N, F]`` with ``F >= 1`` -> float32. Without ``x``,
  one-hot log2 degree buckets (:func:`degree_features`). A float64 value beyond float32's range
  is refused with its real value rather than becoming ``inf``.
* masks: all three or none (none: the caller draws a seeded random split); bool, or numbers
  that are all 0 or 1 (``0.3`` is refused, not taken as True).
* ``num_classes``: a whole number (``3.7`` is refused, not cut to 3); default ``max(y) + 1``.
* the number of nodes: the rows of ``x`` (of ``y`` without ``x``); where ``x`` and ``y``
  disagree, the one that disagrees with the masks too is blamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

__all__ = ["GraphInputs", "graph_inputs", "class_ids", "degree_features", "MASKS"]

MASKS = ("train_mask", "val_mask", "test_mask")
_DEGREE_BUCKETS = 16
_F32_MAX = float(np.finfo(np.float32).max)
#: values per block when scanning features (bounds the temporaries on big graphs)
_BLOCK = 1 << 22


def degree_features(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """float32 ``[N, 16]`` one-hot of ``min(floor(log2(undirected degree + 1)), 15)``."""
    ei = np.asarray(edge_index, dtype=np.int64)
    keep = ei[0] != ei[1]
    pairs = np.unique(np.sort(ei[:, keep], axis=0), axis=1)    # undirected, de-duplicated
    deg = np.bincount(pairs.reshape(-1), minlength=num_nodes)
    bucket = np.minimum(np.floor(np.log2(deg + 1)).astype(np.int64), _DEGREE_BUCKETS - 1)
    x = np.zeros((num_nodes, _DEGREE_BUCKETS), dtype=np.float32)
    x[np.arange(num_nodes), bucket] = 1.0
    return x


@dataclass
class GraphInputs:
    """Checked inputs: int64 ``[2, E]`` edges, float32 ``[N, F]`` features, int64 ``[N]``
    labels, three bool ``[N]`` masks or None, the number of classes, how the features were
    made (``"given"`` or ``"degree-buckets"``) and the label names (or None)."""

    edge_index: Tensor
    x: Tensor
    y: Tensor
    masks: tuple[Tensor, Tensor, Tensor] | None
    num_classes: int
    features: str
    label_names: list[str] | None


def _numpy(a: Any) -> np.ndarray:
    if isinstance(a, Tensor):
        a = a.detach().cpu()
        return (a.float() if a.dtype == torch.bfloat16 else a).numpy()
    return np.asarray(a)


def class_ids(arr: Any, where: str) -> tuple[np.ndarray, list[str] | None]:
    """(int64 class ids ``[N]``, the label names they stand for or None): names (strings)
    become classes in sorted order."""
    y = _numpy(arr)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 2:
        raise ValueError(f"{where}: labels have shape {tuple(y.shape)}, 2-D (one-hot or one "
                         f"score per class?); expected one class id per node [N]: convert with "
                         f"y.argmax(1)")
    if y.ndim != 1:
        raise ValueError(f"{where}: labels have shape {tuple(y.shape)}, expected [N] (one class "
                         f"id per node)")
    if y.dtype.kind in "US":
        names, ids = np.unique(y.astype(str), return_inverse=True)
        return ids.astype(np.int64), [str(n) for n in names]
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{where}: labels must be integer class ids in [0, num_classes); "
                             f"found non-integer or NaN values ({int(bad.sum())}, first "
                             f"{float(y[i]):.6g} at node {i}); cutting them to integers would "
                             f"train on other labels: give class ids (whole numbers)")
    elif y.dtype.kind not in "iub":
        raise ValueError(f"{where}: labels have dtype {y.dtype}, expected integers or names")
    if y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
        # the cast would wrap it to a negative number and name that instead
        raise ValueError(f"{where}: label {int(y.max())} is not a class id; expected class ids "
                         f"in [0, num_classes)")
    return y.astype(np.int64, copy=False), None


def _features(arr: Any, where: str) -> np.ndarray:
    """float32 ``[rows, F >= 1]`` from bool, integer or float features."""
    x = _numpy(arr)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"{where}: features have shape {tuple(x.shape)}, expected [N, F] with "
                         f"F >= 1 feature columns (without features, leave x out: nodes then "
                         f"get degree-bucket features)")
    if x.dtype.kind not in "biuf":
        raise ValueError(f"{where}: features have dtype {x.dtype}, expected numbers (bool, "
                         f"integer or float)")
    if x.dtype.kind == "f" and x.dtype.itemsize > 4:
        # the cast would turn 1e300 into inf (and numpy would warn): name the real value
        step = max(1, _BLOCK // x.shape[1])
        for a in range(0, x.shape[0], step):
            bad = ~(np.abs(x[a:a + step]) <= _F32_MAX)     # NaN compares False: bad too
            if bad.any():
                i, j = (int(v) for v in np.argwhere(bad)[0])
                raise ValueError(f"{where}: feature value {float(x[a + i, j])!r} at node {a + i}, "
                                 f"feature {j} is NaN/Inf or beyond float32's range (+-3.4e38), "
                                 f"the dtype features are trained in; clean, impute or rescale "
                                 f"features first")
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _mask(arr: Any, where: str, n: int) -> np.ndarray:
    m = _numpy(arr)
    if m.ndim != 1 or m.shape[0] != n:
        raise ValueError(f"{where}: mask has shape {tuple(m.shape)}, expected [{n}] (one bool "
                         f"per node)")
    if m.dtype.kind == "b":
        return m
    if m.dtype.kind not in "iuf":
        raise ValueError(f"{where}: mask has dtype {m.dtype}, expected bool (or 0/1 numbers)")
    bad = (m != 0) & (m != 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{where}: mask holds {m[i].item():.6g} at node {i}; expected a bool "
                         f"mask, or numbers that are all 0 or 1 (True/False per node); convert "
                         f"a score with m > threshold, node indices with np.isin(range(N), idx)")
    return m != 0


def _class_count(given: Any, y: np.ndarray, where: str, where_y: str) -> int:
    if given is None:
        if y.size and int(y.max()) < 0:
            raise ValueError(f"{where_y}: all {y.size} labels are negative (e.g. {int(y.min())})"
                             f"; negative labels are not class ids (quietgnn has no 'unlabelled' "
                             f"value: give such nodes any class id and leave them out of every "
                             f"split mask); expected class ids in [0, num_classes)")
        return int(y.max()) + 1 if y.size else 0
    v = given
    if isinstance(v, (Tensor, np.ndarray, np.generic)) and _numpy(v).size == 1:
        v = _numpy(v).reshape(-1)[0].item()      # a 0-d tensor or numpy scalar
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                              np.floating)) or \
            not np.isfinite(v) or v != round(v):
        raise ValueError(f"{where} = {given!r}; expected a whole number of classes >= 2 (e.g. "
                         f"int(y.max()) + 1)")
    return int(v)


def _check_ids(ei: Tensor, n: int, where: str, by_rows: bool) -> None:
    ids = ei.numpy()     # numpy min/max: exact for uint64 ids past 2**63 too
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ValueError(
            f"{where}: edge_index holds node id {bad}, outside [0, {n}) where {n} is the number "
            f"of feature rows; renumber nodes from 0 or add rows" if by_rows else
            f"{where}: edge list holds node id {bad} but there are {n} labels, so ids must be in "
            f"[0, {n}); renumber nodes from 0 or add the missing labels")


def graph_inputs(edge_index: Any, x: Any, y: Any, masks: tuple[Any, Any, Any], num_classes: Any,
                 where: Mapping[str, str], nodes_from: str = "x") -> GraphInputs:
    """Check and normalise what a graph is built from (the module docstring says what is
    accepted); raise one ``ValueError`` line naming the input as ``where`` names it (keys:
    ``graph`` for the whole source, ``edge_index``, ``x``, ``y``, the masks, ``num_classes``).
    ``nodes_from``: what fixes the number of nodes where ``x`` and ``y`` disagree and no masks
    tell which is wrong: ``"x"`` (its rows: the Python API) or ``"y"`` (the files' labels)."""
    where = {**{k: k for k in ("graph", "edge_index", "x", "y", "num_classes") + MASKS}, **where}
    if edge_index is None:
        raise ValueError(f"{where['edge_index']}: edge_index is missing; expected int "
                         f"[2, num_edges] (source, destination) node ids")
    ei = torch.as_tensor(edge_index).cpu()
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"{where['edge_index']}: edge_index has shape {tuple(ei.shape)}, "
                         f"expected [2, num_edges]")
    if ei.is_floating_point() or ei.is_complex() or ei.dtype == torch.bool:
        # a cast would truncate 0.5 to 0, make a bool mask edges between nodes 0 and 1,
        # and round float32 ids above 2**24: each a silently different graph
        raise ValueError(f"{where['edge_index']}: edge_index has dtype {ei.dtype}; expected "
                         f"integer node ids (convert whole-number ids with edge_index.long())")
    if y is None:
        raise ValueError(f"{where['y']} is missing: node classification needs a class label per "
                         f"node (integer ids, shape [N]); set y")
    y_np, names = class_ids(y, where["y"])
    given = [k for k, m in zip(MASKS, masks) if m is not None]
    if given and len(given) != 3:
        missing = [k for k in MASKS if k not in given]
        raise ValueError(f"{where['graph']}: has {given} but not {missing}; give all three masks "
                         f"or none (none: seeded random 60/20/20)")
    x_np = None if x is None else _features(x, where["x"])
    rows, labels = (None if x_np is None else int(x_np.shape[0])), int(y_np.shape[0])
    n = rows if rows is not None and nodes_from == "x" else labels
    if rows not in (None, labels):
        sizes = {_numpy(m).shape[:1] for m in masks if m is not None}
        # masks that agree with one of x and y tell which one is wrong; else the one that
        # does not fix the number of nodes is (after the edges are checked against that one)
        blame = "y" if sizes == {(rows,)} else "x" if sizes == {(labels,)} else None
        if blame is None:
            _check_ids(ei, n, where["edge_index"], rows is not None and nodes_from == "x")
            blame = "y" if nodes_from == "x" else "x"
        if blame == "y":
            raise ValueError(f"{where['y']}: has {labels} labels, expected {rows}, one per node: "
                             + (f"x has {rows} rows and the masks {rows} entries" if sizes else
                                f"the number of nodes comes from x's {rows} rows"))
        raise ValueError(f"{where['x']}: features have shape {tuple(x_np.shape)}, expected "
                         f"[{labels}, F] (one row per node; y has {labels} labels)")
    mask_np = [_mask(m, where[k], n) for k, m in zip(MASKS, masks)] if given else None
    _check_ids(ei, n, where["edge_index"], rows is not None and nodes_from == "x")
    ei = ei.to(torch.int64)
    kind = "given"
    if x_np is None:
        x_np, kind = degree_features(ei.numpy(), n), "degree-buckets"
    nc = _class_count(num_classes, y_np, where["num_classes"], where["y"])
    return GraphInputs(ei, torch.from_numpy(np.ascontiguousarray(x_np)),
                       torch.from_numpy(np.ascontiguousarray(y_np)),
                       tuple(torch.from_numpy(m) for m in mask_np) if mask_np else None,
                       nc, kind, names)
