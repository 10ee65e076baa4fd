"""The loader: an epoch's minibatch schedule, sampler calls per bulk, features per bulk.

Samplers produce indices; this module moves data. Data-parallel mini-batch training needs
every rank to take the *same number of steps* (each step ends in a gradient all-reduce), so
the schedule is a pure function of numbers every rank knows after setup:

* a *group* is the set of ranks that share seeds and sample together (one rank in the
  topology-replicated mode; the c replicas of a row group in the 1.5D mode);
* group g shuffles its seeds with a key of ``(seed, epoch, g)`` and splits them into
  ``M = c * T`` near-equal minibatches, ``T = max_g ceil(|S_g| / (c * batch_size))`` (so every
  rank takes T steps; a minibatch is at most ``batch_size`` targets);
* a bulk is ``k * c`` consecutive minibatches of the group; replica j trains those with
  ``m % c == j`` (step ``t = m // c``), so replicas split the compute of a bulk they sampled
  together;
* minibatch m's RNG identity is ``hash(seed, epoch, g, m)``: resuming at an epoch boundary
  replays exactly the same batches, with no sampler state to save beyond the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch
from torch import Tensor

from ..nn.sparse import SparseFeatures
from .bulk import Bulk, MiniBatch
from .rng import hash_keys

__all__ = ["BulkSampler", "EpochPlan", "plan_epoch", "step_totals", "truncate_plan",
           "iterate_bulks"]


class BulkSampler(Protocol):
    def sample(self, targets: Tensor, offsets: Tensor, batch_ids: Tensor) -> Bulk: ...


def _split_sizes(n: int, m: int) -> Tensor:
    """Sizes of ``torch.tensor_split`` of n items into m parts."""
    return torch.full((m,), n // m, dtype=torch.int64) + (torch.arange(m) < n % m).long()


def steps_per_epoch(group_sizes: list[int], c: int, batch_size: int) -> int:
    return max(1, max(math.ceil(s / (c * batch_size)) for s in group_sizes))


def step_totals(group_sizes: list[int], c: int, batch_size: int) -> Tensor:
    """float64 [T]: global number of targets in each step (the loss denominator)."""
    T = steps_per_epoch(group_sizes, c, batch_size)
    tot = torch.zeros(T, dtype=torch.float64)
    for s in group_sizes:  # one entry per group: c * T minibatches, step t = m // c
        tot += _split_sizes(s, c * T).view(T, c).sum(1).double()
    return tot


@dataclass
class EpochPlan:
    """One group's minibatches for one epoch: ``targets[offsets[m]:offsets[m+1]]``."""

    targets: Tensor
    offsets: Tensor
    batch_ids: Tensor
    steps: int


def plan_epoch(seeds: Tensor, group: int, group_sizes: list[int], c: int, batch_size: int,
               seed: int, epoch: int) -> EpochPlan:
    T = steps_per_epoch(group_sizes, c, batch_size)
    M = c * T
    gen = torch.Generator().manual_seed(int(hash_keys(seed, epoch, group) & ((1 << 62) - 1)))
    perm = seeds[torch.randperm(seeds.numel(), generator=gen)]
    offsets = torch.zeros(M + 1, dtype=torch.int64)
    torch.cumsum(_split_sizes(seeds.numel(), M), 0, out=offsets[1:])
    ids = hash_keys(seed, epoch, group, torch.arange(M))
    return EpochPlan(perm, offsets, ids, T)


def truncate_plan(plan: EpochPlan, steps: int, c: int) -> EpochPlan:
    """The first ``steps`` steps of ``plan`` (``c`` minibatches a step): an epoch cut short
    on every group alike, so all ranks still take the same number of steps."""
    m = c * steps
    return EpochPlan(plan.targets, plan.offsets[:m + 1], plan.batch_ids[:m], steps)


def iterate_bulks(plan: EpochPlan, sampler: BulkSampler, k: int, c: int, replica: int,
                  fetch: Callable[[Tensor], Tensor | SparseFeatures]
                  ) -> Iterator[tuple[MiniBatch, Tensor | SparseFeatures]]:
    """Yield ``(minibatch, input features)`` for this replica's steps, in step order.

    One sampler call per bulk of ``k * c`` minibatches (every replica of the group makes the
    same call) and one feature fetch per bulk for this replica's ``k`` minibatches.
    """
    M = plan.offsets.numel() - 1
    per = k * c
    for b0 in range(0, M, per):
        b1 = min(M, b0 + per)
        t0, t1 = int(plan.offsets[b0]), int(plan.offsets[b1])
        bulk = sampler.sample(plan.targets[t0:t1], plan.offsets[b0:b1 + 1] - t0,
                              plan.batch_ids[b0:b1])
        mine = [i for i in range(b1 - b0) if (b0 + i) % c == replica]
        L = bulk.num_hops
        lo = bulk.offsets[L]
        ids = torch.cat([bulk.nodes[L][int(lo[i]):int(lo[i + 1])] for i in mine]) if mine \
            else bulk.nodes[L][:0]
        x = fetch(ids)
        off = 0
        for i in mine:
            mb = bulk.minibatch(i)
            n = mb.input_nodes.numel()
            yield mb, x.row_range(off, off + n) if isinstance(x, SparseFeatures) else \
                x[off:off + n]
            off += n
