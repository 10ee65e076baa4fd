"""Row ranges within a memory budget: how the set-up paths at scale walk a CSR (or any array
cut into items by a pointer) a slice at a time instead of making whole-array temporaries.
At the bottom of the package: the models, the samplers and the strategies all slice."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["cumsum0", "chunk_bounds"]


def cumsum0(x: Tensor) -> Tensor:
    """int64 [len(x) + 1]: exclusive prefix sum with a leading 0 (CSR pointer of counts)."""
    out = torch.zeros(x.numel() + 1, dtype=torch.int64)
    torch.cumsum(x, 0, out=out[1:])
    return out


def chunk_bounds(ptr: Tensor, budget: int, max_items: Optional[int] = None
                 ) -> list[tuple[int, int]]:
    """Split items ``0..m-1`` (item i owns ``ptr[i]:ptr[i+1]`` of some array) into consecutive
    ranges of about ``budget`` entries (an item larger than the budget gets a range alone),
    at most ``max_items`` items each."""
    m = ptr.numel() - 1
    if m <= 0:
        return [(0, 0)]
    total = int(ptr[-1])
    cuts = [0]
    if total > budget:
        marks = torch.arange(budget, total, budget, dtype=torch.int64)
        cuts += torch.searchsorted(ptr[1:], marks, right=True).add_(1).clamp_(max=m).tolist()
    cuts.append(m)
    step = m if max_items is None else max(1, int(max_items))
    out: list[tuple[int, int]] = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out += [(x, min(b, x + step)) for x in range(a, b, step)]
    return [(a, b) for a, b in out if b > a] or [(0, m)]
