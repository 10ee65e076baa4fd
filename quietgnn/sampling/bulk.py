"""What a bulk sampler returns: indices only, in small dataclasses (the loader moves data).

A :class:`Bulk` holds ``k`` minibatches sampled in one call, for ``L`` hops. Level ``h`` of
the frontier (``h = 0``: the targets, ``h = L``: the input nodes) is one concatenated tensor of
*global* node ids, laid out minibatch after minibatch::

    nodes[h]   int64 [R_h]     minibatch i = nodes[h][offsets[h][i]:offsets[h][i+1]]
    offsets[h] int64 [k + 1]
    depth[h]   int64 [R_h]     hop at which the entry entered its minibatch (0: target)

Within one minibatch a level is duplicate-free and starts with the previous level in the same
order (targets first, then the nodes added at hop 0, then hop 1, ...). Hop ``h`` is the
sampled adjacency ``A_S^h = Q^h A (Q^{h+1})^T`` as one CSR over the whole bulk::

    blocks[h].indptr   int64 [R_h + 1]   row r = frontier entry nodes[h][r]
    blocks[h].indices  int64 [E_h]       positions in nodes[h + 1] (bulk-global)
    blocks[h].values   float [E_h] | None  (LADIES: debiased, row-normalised weights)

Because minibatch i's rows only point into minibatch i's slice of the next level, the CSR is
block-diagonal: block i is ``rows offsets[h][i]:offsets[h][i+1]`` x ``cols offsets[h+1][i]:
offsets[h+1][i+1]``, and its first ``n_dst`` columns are its rows (targets first) -- exactly
the :class:`~quietgnn.nn.SparseAdj` contract, so :meth:`Bulk.minibatch` is two slices.

Whole-bulk forward (:meth:`Bulk.whole`). The concatenated layout is block-diagonal but *not*
targets-first across the bulk (minibatch 1's targets sit after minibatch 0's new nodes). Sorting
every level stably by ``depth`` gives ``[all targets | all hop-0 nodes | all hop-1 nodes | ...]``,
which is targets-first at every level *and* keeps level h a prefix of level h+1; the blocks stay
block-diagonal up to that permutation. One GNN call then runs the k minibatches at once (used
for per-bulk inference; training takes one optimizer step per minibatch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..nn import SparseAdj

__all__ = ["SampledBlock", "Bulk", "MiniBatch", "WeightedAdj", "expand_rows"]


@dataclass
class SampledBlock:
    """One hop of a bulk (see the module docstring for the shapes)."""

    indptr: Tensor
    indices: Tensor
    values: Optional[Tensor] = None

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())


@dataclass
class MiniBatch:
    """One minibatch, ready for ``GNN.forward``: ``blocks`` are in model order (outermost hop
    first); ``input_nodes`` are global ids whose first ``len(targets)`` entries are the
    targets."""

    targets: Tensor
    input_nodes: Tensor
    blocks: list[SampledBlock]
    n_src: list[int]
    nodes: list[Tensor]   # frontier levels, model order (outermost first), global ids

    def adjs(self, in_degree: Optional[Tensor] = None,
             fanouts: Optional[list[int]] = None) -> list[SparseAdj]:
        """The blocks as :class:`SparseAdj` (model order). GCN's source degrees: a node's row
        count where it is a destination of the block, else ``min(global in-degree, fanout)``
        (its expected sampled in-degree); pass ``in_degree`` indexed by global id."""
        out = []
        L = len(self.blocks)
        for li, (b, n_src) in enumerate(zip(self.blocks, self.n_src)):
            n_dst = b.indptr.numel() - 1
            src_deg = None
            if in_degree is not None:
                hop = L - 1 - li
                # (a copy: the gather; int64 whatever the global array's type)
                src_deg = in_degree[self.nodes[li]].to(torch.int64)
                if fanouts is not None and int(fanouts[hop]) > 0:
                    src_deg.clamp_(max=int(fanouts[hop]))
                src_deg[:n_dst] = b.indptr[1:] - b.indptr[:-1]
            cls = SparseAdj if b.values is None else WeightedAdj
            adj = cls(b.indptr, b.indices, n_src, src_deg)
            if b.values is not None:
                adj.values = b.values  # type: ignore[attr-defined]
            out.append(adj)
        return out


class WeightedAdj(SparseAdj):
    """A sampled block carrying its own edge weights (LADIES): mean-style layers (SAGE) and GCN
    aggregate with these weights instead of degree-based ones; the self-loop is part of the
    structure (LADIES samples from ``row_normalise(A + I)``), so GCN's separate self weight is
    zero. GIN and GAT read the structure only."""

    values: Tensor

    def mean_norm(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.values.to(dtype)

    def gcn_norm(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        return self.values.to(dtype), torch.zeros(self.n_dst, dtype=dtype, device=self.device)

    def to(self, device: torch.device | str) -> "WeightedAdj":
        device = torch.device(device)
        if device == self.device:
            return self
        sd = None if self.src_degree is None else self.src_degree.to(device)
        out = WeightedAdj(self.indptr.to(device), self.indices.to(device), self.n_src, sd,
                          self.dst_degree.to(device))
        out.values = self.values.to(device)
        return out


@dataclass
class Bulk:
    """k minibatches of one sampler call (see the module docstring)."""

    batch_ids: Tensor
    nodes: list[Tensor]
    offsets: list[Tensor]
    depth: list[Tensor]
    blocks: list[SampledBlock]

    @property
    def k(self) -> int:
        return int(self.batch_ids.numel())

    @property
    def num_hops(self) -> int:
        return len(self.blocks)

    def num_sampled_edges(self) -> int:
        return sum(b.nnz for b in self.blocks)

    def minibatch(self, i: int) -> MiniBatch:
        """Minibatch ``i`` sliced out of the block-diagonal bulk (O(1) slices, no search)."""
        if not 0 <= i < self.k:
            raise ValueError(f"minibatch index {i} outside the bulk of k = {self.k}")
        L = self.num_hops
        nodes = [self.nodes[h][int(self.offsets[h][i]):int(self.offsets[h][i + 1])]
                 for h in range(L + 1)]
        blocks = []
        for h in range(L):
            b = self.blocks[h]
            r0, r1 = int(self.offsets[h][i]), int(self.offsets[h][i + 1])
            e0, e1 = int(b.indptr[r0]), int(b.indptr[r1])
            blocks.append(SampledBlock(b.indptr[r0:r1 + 1] - e0,
                                       b.indices[e0:e1] - self.offsets[h + 1][i],
                                       None if b.values is None else b.values[e0:e1]))
        return MiniBatch(nodes[0], nodes[L], blocks[::-1], [n.numel() for n in nodes[1:]][::-1],
                         nodes[1:][::-1])

    def whole(self) -> MiniBatch:
        """All k minibatches as one targets-first problem (module docstring: a stable sort of
        every level by depth); ``targets`` are the bulk's targets in minibatch order."""
        L = self.num_hops
        perms = [torch.argsort(d, stable=True) for d in self.depth]
        inv = []
        for p in perms:
            q = torch.empty_like(p)
            q[p] = torch.arange(p.numel())
            inv.append(q)
        blocks = []
        for h in range(L):
            b = self.blocks[h]
            indptr, pos = expand_rows(b.indptr, perms[h])
            vals = None if b.values is None else b.values[pos]
            blocks.append(SampledBlock(indptr, inv[h + 1][b.indices[pos]], vals))
        nodes = [self.nodes[h][perms[h]] for h in range(L + 1)]
        return MiniBatch(nodes[0], nodes[L], blocks[::-1], [n.numel() for n in nodes[1:]][::-1],
                         nodes[1:][::-1])


def expand_rows(indptr: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """CSR rows ``rows`` without touching the column array: (new indptr, entry positions)."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    new_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=new_indptr[1:])
    total = int(new_indptr[-1])
    pos = torch.arange(total, dtype=torch.int64) + torch.repeat_interleave(
        starts - new_indptr[:-1], counts, output_size=total)
    return new_indptr, pos
