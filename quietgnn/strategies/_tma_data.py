"""``tma``'s data side: neighbour sampling on a trainer's own subgraph and the whole graph
rebuilt from the partitions for rank 0's evaluation (kept apart from the strategy's loop)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..nn import SparseAdj
from ..partition.local import gather_rows


# ---------------------------------------------------------------------- sampling
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
        rows_s = torch.repeat_interleave(rows_s, ip[1:] - ip[:-1])
        big = torch.nonzero(~small).flatten()
        if big.numel():
            r = torch.rand(big.numel(), fanout, generator=self.gen)
            off = (r * deg[big].unsqueeze(1)).long()
            pos = self.indptr[dst[big]].unsqueeze(1) + off
            cols_b = self.indices[pos].flatten()
            rows_b = big.repeat_interleave(fanout)
            n = self.deg.numel()
            key = torch.unique(rows_b * n + cols_b)
            rows_b, cols_b = key // n, key % n
            return torch.cat([rows_s, rows_b]), torch.cat([cols_s, cols_b])
        return rows_s, cols_s


# ---------------------------------------------------------------------- whole graph on rank 0
def _part_pieces(part: Any) -> dict[str, Tensor]:
    """What rank 0 needs of one partition to rebuild the whole graph (global ids)."""
    return {"owned": part.owned, "indptr": part.indptr,
            "src": part.local_ids()[part.indices], "x": part.x, "y": part.y,
            "train": part.train_mask, "val": part.val_mask, "test": part.test_mask}


def assemble_graph(pieces: list[dict[str, Tensor]], num_nodes: int) -> dict[str, Any]:
    """Whole-graph CSR (rows = destinations, global ids) and node data from every partition's
    :func:`_part_pieces` (every node owned exactly once, rows list *all* in-neighbours)."""
    owned = torch.cat([p["owned"] for p in pieces])
    if owned.numel() != num_nodes or torch.unique(owned).numel() != num_nodes:
        raise ValueError(f"the partitions own {owned.numel()} nodes ({torch.unique(owned).numel()}"
                         f" distinct), the graph has {num_nodes}: cannot rebuild it for "
                         f"evaluation")
    dst = torch.cat([p["owned"].repeat_interleave(p["indptr"][1:] - p["indptr"][:-1])
                     for p in pieces])
    src = torch.cat([p["src"] for p in pieces])
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(dst, minlength=num_nodes).cumsum(0)
    x0 = pieces[0]["x"]
    x = x0.new_empty((num_nodes,) + tuple(x0.shape[1:]))
    y = pieces[0]["y"].new_empty((num_nodes,) + tuple(pieces[0]["y"].shape[1:]))
    masks = {k: torch.zeros(num_nodes, dtype=torch.bool) for k in ("train", "val", "test")}
    for p in pieces:
        x[p["owned"]] = p["x"]
        y[p["owned"]] = p["y"]
        for k in masks:
            masks[k][p["owned"]] = p[k]
    return {"indptr": indptr, "indices": src[order], "x": x, "y": y, **masks}


# ---------------------------------------------------------------------- the strategy
