"""Sampled evaluation by one process from a prepared directory's memory-mapped parts.

``tma``'s evaluation server (rank 0) must keep evaluating after a trainer died, so it cannot
use a collective sampler. With ``eval_nodes`` it reads the fixed sample's neighbourhoods
straight from the parts on disk instead of rebuilding the whole graph: every array stays
memory-mapped as stored (int32 edges, fp16 features), and only the rows a minibatch touches are
read, so an evaluation's memory is ``O(batch x fanout^L)``; choosing the sample once reads each
part's masks (``O(n_part)`` bools and the ids of one part's labelled nodes at a time), and
opening the book checks every file's checksum (a pass over the book's bytes, once).

The sample is the one :class:`~quietgnn.sampling.evaluate.SampledEvaluator` would take (the
same seeded choice per part); neighbourhoods are drawn as ``tma``'s trainers draw theirs
(:class:`~quietgnn.sampling.local.LocalSampler`: all in-neighbours up to the fanout,
else ``fanout`` uniform draws with replacement, kept distinct), from a generator re-seeded per
minibatch, so every evaluation sees the same blocks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..nn import SparseAdj
from ..seeds import stream_seed
from .evaluate import accuracies, pick_from_masks, tally

__all__ = ["BookGraph", "BookEvaluator"]

_ARRAYS = ("owned", "indptr", "indices", "halo", "x", "y", "train_mask", "val_mask",
           "test_mask")


class BookGraph:
    """The whole graph by global id, read through the parts' memory maps (nothing loaded
    whole): CSR rows, feature rows, labels. ``book`` is a
    :class:`~quietgnn.partition.PartitionBook` (files checked against its manifest)."""

    def __init__(self, book: Any) -> None:
        self.P = book.num_parts
        self.num_nodes = int(book.graph["num_nodes"])
        self.owner = book.mapped("assignment.npy")
        self.parts = [{k: book.mapped(f"part-{j}/{k}.npy") for k in _ARRAYS}
                      for j in range(self.P)]

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(owning part of each id, per part the positions in ``ids`` it owns)."""
        own = np.asarray(self.owner[ids])
        return own, [np.nonzero(own == j)[0] for j in range(self.P)]

    def rows(self, ids: np.ndarray, fanout: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray]:
        """Sampled in-neighbours of ``ids``: ``(row, global id)`` pairs, rows ascending, distinct
        per row (all neighbours of a row with at most ``fanout``, else ``fanout`` uniform draws
        with replacement; ``fanout`` <= 0: all)."""
        _, where = self._locate(ids)
        rows_l, cols_l = [], []
        for j, pos in enumerate(where):
            if not pos.size:
                continue
            p = self.parts[j]
            r = np.searchsorted(p["owned"], ids[pos])   # owned ids are ascending
            lo = np.asarray(p["indptr"][r], dtype=np.int64)
            deg = np.asarray(p["indptr"][r + 1], dtype=np.int64) - lo
            full = deg <= fanout if fanout > 0 else np.ones(deg.size, dtype=bool)
            # every neighbour of the small rows
            cnt = np.where(full, deg, 0)
            row = np.repeat(pos, cnt)
            starts = np.repeat(lo - np.cumsum(cnt) + cnt, cnt)
            at = starts + np.arange(row.size)
            # fanout draws with replacement in the big rows, kept distinct per row
            big = np.nonzero(~full)[0]
            if big.size:
                off = (rng.random((big.size, fanout)) * deg[big, None]).astype(np.int64)
                row = np.concatenate([row, np.repeat(pos[big], fanout)])
                at = np.concatenate([at, (lo[big, None] + off).ravel()])
            loc = np.asarray(p["indices"][at], dtype=np.int64)
            n_own = p["owned"].shape[0]
            g = np.empty(loc.size, dtype=np.int64)
            inside = loc < n_own
            g[inside] = p["owned"][loc[inside]]
            g[~inside] = p["halo"][loc[~inside] - n_own]
            rows_l.append(row)
            cols_l.append(g)
        if not rows_l:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        key = np.unique(np.concatenate(rows_l) * self.num_nodes + np.concatenate(cols_l))
        return key // self.num_nodes, key % self.num_nodes

    def degree(self, ids: np.ndarray) -> np.ndarray:
        """Global in-degree of every id."""
        _, where = self._locate(ids)
        out = np.zeros(ids.size, dtype=np.int64)
        for j, pos in enumerate(where):
            if pos.size:
                p = self.parts[j]
                r = np.searchsorted(p["owned"], ids[pos])
                out[pos] = np.asarray(p["indptr"][r + 1]) - np.asarray(p["indptr"][r])
        return out

    def node_rows(self, ids: np.ndarray, key: str) -> np.ndarray:
        """``key`` (``x``, ``y`` or a mask) of every id, in order."""
        _, where = self._locate(ids)
        first = self.parts[0][key]
        out = np.empty((ids.size,) + first.shape[1:], dtype=first.dtype)
        for j, pos in enumerate(where):
            if pos.size:
                p = self.parts[j]
                out[pos] = p[key][np.searchsorted(p["owned"], ids[pos])]
        return out


