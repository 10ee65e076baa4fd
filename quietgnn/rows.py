"""Row ranges within a memory budget: how the set-up paths at scale walk a CSR (or any array
cut into items by a pointer) a slice at a time instead of making whole-array temporaries.
At the bottom of the package: the models, the samplers and the strategies all slice."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["cumsum0", "chunk_bounds", "to_device"]

#: bytes of one host-to-device slice of a large array (each of two pinned staging buffers)
STAGE_BYTES = 64 << 20


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """``t`` on ``device``. To a GPU, an array larger than :data:`STAGE_BYTES` goes a slice of
    rows at a time through two pinned host buffers in turn, each copy non-blocking: a part
    mapped from a prepared directory is read from disk a slice at a time (its pages need not
    all be in host memory at once, as one ``.to`` of the whole array would fault them in) and
    the next slice is read while the last one crosses. Elsewhere, ``t.to(device)``."""
    device = torch.device(device)
    nbytes = t.numel() * t.element_size()
    if device.type != "cuda" or t.device.type != "cpu" or t.dim() == 0 or \
            nbytes <= STAGE_BYTES or t.shape[0] < 2:
        return t.to(device)
    out = torch.empty(t.shape, dtype=t.dtype, device=device)
    rows = max(1, STAGE_BYTES // max(1, nbytes // t.shape[0]))
    bufs = [torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype).pin_memory()
            for _ in range(2)]
    done: list = [None, None]      # the event of the copy that last read each buffer
    for i, a in enumerate(range(0, t.shape[0], rows)):
        b, k = min(t.shape[0], a + rows), i % 2
        if done[k] is not None:
            done[k].synchronize()
        bufs[k][: b - a].copy_(t[a:b])
        out[a:b].copy_(bufs[k][: b - a], non_blocking=True)
        done[k] = torch.cuda.Event()
        done[k].record()
    for e in done:
        if e is not None:
            e.synchronize()
    return out


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
