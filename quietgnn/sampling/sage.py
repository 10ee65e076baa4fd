"""Node-wise (GraphSAGE) bulk sampling as sparse-matrix steps.

Tripathy, Yelick, Buluc, "Distributed Matrix-Based Sampling for Graph Neural Network
Training", MLSys 2024 (arXiv 2311.02909); GraphSAGE: Hamilton, Ying, Leskovec, NeurIPS 2017.

For hop h the selection matrix ``Q^h`` has one 1 per frontier entry, so the probability step
``Q^h A`` is a row gather of the CSR (no matrix is materialised); the sampling step draws
``min(s_h, deg)`` distinct nonzeros of every row; the extraction step
``Q^h A (Q^{h+1})^T`` is the renumbering of :mod:`~quietgnn.sampling.renumber`.
All rows of all minibatches of the bulk are sampled together, vectorised; the Python loops
run over hops, over the ``s`` draws of Floyd's algorithm, and over cache-sized chunks of about
``budget`` sampled entries (a blocking loop whose trip count is ``E / budget`` whatever k is;
see :mod:`~quietgnn.sampling.renumber` for why whole-bulk temporaries are slow on CPU).

Laws (exact, tested with chi-square):

* uniform rows: Floyd's algorithm (Bentley & Floyd, CACM 1987), vectorised over rows: draw
  ``t ~ U{0..j}`` for ``j = d-s .. d-1`` and take ``j`` when ``t`` is taken already; every
  s-subset has probability ``1 / C(d, s)``;
* weighted rows (``edge_weight`` > 0): exponential keys ``-log(U) / w`` (Efraimidis & Spirakis
  2006), keep the s smallest per row: the successive-sampling law
  ``P(ordered v_1..v_s) = prod_m w_{v_m} / (W - w_{v_1} - ... - w_{v_{m-1}})`` -- not the naive
  ``s w / W`` inclusion.

Randomness is counter-based (:mod:`~quietgnn.sampling.rng`): draw m of row
``(minibatch id, hop, node)`` is a hash of those numbers, so a bulk equals k single calls and
the distributed sampler equals this one, bit for bit.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .bulk import Bulk, SampledBlock
from .renumber import BUDGET, Renumberer, chunk_bounds, cumsum0
from .rng import row_keys, uniform

__all__ = ["NeighborSampler", "sample_rows", "check_targets"]


def sample_rows(starts: Tensor, deg: Tensor, fanout: int, keys: Tensor, indices: Tensor,
                weights: Optional[Tensor] = None, budget: int = BUDGET) -> tuple[Tensor, Tensor]:
    """Sample ``min(fanout, deg)`` distinct entries of every row.

    ``starts``/``deg`` [R]: where each row lives in ``indices`` (and ``weights``); ``keys`` [R]:
    the rows' RNG keys. Returns ``(counts [R], sources [sum counts])``, a row's sources
    contiguous: all of a row with ``deg <= fanout`` in CSR order, otherwise in draw order.
    ``fanout < 0`` keeps every entry. Rows are processed in chunks of about ``budget`` sampled
    entries (cache-sized temporaries, see :mod:`~quietgnn.sampling.renumber`); rows are
    independent, so the chunking does not change the result.
    """
    s = int(fanout)
    counts = deg if s < 0 else deg.clamp(max=s)
    ptr = cumsum0(counts)
    out = torch.empty(int(ptr[-1]), dtype=indices.dtype)
    for r0, r1 in chunk_bounds(ptr + torch.arange(ptr.numel()), budget):
        e0, e1 = int(ptr[r0]), int(ptr[r1])
        pos = _positions(starts[r0:r1], deg[r0:r1], counts[r0:r1], ptr[r0:r1 + 1] - e0, s,
                         keys[r0:r1], weights)
        torch.index_select(indices, 0, pos, out=out[e0:e1])
    return counts, out.long()     # a narrow (int32) column array: the sampled few widened


def _positions(starts: Tensor, deg: Tensor, counts: Tensor, ptr: Tensor, s: int, keys: Tensor,
               weights: Optional[Tensor]) -> Tensor:
    """CSR positions of the sampled entries of a chunk of rows (``ptr``: chunk-local)."""
    total = int(ptr[-1])
    # default: the first counts[r] positions of every row (all of a row with deg <= s)
    pos = torch.arange(total) + torch.repeat_interleave(starts - ptr[:-1], counts,
                                                        output_size=total)
    big = torch.nonzero(deg > s).flatten() if s >= 0 else deg.new_empty(0)
    if big.numel():
        b_start, b_deg, b_keys = (t.index_select(0, big) for t in (starts, deg, keys))
        if weights is None:
            chosen = _floyd(b_deg, s, b_keys)
        else:
            chosen = _exp_keys(b_start, b_deg, s, b_keys, weights)
        slots = ptr.index_select(0, big) + torch.arange(s).unsqueeze(1)      # [s, B]
        pos.scatter_(0, slots.flatten(), (chosen + b_start).flatten())
    return pos


def _floyd(d: Tensor, s: int, keys: Tensor) -> Tensor:
    """[s, B] uniform s-subsets of ``{0..d_b-1}`` (all d_b > s), column b = row b's subset.

    Draw m takes ``t ~ U{0..j}``, ``j = d - s + m``, or ``j`` itself when ``t`` is taken
    already (every earlier pick is ``< j``, so ``j`` is free). Laid out draw-major so every
    step reads and writes contiguous rows; the s uniforms of all rows come from one hash call.
    ``floor(u * (j + 1)) <= j`` holds in float64 for every ``u < 1`` (the product is never
    rounded up to ``j + 1``), so no clamp is needed.
    """
    m = torch.arange(s).unsqueeze(1)
    t = (uniform(keys, m) * ((d - s + 1).to(torch.float64) + m)).to(torch.int64)   # [s, B]
    base = d - s
    for i in range(1, s):
        ti = t[i]
        dup = t[0] == ti
        for q in range(1, i):
            dup |= t[q] == ti
        torch.where(dup, base + i, ti, out=ti)
    return t


def _exp_keys(starts: Tensor, d: Tensor, s: int, keys: Tensor, weights: Tensor) -> Tensor:
    """[s, B] positions of the s smallest ``-log(U)/w`` of every row (all d_b > s), in key
    order (the successive-sampling order)."""
    R = d.numel()
    ptr = cumsum0(d)
    total = int(ptr[-1])
    row = torch.repeat_interleave(torch.arange(R), d, output_size=total)
    within = torch.arange(total) - ptr[:-1].index_select(0, row)
    w = weights.index_select(0, starts.index_select(0, row) + within).to(torch.float64)
    e = -torch.log1p(-uniform(keys.index_select(0, row), within)) / w
    order = torch.argsort(e)
    order = order[torch.argsort(row.index_select(0, order), stable=True)]  # by row, then key
    rank = torch.arange(total) - ptr[:-1].index_select(0, row.index_select(0, order))
    top = order[rank < s]                                                  # row-major, s per row
    return within.index_select(0, top).view(R, s).T


def check_targets(targets: Tensor, offsets: Tensor, batch_ids: Tensor, num_nodes: int) -> None:
    """Validate a bulk request (clear errors at the boundary)."""
    if targets.dtype != torch.int64 or offsets.dtype != torch.int64:
        raise ValueError(f"targets/offsets must be int64, got {targets.dtype}/{offsets.dtype}")
    k = offsets.numel() - 1
    if k < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != targets.numel() or \
            bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets must be non-decreasing from 0 to len(targets) = "
                         f"{targets.numel()} with k >= 1 minibatches, got {offsets.tolist()[:8]}")
    if batch_ids.numel() != k:
        raise ValueError(f"need one batch id per minibatch: {batch_ids.numel()} ids for k = {k}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= num_nodes):
        raise ValueError(f"target ids must lie in [0, {num_nodes})")
    mb = torch.repeat_interleave(torch.arange(k), offsets[1:] - offsets[:-1])
    if torch.unique(mb * num_nodes + targets).numel() != targets.numel():
        raise ValueError("a minibatch lists a target twice; targets must be distinct within "
                         "each minibatch")


class NeighborSampler:
    """Bulk GraphSAGE sampler on a whole (destination-indexed) CSR topology.

    ``fanouts[h]``: neighbours per row at hop h (h = 0 next to the targets; -1 = all).
    ``edge_weight`` [E] > 0: weighted rows (successive sampling); None: uniform.
    ``budget``: sampled entries per vectorised chunk (a speed knob only: any value gives the
    same bulks).
    Holds only the topology and the seed: a sampler produces indices, never features.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, fanouts: Sequence[int], seed: int = 0,
                 edge_weight: Optional[Tensor] = None, budget: int = BUDGET) -> None:
        if not len(fanouts) or any(int(f) == 0 or int(f) < -1 for f in fanouts):
            raise ValueError(f"fanouts = {list(fanouts)}; expected one positive int (or -1 = "
                             f"all neighbours) per hop, e.g. [15, 10, 5]")
        if edge_weight is not None:
            if edge_weight.numel() != indices.numel():
                raise ValueError(f"edge_weight has {edge_weight.numel()} entries, the CSR has "
                                 f"{indices.numel()} edges")
            if not bool((edge_weight > 0).all()):
                raise ValueError("edge_weight must be > 0 (drop zero-weight edges from the CSR)")
        self.indptr, self.indices = indptr, indices
        self.fanouts = [int(f) for f in fanouts]
        self.seed, self.edge_weight = int(seed), edge_weight
        self.num_nodes = int(indptr.numel() - 1)
        self.budget = int(budget)      # entries per vectorised chunk (cache-sized temporaries)
        self.renumber = Renumberer(budget=self.budget)   # scratch of the dense renumbering

    def __repr__(self) -> str:
        kind = "uniform" if self.edge_weight is None else "weighted"
        return f"NeighborSampler(fanouts={self.fanouts}, {kind}, seed={self.seed})"

    def sample(self, targets: Tensor, offsets: Tensor, batch_ids: Tensor) -> Bulk:
        """Sample a bulk: minibatch i has targets ``targets[offsets[i]:offsets[i+1]]`` and RNG
        identity ``batch_ids[i]`` (same id, same seed -> same minibatch)."""
        check_targets(targets, offsets, batch_ids, self.num_nodes)
        nodes, offs = targets, offsets
        depth = torch.zeros_like(targets)
        levels, level_offs, depths, blocks = [nodes], [offs], [depth], []
        for h, s in enumerate(self.fanouts):
            mb_row = torch.repeat_interleave(torch.arange(offs.numel() - 1), offs[1:] - offs[:-1],
                                             output_size=nodes.numel())
            starts = self.indptr.index_select(0, nodes)
            deg = self.indptr.index_select(0, nodes + 1) - starts
            keys = row_keys(self.seed, batch_ids, h, mb_row, nodes)
            counts, src = sample_rows(starts, deg, s, keys, self.indices, self.edge_weight,
                                      self.budget)
            indptr = cumsum0(counts)
            nodes, offs, depth, cols = self.renumber.extend(nodes, offs, depth,
                                                          indptr.index_select(0, offs), src,
                                                          self.num_nodes, h)
            blocks.append(SampledBlock(indptr, cols))
            levels.append(nodes)
            level_offs.append(offs)
            depths.append(depth)
        return Bulk(batch_ids, levels, level_offs, depths, blocks)