class BookEvaluator:
    """A fixed sample of about ``eval_nodes`` nodes per split (``ceil(k / P)`` per part, the
    seeded choice of :func:`~quietgnn.sampling.evaluate.pick_sample`), evaluated in minibatches
    of ``batch_size`` on neighbourhoods sampled with ``fanouts`` (outermost layer first, as
    ``tma``'s; ``-1`` = all neighbours)."""

    def __init__(self, book: Any, fanouts: Sequence[int], eval_nodes: int, batch_size: int,
                 seed: int) -> None:
        self.g = BookGraph(book)
        self.fanouts = [int(f) for f in fanouts]
        self.batch_size, self.seed = int(batch_size), int(seed)
        share = -(-int(eval_nodes) // self.g.P)
        targets, splits = [], []
        for j, p in enumerate(self.g.parts):
            rows, split = pick_from_masks([p[k] for k in ("train_mask", "val_mask",
                                                          "test_mask")], j, share, self.seed)
            targets.append(np.asarray(p["owned"][rows.numpy()], dtype=np.int64))
            splits.append(split)
        self.targets = np.concatenate(targets)
        self.split = torch.cat(splits)
        self.y = torch.from_numpy(self.g.node_rows(self.targets, "y").astype(np.int64))

    def sample(self, seeds: np.ndarray, batch: int) -> tuple[np.ndarray, list[SparseAdj]]:
        """(input node ids, blocks outermost first) of minibatch ``batch`` (fixed draws)."""
        rng = np.random.default_rng([stream_seed(self.seed, "eval.book"), batch])
        blocks = []
        dst = seeds
        for fanout in reversed(self.fanouts):
            rows, cols = self.g.rows(dst, fanout, rng)
            # sources: the destinations first, then the new nodes ascending
            new = np.setdiff1d(cols, dst)
            src = np.concatenate([dst, new])
            order = np.argsort(src, kind="stable")
            local = order[np.searchsorted(src[order], cols)]
            indptr = torch.zeros(dst.size + 1, dtype=torch.int64)
            indptr[1:] = torch.from_numpy(np.cumsum(np.bincount(rows, minlength=dst.size)))
            d_src = torch.from_numpy(self.g.degree(src))
            if fanout > 0:
                d_src = d_src.clamp(max=fanout)
            blocks.append(SparseAdj(indptr, torch.from_numpy(local.astype(np.int64)), src.size,
                                    d_src, d_src[: dst.size]))
            dst = src
        blocks.reverse()
        return dst, blocks

    @torch.no_grad()
    def evaluate(self, model: Any) -> dict[str, float]:
        was = model.training
        model.eval()
        counts = torch.zeros(6, dtype=torch.float64)
        bs = self.batch_size
        try:
            for b in range(-(-self.targets.size // bs)):
                seeds = self.targets[b * bs:(b + 1) * bs]
                nodes, blocks = self.sample(seeds, b)
                x = torch.from_numpy(self.g.node_rows(nodes, "x")).float()
                pred = model(x, blocks).argmax(-1)
                tally(counts, pred, self.y[b * bs:(b + 1) * bs], self.split[b * bs:(b + 1) * bs])
        finally:
            model.train(was)
        return accuracies(counts)

