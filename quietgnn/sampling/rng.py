"""Counter-based random numbers: every draw is a pure function of *who* draws it.

Why not ``torch.Generator``: a stream generator makes the numbers depend on the order in which
rows are visited, so a bulk of k minibatches, k single calls, and a topology split over ranks
would all draw different samples. Here the uniform used for draw ``m`` of frontier row
``(minibatch id, hop, node)`` is ``splitmix64(seed, minibatch id, hop, node, m)``, so:

* a bulk gives *exactly* the batches k single calls give (same minibatch ids);
* the 1.5D distributed sampler, where a replica samples only the rows it was assigned, gives
  exactly the single-rank batches (tested), with no RNG state to ship between ranks;
* the sampler's whole RNG state is ``seed`` plus the loader's minibatch counter.

splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)
is a bijective 64-bit finaliser with good avalanche; it passes BigCrush as a counter hash.
torch has no unsigned 64-bit arithmetic: int64 multiplication wraps modulo 2^64 on every
platform torch supports, and logical right shifts are an arithmetic shift plus a mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mix", "hash_keys", "uniform", "row_keys"]


def _s64(c: int) -> int:
    """The int64 with the bit pattern of the unsigned constant ``c``."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_M1 = _s64(0xBF58476D1CE4E5B9)
_M2 = _s64(0x94D049BB133111EB)


def _srl(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix(x: Tensor) -> Tensor:
    """splitmix64 of an int64 tensor (bit patterns; a bijection on 64-bit words)."""
    z = x + _GOLDEN
    z = (z ^ _srl(z, 30)) * _M1
    z = (z ^ _srl(z, 27)) * _M2
    return z ^ _srl(z, 31)


def hash_keys(*parts: Tensor | int) -> Tensor:
    """Chain ``mix`` over the parts (broadcast): a 64-bit key per element."""
    h: Tensor | None = None
    for p in parts:
        p = p if isinstance(p, Tensor) else torch.tensor(int(p), dtype=torch.int64)
        h = mix(p) if h is None else mix(h ^ p)
    assert h is not None
    return h


def row_keys(seed: int, batch_ids: Tensor, hop: int, mb_row: Tensor, nodes: Tensor) -> Tensor:
    """int64 [R]: one key per frontier row ``(minibatch id, hop, node)``; ``batch_ids`` [k]
    per minibatch, ``mb_row`` [R] the minibatch of each row. Equal to
    ``hash_keys(seed, batch_ids[mb_row], hop, nodes)``; the chain's prefix is hashed once per
    minibatch, not once per row."""
    prefix = hash_keys(int(seed), batch_ids, int(hop))
    return mix(prefix.index_select(0, mb_row) ^ nodes)


def uniform(keys: Tensor, draw: Tensor | int = 0) -> Tensor:
    """float64 in [0, 1) from ``keys`` and a draw counter (53 random bits)."""
    d = torch.as_tensor(draw, dtype=torch.int64)
    h = mix(keys ^ (d * _GOLDEN))   # int64 product wraps mod 2^64, as intended
    return _srl(h, 11).to(torch.float64) * (1.0 / (1 << 53))
