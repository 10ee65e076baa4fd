"""Dropout masks keyed by (seed, epoch, layer, global node id, column): counter-based, not drawn.

Why. In distributed full-graph training a node's dropout mask must be the one its owner would
draw, wherever the row is used. When a rank keeps its halo's *input* rows (fetched once at
setup, ``halo``'s ``cache_inputs``) it applies dropout to rows it does not own; with masks from
each rank's RNG stream those would differ from the owner's (and from ``centralized``). A mask
that is a pure function of (key, layer, global row id, column) is the same on every rank and in
the single-process reference, so ``halo`` equals ``centralized`` with dropout on, at any P.

The generator is a SplitMix64 finaliser over the 64-bit counter
``key(seed, epoch, layer) ^ (node_id * num_cols + column)`` (Steele, Lea & Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014): a bijective mix whose low 24 bits are
used as a uniform draw. Arithmetic is in torch int64 (products wrap modulo 2^64; right shifts
are arithmetic, which keeps the function deterministic, if not bit-identical to the paper's).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["mix_key", "keep_mask", "row_keep_mask", "keyed_dropout"]

_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)     # the SplitMix64 constants as signed int64
_M2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_BITS = 24
#: entries hashed per slice, on a CPU and on any other device: on a CPU few enough for the
#: int64 scratch to stay in cache (512 KiB); on a GPU enough that a layer's mask is one kernel
#: per hash step, not a launch-bound train of small ones, the scratch still bounded (32 MiB)
#: on a part of any size. The masks do not depend on it.
SLICE_ENTRIES = {"cpu": 1 << 16, "device": 1 << 22}


def _mix(x: Tensor) -> Tensor:
    x = x ^ (x >> 30)
    x = x * _M1
    x = x ^ (x >> 27)
    x = x * _M2
    return x ^ (x >> 31)


def _wrap(x: int) -> int:
    """A Python int as the int64 torch would hold (two's complement wrap-around)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def mix_key(*parts: int) -> int:
    """One signed 64-bit key from small integers (seed, epoch, layer), order-sensitive: the
    same numbers as :func:`_mix` on int64 tensors (arithmetic shifts, wrapping products), in
    Python integers: on tensors, every key of every layer and epoch cost a dozen dispatched
    operations, which is most of an epoch's overhead on a small graph on a GPU."""
    k = 0
    for p in parts:
        x = _wrap(k + _GOLDEN + int(p))
        x = _wrap((x ^ (x >> 30)) * _M1)
        x = _wrap((x ^ (x >> 27)) * _M2)
        k = x ^ (x >> 31)
    return k


def keep_mask(counters: Tensor, p: float, key: int) -> Tensor:
    """bool mask, True with probability ``1 - p`` for every int64 counter, a pure function of
    (counter, key)."""
    return _keep_in_place(counters ^ key, p)


def _keep_in_place(x: Tensor, p: float) -> Tensor:
    """:func:`keep_mask` of the int64 counters already xor-ed with the key, overwriting ``x``:
    the same bits as :func:`_mix`, but each step in place, so a slice of a few 10^4 entries
    stays in cache (fresh temporaries per step made the masks of ``halo``'s
    ``skip_dropped`` cost more compute than the whole-row exchange they replace)."""
    x ^= x >> 30
    x *= _M1
    x ^= x >> 27
    x *= _M2
    x ^= x >> 31
    x &= (1 << _BITS) - 1
    return x >= int(round(p * (1 << _BITS)))


def row_keep_mask(ids: Tensor, width: int, p: float, key: int,
                  cols: Optional[tuple[int, int]] = None) -> Tensor:
    """bool ``[n, width]``: which entries of the rows with global ids ``ids [n]`` dropout keeps
    (the same on every rank that holds such a row); ``cols = (c0, c1)``: only those columns
    of the ``width``-wide rows, ``[n, c1 - c0]``."""
    # a slice of rows at a time (SLICE_ENTRIES): the hash's int64 scratch never grows with
    # the part (gigabytes for a layer's rows of a 10^7-node part)
    c0, c1 = (0, width) if cols is None else cols
    out = torch.empty((ids.numel(), c1 - c0), dtype=torch.bool, device=ids.device)
    cols_t = torch.arange(c0, c1, device=ids.device)
    entries = SLICE_ENTRIES["cpu" if ids.device.type == "cpu" else "device"]
    step = max(1, entries // max(1, c1 - c0))
    for a in range(0, ids.numel(), step):
        counters = ids[a:a + step].to(torch.int64).unsqueeze(1) * width + cols_t
        counters ^= key
        out[a:a + step] = _keep_in_place(counters, p)
    return out


def keyed_dropout(h: Tensor, p: float, key: int, ids: Tensor,
                  cols: Optional[tuple[int, int]] = None, width: Optional[int] = None) -> Tensor:
    """Inverted dropout of the dense rows ``h [n, C]`` whose global ids are ``ids [n]``;
    ``h`` may be the columns ``cols = (c0, c1)`` of rows ``width`` wide (the same entries
    kept as in the whole rows)."""
    if p == 0.0:
        return h
    mask = row_keep_mask(ids, h.shape[1] if width is None else width, p, key, cols)
    return h * (mask.to(h.dtype) * (1.0 / (1.0 - p)))
