"""Evaluation on a fixed sample of nodes, mini-batched: for graphs whose full-graph activations
(``O(N x hidden)`` on some rank) do not fit.

Two forms, one rule for the sample (a seeded choice of ``ceil(k / P)`` of each rank's own
nodes per split, the same nodes and the same sampled neighbourhoods at every evaluation, so
successive evaluations compare models, not draws):

* :class:`SampledEvaluator` - collective: every rank evaluates its share through the 1.5D
  sampler (:class:`~quietgnn.sampling.dist.Sampler15D`) and fetches the sample's input rows
  from their owners (counted traffic). Used by ``minibatch`` and ``grappa``'s mini-batch mode.
* :class:`~quietgnn.sampling.book.BookEvaluator` - one process reads the sample's
  neighbourhoods from a prepared directory's memory-mapped parts (no traffic):
  ``tma``'s evaluation server, which must keep evaluating after a trainer died.

Either way the estimate uses the training fanouts; with full fanouts (``-1``) it is the exact
accuracy of the sampled nodes.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ..comm import Communicator
from ..comm.traffic import Traffic
from ..partition.local import LocalPartition
from ..seeds import stream_seed
from .dist import FeatureFetcher, Sampler15D
from .rng import hash_keys

__all__ = ["SampledEvaluator", "global_in_degree", "pick_sample", "pick_from_masks", "SPLITS"]

SPLITS = ("train", "val", "test")


def pick_sample(part: LocalPartition, share: int, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded choice of at most ``share`` of ``part``'s own nodes per split: (local rows,
    split index 0/1/2 per row)."""
    return pick_from_masks((part.train_mask, part.val_mask, part.test_mask), part.rank, share,
                           seed)


def pick_from_masks(masks: Sequence[Any], index: int, share: int, seed: int
                    ) -> tuple[Tensor, Tensor]:
    """The sample rule of part ``index`` from its three split masks (tensors or arrays): a
    generator seeded ``stream_seed(seed, "eval.sample", index)``, ``share`` of each split in
    order."""
    gen = torch.Generator().manual_seed(stream_seed(seed, "eval.sample", index))
    picks, splits = [], []
    for s, mask in enumerate(masks):
        idx = torch.from_numpy(np.nonzero(np.asarray(mask))[0].astype(np.int64))
        idx = idx[torch.randperm(idx.numel(), generator=gen)[:share]]
        picks.append(idx)
        splits.append(torch.full((idx.numel(),), s, dtype=torch.int64))
    return torch.cat(picks), torch.cat(splits)


def global_in_degree(comm: Communicator, part: LocalPartition) -> Tensor:
    """Every node's in-degree, indexed by global id (GCN's source degrees on sampled blocks):
    each rank's owned degrees to every rank once (setup traffic, kind ``degrees``). An O(N)
    array on every rank: int32 while the degrees fit (half of int64's bytes; readers widen
    what they gather)."""
    P, N = comm.world_size, part.num_nodes_global
    deg = comm.all_to_all([torch.stack([part.owned, part.in_degree[: part.n_own]], 1)] * P,
                          "degrees", carries=Traffic.STRUCTURE)
    wide = any(d.numel() and int(d[:, 1].max()) >= 2 ** 31 for d in deg)
    out = torch.zeros(N, dtype=torch.int64 if wide else torch.int32)
    for d in deg:
        out[d[:, 0]] = d[:, 1].to(out.dtype)
    return out


def tally(counts: Tensor, pred: Tensor, y: Tensor, split: Tensor) -> None:
    """Add (correct, seen) per split to ``counts`` ``[6]`` (train/val/test interleaved)."""
    ok = (pred == y).double()
    counts[0::2] += torch.zeros(3, dtype=torch.float64).index_add_(0, split, ok)
    counts[1::2] += torch.bincount(split, minlength=3).double()


def accuracies(counts: Tensor) -> dict[str, float]:
    return {name: float(counts[2 * i] / counts[2 * i + 1]) if counts[2 * i + 1] > 0
            else float("nan") for i, name in enumerate(SPLITS)}


class SampledEvaluator:
    """Collective sampled evaluation (module docstring). Every rank constructs it and calls
    :meth:`evaluate` at the same time.

    ``sampler``/``fetcher``/``in_degree``: a strategy that already has them (``minibatch``)
    passes its own; otherwise they are built here (setup traffic: owned ids and the rank's
    CSR rows, kind ``topology``; degrees). ``c`` > 1 (1.5D replicas): the replicas of a group
    evaluate their group's whole sample together and only replica 0 counts it.
    """

    def __init__(self, comm: Communicator, part: LocalPartition, fanouts: Sequence[int],
                 eval_nodes: int, batch_size: int, seed: int, *,
                 sampler: Optional[Sampler15D] = None, fetcher: Optional[FeatureFetcher] = None,
                 in_degree: Optional[Tensor] = None, c: int = 1) -> None:
        self.comm, self.seed, self.batch_size = comm, int(seed), int(batch_size)
        self.fanouts = [int(f) for f in fanouts]
        P = comm.world_size
        self.c = int(c)
        self.group, self.replica = comm.rank // self.c, comm.rank % self.c
        self.sampler = sampler or Sampler15D(comm, part, self.fanouts, self.c, seed=seed)
        self.fetcher = fetcher or FeatureFetcher(comm, part, self.sampler.owner,
                                                 kind="eval_fetch")
        self.in_degree = in_degree if in_degree is not None else global_in_degree(comm, part)
        local, split = pick_sample(part, -(-int(eval_nodes) // P), self.seed)
        mine = torch.stack([part.owned[local], split, torch.as_tensor(part.y)[local]], 1)
        if self.c > 1:   # the group's sample, in member order, on every replica
            got = comm.all_gather_object(mine, "eval_sample", carries=Traffic.LABELS)
            mine = torch.cat(got[self.group * self.c:(self.group + 1) * self.c])
        self.targets, self.split, self.y = mine[:, 0], mine[:, 1], mine[:, 2]
        sizes = comm.all_gather_object(int(mine.shape[0]), "control", carries=Traffic.CONTROL)
        #: every rank runs as many minibatches (the feature fetch is collective)
        self.steps = -(-max(sizes) // self.batch_size)

    @torch.no_grad()
    def evaluate(self, model: Any) -> dict[str, float]:
        bs = self.batch_size
        was = model.training
        model.eval()
        counts = torch.zeros(6, dtype=torch.float64)
        try:
            for b in range(self.steps):
                t = self.targets[b * bs:(b + 1) * bs]
                # fixed minibatch ids: the same neighbourhoods at every evaluation, other than
                # any training draw's
                ids = hash_keys(self.seed, -1, self.group, torch.tensor([b]))
                mb = self.sampler.sample(t, torch.tensor([0, t.numel()]), ids).minibatch(0)
                x = self.fetcher.fetch(mb.input_nodes)
                if not t.numel() or self.replica != 0:
                    continue
                # sampled and fetched on the host, classified where the model is
                dev = next(model.parameters()).device
                adjs = [a.to(dev) for a in mb.adjs(self.in_degree, self.fanouts)]
                pred = model(x.float().to(dev), adjs).argmax(-1).cpu()
                tally(counts, pred, self.y[b * bs:(b + 1) * bs], self.split[b * bs:(b + 1) * bs])
        finally:
            model.train(was)
        self.comm.all_reduce(counts, "eval_metrics", carries=Traffic.CONTROL)
        return accuracies(counts)
