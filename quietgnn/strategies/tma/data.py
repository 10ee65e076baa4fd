"""``tma``'s data side: the whole graph rebuilt from the partitions for rank 0's evaluation
(kept apart from the strategy's loop; its neighbour sampler is
:class:`quietgnn.sampling.local.LocalSampler`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


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
