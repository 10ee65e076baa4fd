"""The synthetic generator, streamed: a graph of any size, never whole in memory.

The same model as :mod:`quietgnn.datasets.synthetic` (degree-corrected contextual SBM:
power-law expected degrees, a fraction ``homophily`` of edges inside a class, features = class
mean + Gaussian noise), drawn so that nothing of size O(E) is ever held: per-node quantities
come from counter-keyed generators (``default_rng([seed, stream, block])``), edges are drawn a
chunk at a time and handed to DuckDB, which de-duplicates, symmetrises and sorts them out of
core (:mod:`.tables`). What is held: per node a label (1-2 bytes), a degree weight (8) and its
place in class order (8), while edges are drawn, and the two int32 degree vectors after.

It is not the in-memory generator's random stream (that one draws whole arrays), so the same
spec gives a different (equally distributed) graph; self-loops and repeated pairs are dropped,
so the graph has slightly fewer edges than asked (the number is reported), and the split is
per-node Bernoulli 60/20/20 (no O(N) permutation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..datasets.synthetic import SyntheticSpec, class_means, class_weights
from ..partition.book import PartitionBook
from .nodes import TEST, TRAIN, VAL, NodeBlock
from .tables import write_prepared

__all__ = ["prepare_synthetic", "SyntheticNodes"]

#: node ids per generator block (per-node draws are keyed by (seed, stream, block))
_BLOCK = 1 << 16
#: (source, destination) pairs drawn per chunk: bounds the draw's temporaries (~12 arrays)
_CHUNK = 1 << 21
_Y, _THETA, _EDGES, _X, _SPLIT, _MEANS = 1, 2, 3, 4, 5, 6


def _rng(seed: int, stream: int, block: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, block])


def _labels(spec: SyntheticSpec) -> np.ndarray:
    n, dt = spec.nodes, np.int8 if spec.classes <= 127 else np.int16
    y = np.empty(n, dtype=dt)
    for b, lo in enumerate(range(0, n, _BLOCK)):
        hi = min(lo + _BLOCK, n)
        rng = _rng(spec.seed, _Y, b)
        y[lo:hi] = (rng.choice(spec.classes, hi - lo, p=class_weights(spec))
                    if spec.class_imbalance else rng.integers(0, spec.classes, hi - lo))
    y[: 2 * spec.classes] = np.arange(2 * spec.classes) % spec.classes   # every class present
    return y


def _theta(spec: SyntheticSpec) -> np.ndarray:
    """Pareto(gamma) weights with the structural cut-off sqrt(N d) (as the in-memory
    generator), mean 1."""
    n = spec.nodes
    if spec.degree_skew == 0:
        return np.ones(n)
    g = spec.degree_skew
    cap = math.sqrt(n * spec.avg_degree) / spec.avg_degree * (g - 1) / (g - 2)
    theta = np.empty(n)
    for b, lo in enumerate(range(0, n, _BLOCK)):
        hi = min(lo + _BLOCK, n)
        u = _rng(spec.seed, _THETA, b).random(hi - lo)
        theta[lo:hi] = np.minimum((1.0 - u) ** (-1.0 / (g - 1.0)), max(cap, 1.0))
    theta /= theta.mean()
    return theta


def _insert_edges(con: Any, spec: SyntheticSpec, target: int,
                  progress: Callable[[str], None]) -> None:
    """Draw ``target`` (source, destination) pairs chunk by chunk into DuckDB table ``raw``."""
    import pyarrow as pa
    y = _labels(spec)
    # position -> node (int32 while ids fit: 4 bytes a node less), and the cumulative weights
    # in that order, built in place (peak: y, theta, the int64 argsort, then 22 bytes a node)
    order = np.argsort(y, kind="stable")
    if spec.nodes < 2 ** 31:
        order = order.astype(np.int32)
    cum = _theta(spec)[order]
    np.cumsum(cum, out=cum)
    total = float(cum[-1])
    ends = np.cumsum(np.bincount(y, minlength=spec.classes))    # every class present: >= 1
    # class c's weight range [lo_w, lo_w + class_w): read off cum, not off a copy of it with a
    # leading 0 (8 bytes a node held through the drawing for 2 x classes numbers)
    starts = np.concatenate([[0], ends[:-1]])
    lo_w = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)
    class_w = cum[ends - 1] - lo_w
    con.execute("CREATE TABLE raw (src BIGINT, dst BIGINT)")

    def pick(u: np.ndarray, presorted: bool = False) -> np.ndarray:
        """Node whose cumulative-weight range holds u. Sorted queries walk ``cum`` in order
        and stay in cache, which beats random ones at 2e7 nodes even with the sort."""
        if presorted:
            pos = np.searchsorted(cum, u, side="right")
        else:
            perm = np.argsort(u)
            pos = np.empty(u.size, dtype=np.int64)
            pos[perm] = np.searchsorted(cum, u[perm], side="right")
        return order[np.minimum(pos, cum.size - 1)]

    chunks = (target + _CHUNK - 1) // _CHUNK
    for c in range(chunks):
        m = min(_CHUNK, target - c * _CHUNK)
        rng = _rng(spec.seed, _EDGES, c)
        # sources: m sorted uniforms directly (normalised cumsum of exponential spacings is the
        # order statistic of iid uniforms); each destination depends on its source only
        spacings = np.cumsum(rng.standard_exponential(m + 1))
        src = pick(spacings[:m] * (total / spacings[-1]), presorted=True)
        del spacings
        cls = y[src]
        r = rng.random(m)
        u_same = lo_w[cls] + r * class_w[cls]
        u_other = r * (total - class_w[cls])
        u_other = np.where(u_other >= lo_w[cls], u_other + class_w[cls], u_other)
        dst = pick(np.where(rng.random(m) < spec.homophily, u_same, u_other))
        keep = src != dst
        chunk = pa.table({"src": src[keep], "dst": dst[keep]})
        con.register("chunk", chunk)
        con.execute("INSERT INTO raw SELECT src, dst FROM chunk")
        con.unregister("chunk")
        if c % 16 == 0 or c == chunks - 1:
            progress(f"edges: drew {min((c + 1) * _CHUNK, target):,} of {target:,} pairs")


class SyntheticNodes:
    """Features, labels and split of the streamed synthetic graph, block by block."""

    def __init__(self, spec: SyntheticSpec, split_seed: int = 0) -> None:
        self.spec, self.split_seed = spec, split_seed
        self.num_nodes, self.num_features = spec.nodes, spec.feature_dim
        self.num_classes = spec.classes

    def blocks(self, con: Any) -> Iterator[NodeBlock]:
        s = self.spec
        y_all = _labels(s)
        raw = _rng(s.seed, _MEANS, 0).standard_normal((s.classes, s.feature_dim))
        means = class_means(torch.from_numpy(raw), s).numpy().astype(np.float32)
        for b, lo in enumerate(range(0, s.nodes, _BLOCK)):
            hi = min(lo + _BLOCK, s.nodes)
            y = y_all[lo:hi].astype(np.int64)
            x = _rng(s.seed, _X, b).standard_normal((hi - lo, s.feature_dim), dtype=np.float32)
            x *= np.float32(s.feature_noise)
            x += means[y]
            u = _rng(self.split_seed, _SPLIT, b).random(hi - lo)
            split = np.where(u < 0.6, TRAIN, np.where(u < 0.8, VAL, TEST)).astype(np.uint8)
            yield NodeBlock(ids=np.arange(lo, hi), x=x, y=y, split=split)


def prepare_synthetic(out: str | Path, *, edges: int, parts: int, spec: SyntheticSpec | None
                      = None, method: str = "ldg", seed: int = 0, memory_budget: int = 4 << 30,
                      x_dtype: str = "float32", split_seed: int = 0,
                      progress: Callable[[str], None] = lambda s: None,
                      overwrite: bool = True) -> PartitionBook:
    """A synthetic graph of about ``edges`` undirected edges (``nodes = 2 edges /
    avg_degree``; the other knobs from ``spec``) prepared into ``out`` in ``parts`` parts."""
    spec = spec or SyntheticSpec()
    nodes = max(2 * spec.classes, int(round(2 * edges / spec.avg_degree)))
    spec = replace(spec, nodes=nodes)
    # while edges are drawn: label (<= 2 B), weights (8 B) and their argsort (8 B) at the peak,
    # then cumulative weights (8 B) and the int32 order; one chunk's ~12 temporaries of 8 B
    gen_bytes = 26 * nodes + 12 * 8 * min(_CHUNK, edges)
    return write_prepared(
        out, "SELECT src, dst FROM raw", SyntheticNodes(spec, split_seed), num_parts=parts,
        method=method, seed=seed, undirected=True, memory_budget=memory_budget, x_dtype=x_dtype,
        name="synthetic-stream", progress=progress, hook_held=gen_bytes, drop=("raw",),
        identity={"synthetic": {**asdict(spec), "edges": edges, "stream": True},
                  "split_seed": split_seed},
        con_hook=lambda con: _insert_edges(con, spec, edges, progress), overwrite=overwrite)
