"""A node source's rows: the contract every source keeps (:class:`NodeBlock`,
:class:`NodeSource`), what the rows must satisfy (ids ``0 .. N-1`` in order, features finite
and inside the stored dtype's range) and how they are written into the parts' ``owned``,
``x``, ``y`` and mask arrays. Shared by the single-process prepare (:mod:`.tables`) and the
distributed one (:mod:`.dist`), so both refuse a row in the same words."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from ..graph import FeaturesDigest
from .arrays import NpyWriter

__all__ = ["NodeSource", "NodeBlock", "TRAIN", "VAL", "TEST", "check_split_counts"]

#: split codes of the node sources
TRAIN, VAL, TEST = 1, 2, 3


@dataclass
class NodeBlock:
    """Rows ``ids`` (ascending, consecutive across blocks, covering ``[0, N)``) of the node
    table: features ``x [n, F]``, labels ``y [n]``, split codes ``split [n]`` (0 none)."""

    ids: np.ndarray
    x: np.ndarray
    y: np.ndarray
    split: np.ndarray


class NodeSource(Protocol):
    num_nodes: int
    num_features: int
    num_classes: int

    def blocks(self, con: Any) -> Iterator[NodeBlock]: ...


#: how to give a node table features (the in-memory loaders' fallback, one-hot log2-degree
#: buckets, needs every node's degree before its row is written: not derived out of core)
NO_FEATURES_FIX = ("add at least one: numeric columns (one per feature), a list column x, or "
                   "x_indices (each node's feature ids); without real features, a column of "
                   "each node's degree (counted over the edge table) gives the structural "
                   "signal the in-memory loaders' degree features give")


def check_split_counts(name: str, train: int, val: int, test: int, none: int = 0,
                       fix: str = "") -> None:
    """Refuse at prepare time the split that training refuses
    (:func:`~quietgnn.graph.check_trainable_split`: its rule and its words), with ``fix``
    (default: the split column's) in place of the in-memory loaders' one."""
    from ..graph import check_trainable_split
    unsplit = f"{none} node(s) are in no split; " if none else ""
    check_trainable_split(train, val, test, name, unsplit + (
        fix or "mark some rows train, some val and some test in the split column, or leave "
        "the column out for a seeded random 60/20/20 split"))


def _write_nodes(con, tmp: Path, part_dirs: list[Path], nodes: NodeSource,
                 owned_n: np.ndarray, P: int, part_of: Callable[[np.ndarray], np.ndarray],
                 x_dtype: str) -> tuple[dict[int, int], str]:
    """Every part's owned ids, x, y and masks, and the whole graph's y and split codes (temporary
    files, for the fingerprint), from one pass over the node source; returns the split counts
    and the features' digest (:class:`~quietgnn.graph.FeaturesDigest`, of the rows as read,
    before any narrowing to ``x_dtype``)."""
    n, F = nodes.num_nodes, nodes.num_features
    for d in part_dirs:
        d.mkdir()
    arr = [{"owned": NpyWriter(d / "owned.npy", np.int64, (int(c),)),
            "x": NpyWriter(d / "x.npy", x_dtype, (int(c), F)),
            "y": NpyWriter(d / "y.npy", np.int64, (int(c),)),
            "split": np.zeros(int(c), dtype=np.uint8)} for d, c in zip(part_dirs, owned_n)]
    gy = NpyWriter(tmp / ".work" / "y.npy", np.int64, (n,))
    gs = NpyWriter(tmp / ".work" / "split.npy", np.uint8, (n,))
    codes = np.zeros(4, dtype=np.int64)
    at = np.zeros(P, dtype=np.int64)
    nxt = 0
    assignment = NpyWriter(tmp / "assignment.npy", np.int64, (n,))
    digest = FeaturesDigest(F)
    blocks = iter(nodes.blocks(con))
    for blk in blocks:
        ids = np.asarray(blk.ids, dtype=np.int64)
        if ids.size == 0:
            continue
        if ids[0] != nxt or (ids.size > 1 and not (np.diff(ids) == 1).all()):
            raise _id_error(nodes, ids, nxt, blocks)
        _check_finite(nodes, ids, blk.x, x_dtype)
        nxt = int(ids[-1]) + 1
        digest.update(blk.x, int(ids[0]))
        gy.write(blk.y)
        gs.write(blk.split)
        codes += np.bincount(blk.split, minlength=4)
        part = part_of(ids)
        assignment.write(part)
        for k in range(P):      # ids ascend, so every part's rows are appended in order
            sel = part == k
            c = int(sel.sum())
            if not c:
                continue
            a = arr[k]
            a["owned"].write(ids[sel])
            a["x"].write(blk.x[sel])
            a["y"].write(blk.y[sel])
            a["split"][int(at[k]):int(at[k]) + c] = blk.split[sel]
            at[k] += c
    if nxt != n:
        raise ValueError(f"the node table has {nxt} rows, expected {n}")
    for d, a in zip(part_dirs, arr):
        for key in ("owned", "x", "y"):
            a[key].close()
        for code, mask in ((TRAIN, "train_mask"), (VAL, "val_mask"), (TEST, "test_mask")):
            np.save(d / f"{mask}.npy", a["split"] == code)
    for w in (gy, gs, assignment):
        w.close()
    return {c: int(codes[c]) for c in (TRAIN, VAL, TEST)}, digest.hexdigest()


def _id_error(nodes: NodeSource, ids: np.ndarray, nxt: int,
              rest: Iterator[NodeBlock]) -> ValueError:
    """For ids that do not go on from ``nxt`` one by one: names the first repeated id and the
    first missing one (reading on, the ids of the later blocks only, until both are found)."""
    repeated = missing = None
    prev = nxt - 1
    for block in itertools.chain([ids], (np.asarray(b.ids, dtype=np.int64) for b in rest)):
        step = np.diff(block, prepend=prev)
        if repeated is None and (step <= 0).any():
            repeated = int(block[np.argmax(step <= 0)])
        if missing is None and (step > 1).any():
            at = int(np.argmax(step > 1))
            missing = int(block[at] - step[at]) + 1        # the id before the gap, plus one
        prev = int(block[-1]) if block.size else prev
        if repeated is not None and missing is not None:
            break
    missing = prev + 1 if missing is None and prev < nodes.num_nodes - 1 else missing
    found = [f"id {repeated} appears more than once (drop the repeated row)"] * \
        (repeated is not None) + [f"id {missing} has no row (add it)"] * (missing is not None)
    return ValueError(f"{_where(nodes)}: {'; '.join(found)}; expected ids 0 .. N-1 "
                      f"(N = {nodes.num_nodes}), one row each")


def _check_finite(nodes: NodeSource, ids: np.ndarray, x: np.ndarray,
                  x_dtype: str = "float32") -> None:
    """NaN/Inf features are refused as the in-memory path refuses them (Graph.validate), and
    so are values past ``x_dtype``'s range (float16 stores 70000 as inf)."""
    bad = ~np.isfinite(x)
    what, fix = "NaN/Inf value(s)", "clean or impute features first"
    if not bad.any():
        big = float(np.finfo(x_dtype).max)
        bad = np.abs(x) > big
        what, fix = (f"value(s) beyond {x_dtype}'s range (|x| <= {big:g})",
                     "prepare with --x-dtype float32, or scale the features")
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        col = f" (column {nodes.x_cols[c]!r})" if getattr(nodes, "x_form", "") == "columns" \
            else ""
        raise ValueError(f"{_where(nodes)}: x has {what}, first at node {int(ids[r])}, "
                         f"feature {c}{col} (value {float(x[r, c])}); {fix}")


def _where(nodes: NodeSource) -> str:
    path = getattr(nodes, "path", None)
    return f"node table {str(path)!r}" if path is not None else "the node source"
