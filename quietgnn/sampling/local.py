"""Uniform neighbour sampling on one rank's own CSR, with no traffic: what an isolated trainer
(``tma``'s mini-batch mode) samples from. The distributed samplers beside it
(:mod:`.dist`, :mod:`.bulk`) fetch what a rank does not hold."""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn import SparseAdj
from ..partition.local import gather_rows

__all__ = ["LocalSampler"]


class LocalSampler:
    """Uniform neighbour sampling on a CSR (the trainer's induced subgraph), vectorised.

    Per layer, a node with at most ``fanout`` in-neighbours keeps all of them; a node with more
    draws ``fanout`` of them uniformly with replacement and keeps the distinct ones. Blocks are
    :class:`SparseAdj` with the destinations first, outermost (input) layer first, as
    ``GNN.forward`` expects. Randomness comes from the sampler's own generator (checkpointed).
    """

    def __init__(self, indptr: Tensor, indices: Tensor, fanouts: list[int], seed: int) -> None:
        self.indptr, self.indices = indptr, indices
        self.deg = indptr[1:] - indptr[:-1]
        self.fanouts = fanouts
        self.gen = torch.Generator().manual_seed(seed)
        self._g2b = torch.full((indptr.numel() - 1,), -1, dtype=torch.int64)

    def batches(self, seeds: Tensor, batch_size: int) -> list[Tensor]:
        perm = seeds[torch.randperm(seeds.numel(), generator=self.gen)]
        return list(torch.split(perm, batch_size))

    def sample(self, seeds: Tensor) -> tuple[Tensor, list[SparseAdj]]:
        """Returns (input node ids ``[n_src_0]``, blocks per layer); the last block's
        destinations are ``seeds`` in order."""
        blocks = []
        dst = seeds
        for fanout in reversed(self.fanouts):
            rows, cols = self._neighbours(dst, fanout)
            # sources: destinations first, then new nodes (ascending)
            g2b = self._g2b
            g2b[dst] = torch.arange(dst.numel())
            new = torch.unique(cols[g2b[cols] < 0])
            src = torch.cat([dst, new])
            g2b[new] = dst.numel() + torch.arange(new.numel())
            local_cols = g2b[cols]
            g2b[src] = -1
            order = torch.argsort(rows * src.numel() + local_cols)
            rows, local_cols = rows[order], local_cols[order]
            indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
            indptr[1:] = torch.bincount(rows, minlength=dst.numel()).cumsum(0)
            d = self.deg[src].clamp(max=fanout)
            blocks.append(SparseAdj(indptr, local_cols, src.numel(), d, d[: dst.numel()]))
            dst = src
        blocks.reverse()
        return dst, blocks

    def _neighbours(self, dst: Tensor, fanout: int) -> tuple[Tensor, Tensor]:
        """(block row, global source) pairs, distinct per row."""
        deg = self.deg[dst]
        small = deg <= fanout
        rows_s = torch.nonzero(small).flatten()
        ip, cols_s = gather_rows(self.indptr, self.indices, dst[rows_s])
        cols_s = cols_s.long()     # the CSR may be a part's int32 columns; a block's are int64
        rows_s = torch.repeat_interleave(rows_s, ip[1:] - ip[:-1])
        big = torch.nonzero(~small).flatten()
        if big.numel():
            r = torch.rand(big.numel(), fanout, generator=self.gen)
            off = (r * deg[big].unsqueeze(1)).long()
            pos = self.indptr[dst[big]].unsqueeze(1) + off
            cols_b = self.indices[pos].flatten().long()
            rows_b = big.repeat_interleave(fanout)
            n = self.deg.numel()
            key = torch.unique(rows_b * n + cols_b)
            rows_b, cols_b = key // n, key % n
            return torch.cat([rows_s, rows_b]), torch.cat([cols_s, cols_b])
        return rows_s, cols_s
