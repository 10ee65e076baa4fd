"""Layer-wise (LADIES) bulk sampling as sparse-matrix steps.

Zou, Hu, Wang, Jiang, Sun, Gu, "Layer-Dependent Importance Sampling for Training Deep and
Large Graph Convolutional Networks", NeurIPS 2019; bulk/matrix form after Tripathy, Yelick,
Buluc, MLSys 2024.

``A_hat = row_normalise(A + I)`` (the reference LADIES matrix; any CSR with positive values can
be passed instead) and ``A_hat^2`` its elementwise square, both built once. For hop h, the
selection matrix ``Q_L`` has one row per minibatch marking its current frontier ``F_i``:

1. probabilities ``P = Q_L A_hat^2``: ``P[i, v] = ||A_hat[F_i, v]||^2``, rows normalised
   (a row gather of the frontier rows plus a sum by key ``i * n + v``; no dense matrix);
2. sampling: ``s_h`` distinct columns per minibatch by exponential keys ``-log(U) / P[i, v]``
   (successive sampling, as ``numpy.random.choice(p=..., replace=False)`` in the reference);
3. extraction: rows ``A_hat[F_i]`` restricted to columns ``S_i u F_i`` (next level = ``F_i``
   then ``S_i \\ F_i``, targets first), column v divided by ``P[i, v]``, rows normalised.

Vectorised over all minibatches of the bulk; the Python loop runs over hops only. What it
gives up: the sampled blocks carry weights (:class:`~quietgnn.sampling.bulk.WeightedAdj`), so
layers that ignore edge weights (GIN, GAT) see only the sampled structure.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .bulk import Bulk, SampledBlock, expand_rows
from .renumber import Renumberer, cumsum0
from .rng import hash_keys, uniform
from .sage import check_targets

__all__ = ["LadiesSampler", "ladies_matrix"]


def ladies_matrix(indptr: Tensor, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``row_normalise(A + I)`` as canonical CSR ``(indptr, indices, values float64)``."""
    n = indptr.numel() - 1
    deg = indptr[1:] - indptr[:-1]
    row = torch.repeat_interleave(torch.arange(n), deg)
    key = torch.cat([row * n + indices, torch.arange(n) * (n + 1)]).unique()  # adds (v, v)
    new_indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(key // n, minlength=n), 0, out=new_indptr[1:])
    cnt = (new_indptr[1:] - new_indptr[:-1]).to(torch.float64)
    return new_indptr, key % n, (1.0 / cnt)[key // n]


class LadiesSampler:
    """Bulk LADIES sampler. ``fanouts[h]``: nodes sampled per minibatch at hop h."""

    def __init__(self, indptr: Tensor, indices: Tensor, fanouts: Sequence[int], seed: int = 0,
                 values: Optional[Tensor] = None) -> None:
        if not len(fanouts) or any(int(f) < 1 for f in fanouts):
            raise ValueError(f"fanouts = {list(fanouts)}; LADIES needs a positive number of "
                             f"sampled nodes per minibatch and hop, e.g. [512, 512]")
        if values is None:
            indptr, indices, values = ladies_matrix(indptr, indices)
        elif values.numel() != indices.numel() or not bool((values > 0).all()):
            raise ValueError("values must give one positive weight per CSR entry")
        self.indptr, self.indices = indptr, indices
        self.values = values.to(torch.float64)
        self.sq = self.values * self.values          # A_hat^2, built once
        self.fanouts = [int(f) for f in fanouts]
        self.seed = int(seed)
        self.num_nodes = int(indptr.numel() - 1)
        self.renumber = Renumberer()   # scratch for the dense renumbering (indices only)

    def __repr__(self) -> str:
        return f"LadiesSampler(fanouts={self.fanouts}, seed={self.seed})"

    def probabilities(self, nodes: Tensor, offsets: Tensor
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Step 1 for one level: ``(mb_u, v_u, p_u, inv, pos)`` -- the nonzeros of the
        row-normalised ``P = Q_L A_hat^2`` (minibatch, column, probability; sorted by
        ``(mb, v)``), plus for every gathered entry its index in that list and its CSR position.
        """
        n = self.num_nodes
        k = offsets.numel() - 1
        mb_row = torch.repeat_interleave(torch.arange(k), offsets[1:] - offsets[:-1],
                                         output_size=nodes.numel())
        rptr, pos = expand_rows(self.indptr, nodes)
        e_mb = torch.repeat_interleave(mb_row, rptr[1:] - rptr[:-1], output_size=pos.numel())
        uniq, inv = torch.unique(e_mb * n + self.indices[pos], return_inverse=True)
        p = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, self.sq[pos])
        mb_u = uniq // n
        tot = torch.zeros(k, dtype=torch.float64).index_add_(0, mb_u, p)
        return mb_u, uniq % n, p / tot[mb_u], inv, pos

    def sample(self, targets: Tensor, offsets: Tensor, batch_ids: Tensor) -> Bulk:
        """Sample a bulk (same contract as :meth:`NeighborSampler.sample`)."""
        check_targets(targets, offsets, batch_ids, self.num_nodes)
        n = self.num_nodes
        nodes, offs, depth = targets, offsets, torch.zeros_like(targets)
        levels, level_offs, depths, blocks = [nodes], [offs], [depth], []
        for h, s in enumerate(self.fanouts):
            k = offs.numel() - 1
            mb_u, v_u, p_u, inv, pos = self.probabilities(nodes, offs)
            # step 2: s smallest exponential keys per minibatch (candidates grouped by mb)
            u = uniform(hash_keys(self.seed, batch_ids[mb_u], h, v_u))
            e = -torch.log1p(-u) / p_u
            order = torch.argsort(e)
            order = order[torch.argsort(mb_u[order], stable=True)]
            first = torch.zeros(k + 1, dtype=torch.int64)
            torch.cumsum(torch.bincount(mb_u, minlength=k), 0, out=first[1:])
            rank = torch.arange(order.numel()) - first[:-1][mb_u[order]]
            chosen = order[rank < s]
            new_ptr = cumsum0(torch.bincount(mb_u[chosen], minlength=k))
            new_nodes, new_offs, new_depth, _ = self.renumber.extend(
                nodes, offs, depth, new_ptr, v_u[chosen], n, h)
            # step 3: keep entries whose column is in S_i u F_i, debias, row-normalise
            mb_row = torch.repeat_interleave(torch.arange(k), new_offs[1:] - new_offs[:-1],
                                             output_size=new_nodes.numel())
            lkeys, lorder = torch.sort(mb_row * n + new_nodes)
            ekeys = mb_u[inv] * n + v_u[inv]
            at = torch.searchsorted(lkeys, ekeys).clamp_(max=max(lkeys.numel() - 1, 0))
            keep = lkeys[at] == ekeys
            val = self.values[pos][keep] / p_u[inv][keep]
            rlen = self.indptr[nodes + 1] - self.indptr[nodes]
            rows = torch.repeat_interleave(torch.arange(nodes.numel()), rlen,
                                           output_size=pos.numel())[keep]
            rsum = torch.zeros(nodes.numel(), dtype=torch.float64).index_add_(0, rows, val)
            indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
            torch.cumsum(torch.bincount(rows, minlength=nodes.numel()), 0, out=indptr[1:])
            blocks.append(SampledBlock(indptr, lorder[at[keep]],
                                       (val / rsum[rows]).to(torch.float32)))
            nodes, offs, depth = new_nodes, new_offs, new_depth
            levels.append(nodes)
            level_offs.append(offs)
            depths.append(depth)
        return Bulk(batch_ids, levels, level_offs, depths, blocks)
