"""``minibatch``: data-parallel mini-batch training on matrix-based bulk sampling.

Tripathy, Yelick, Buluc, "Distributed Matrix-Based Sampling for Graph Neural Network
Training", MLSys 2024 (arXiv 2311.02909); samplers: GraphSAGE (Hamilton et al. 2017) and
LADIES (Zou et al. 2019). What it sends and gives up: ``docs/guide/strategies.md``.

Per epoch each rank (or each replica group, 1.5D) shuffles its seeds -- the training nodes
it owns -- into minibatches; all ranks take the same number of steps (the schedule is in
:mod:`quietgnn.sampling.loader`). Per bulk of k minibatches: one sampler call, one feature
fetch; per minibatch: forward on the sampled blocks, backward, one gradient all-reduce
(:func:`sync_gradients`, the loss of a step is the global mean over that step's targets),
Adam. Evaluation is global and exact: full neighbourhoods through the halo exchange.

Options (``--options.KEY VALUE``):

* ``fanouts``: one per layer, e.g. ``15,10,5`` (node-wise: neighbours per row, hop 0 next to
  the targets, -1 = all; LADIES: nodes per minibatch and layer, e.g. ``512,512``);
* ``batch_size`` (targets per minibatch, at most), ``bulk`` (k minibatches per sampler call);
* ``sampler``: ``sage`` (uniform rows) or ``ladies``;
* ``topology``: ``replicated`` (every rank gets the whole CSR once at setup, sampling needs no
  communication) or ``1.5d`` (block-rows replicated ``replication`` = c times; rows fetched
  while sampling);
* ``replication``: c for ``1.5d`` (must divide the number of ranks);
* ``cache_mb``: per rank, MiB of remote feature rows kept after one fetch at setup (kind
  ``data``): the rows within ``L`` hops of the rank's seeds (with ``replicated`` topology;
  with ``1.5d`` any remote row) of highest degree; a bulk then fetches only rows neither owned
  nor cached. The hit rate is reported per epoch (``cache_hit_rate``). 0 turns it off;
* ``eval_nodes``: 0 (default) evaluates exactly, on the full graph through the halo; ``k > 0``
  evaluates on a fixed sample of about ``k`` nodes per split (each rank ``ceil(k / P)`` of
  its own), mini-batched through the sampler with the training fanouts, the same sampled
  neighbourhoods at every evaluation: an estimate that never builds full-graph activations
  (for graphs where those do not fit) and sends only the sample's feature rows (with ``1.5d``
  also the sampled CSR rows; the replicas of a group evaluate their group's sample together);
* ``steps_per_epoch``: 0 (default) makes an epoch one pass over the training nodes; ``s > 0``
  ends it after ``s`` steps of that pass (a fresh shuffle every epoch), for graphs where a
  pass takes hours. The epoch then counts as ``s / steps_of_a_pass`` epoch-equivalents, so
  bytes per epoch-equivalent stay comparable.

What crosses the network, per bulk: requested input-node ids and their feature rows (kind
``feature_fetch``; mostly-zero rows as (column, value) pairs, their sizes learnt by a handshake
of 8 bytes a peer, the form agreed once at setup, kind ``feature_form``), with ``1.5d`` also
requested CSR rows (``sample_rows``) and the replica group's partial samples
(``sample_allreduce``); per step: one all-reduce of ``|theta| + 1 + P`` floats (with
``grad_bits`` < 32 the gradients quantized, ~b/32 of those bytes). Setup: owned ids and the
topology (``topology``), degrees and group labels.
What it gives up: sampled neighbourhoods are an estimator of the full aggregation (the usual
mini-batch trade), and replicated topology costs ``O(E)`` memory on every rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..comm.traffic import Traffic
from ..sampling import NeighborSampler
from ..sampling.bulk import expand_rows
from ..sampling.dist import FeatureFetcher, Sampler15D, fetch_topology
from ..sampling.evaluate import SampledEvaluator, global_in_degree
from ..sampling.fanouts import fanouts_for, parse_fanouts
from ..sampling.ladies import LadiesSampler
from ..sampling.loader import (iterate_bulks, plan_epoch, step_totals, steps_per_epoch,
                               truncate_plan)
from .base import EpochResult, Strategy, register
from .common import global_evaluate, halo_forward, partition_adj, sync_gradients


@register
class MiniBatch(Strategy):
    name = "minibatch"
    description = "data-parallel mini-batch training on bulk matrix-based sampling (SAGE/LADIES)"
    default_partitioner = "metis"
    residency_traffic = ("sends sampled nodes' input features and the seeds' labels to the ranks "
                         "that train on them")
    exact = False

    @dataclass
    class Options:
        fanouts: Any = "25,10"         # one per layer, hop 0 first (-1: all; ladies: nodes)
        batch_size: int = 512          # targets per minibatch (at most)
        bulk: int = 4                  # minibatches per sampler call
        sampler: str = "sage"          # sage (uniform rows) | ladies
        topology: str = "replicated"   # replicated (whole CSR per rank) | 1.5d
        replication: int = 1           # 1.5d: copies c of each block-row (divides the ranks)
        cache_mb: float = 256.0        # MiB of remote feature rows cached at setup (0: off)
        eval_nodes: int = 0            # 0: exact evaluation; k: a fixed sample of ~k per split
        steps_per_epoch: int = 0       # 0: an epoch is one pass; s: stop each epoch after s
        #: bits per gradient value in the per-step all-reduce: 32 exact; 8/4/2 stochastically
        #: quantized (comm/qreduce.py, unbiased), ~b/32 of its bytes
        grad_bits: int = 32

        def __post_init__(self) -> None:
            self.fanouts = parse_fanouts(self.fanouts)
            if isinstance(self.cache_mb, bool) or not isinstance(self.cache_mb, (int, float)) \
                    or not self.cache_mb >= 0:
                raise ValueError(f"options.cache_mb = {self.cache_mb!r}; expected MiB >= 0 "
                                 f"(0: no feature cache)")
            for key in ("batch_size", "bulk", "replication"):
                v = getattr(self, key)
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"options.{key} = {v!r}; expected an int >= 1")
            if isinstance(self.eval_nodes, bool) or not isinstance(self.eval_nodes, int) or \
                    self.eval_nodes < 0:
                raise ValueError(f"options.eval_nodes = {self.eval_nodes!r}; expected an int "
                                 f">= 0 (0: exact full-graph evaluation)")
            if isinstance(self.steps_per_epoch, bool) or \
                    not isinstance(self.steps_per_epoch, int) or self.steps_per_epoch < 0:
                raise ValueError(f"options.steps_per_epoch = {self.steps_per_epoch!r}; expected "
                                 f"an int >= 0 (0: one full pass over the training nodes)")
            if self.grad_bits not in (2, 4, 8, 32):
                raise ValueError(f"options.grad_bits = {self.grad_bits!r}; expected 2, 4, 8 (the "
                                 f"gradient all-reduce stochastically quantized) or 32 (exact)")
            if self.sampler not in ("sage", "ladies"):
                raise ValueError(f"options.sampler = {self.sampler!r}; expected 'sage' or 'ladies'")
            if self.topology not in ("replicated", "1.5d"):
                raise ValueError(f"options.topology = {self.topology!r}; expected 'replicated' "
                                 f"or '1.5d'")
            if self.topology == "1.5d" and self.sampler != "sage":
                raise ValueError("options.topology = '1.5d' implements the uniform 'sage' "
                                 "sampler only; use topology 'replicated' for LADIES")
            if self.sampler == "ladies" and min(self.fanouts) < 1:
                raise ValueError(f"LADIES fanouts are nodes per layer; got {self.fanouts}")

    @classmethod
    def check_model(cls, options: Any, model_cfg: Any) -> None:
        fanouts_for(options.fanouts, model_cfg.layers, parse_fanouts(cls.Options.fanouts))

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, o = self.ctx, self.options
        comm, part, P = ctx.comm, ctx.part, ctx.world_size
        self.check_model(o, ctx.model_cfg)
        self.c = o.replication if o.topology == "1.5d" else 1
        if P % self.c:
            raise ValueError(f"options.replication = {self.c} must divide the number of ranks "
                             f"{P}")
        if o.topology == "replicated":
            owner, indptr, indices = fetch_topology(comm, part, list(range(P)))
            cls = NeighborSampler if o.sampler == "sage" else LadiesSampler
            self.sampler = cls(indptr, indices, o.fanouts, seed=ctx.seed)
        else:
            self.sampler = Sampler15D(comm, part, o.fanouts, self.c, seed=ctx.seed)
            owner = self.sampler.owner
        self.group, self.replica = ctx.rank // self.c, ctx.rank % self.c
        # global in-degrees (GCN source degrees on sampled blocks) and the group's seed labels
        self.in_degree = global_in_degree(comm, part)
        mine = torch.stack([part.owned[part.train_mask], part.y[part.train_mask]], 1)
        members = range(self.group * self.c, self.group * self.c + self.c)
        got = comm.all_to_all([mine if r in members else mine[:0] for r in range(P)],
                              "seed_labels", carries=Traffic.LABELS)
        seeds = torch.cat([got[r] for r in members])
        order = torch.argsort(seeds[:, 0])
        self.seeds = seeds[order, 0]
        # the seeds' labels in the seeds' (ascending) order, looked up by searchsorted: no
        # O(N) label array for the group's few training nodes
        self.seed_labels = seeds[order, 1]
        counts = comm.all_gather_object(int(mine.shape[0]), "control", carries=Traffic.CONTROL)
        self.group_sizes = [sum(counts[g * self.c:(g + 1) * self.c]) for g in range(P // self.c)]
        self.fetcher = FeatureFetcher(comm, part, owner)
        if o.cache_mb > 0:
            row = self.fetcher.row_bytes
            # 1.5D: every node is a candidate (no O(N) copies of ids and degrees for it)
            cand = self._reachable() if o.topology == "replicated" else None
            self.fetcher.fill_cache(cand, self.in_degree if cand is None else self.in_degree[cand],
                                    int(o.cache_mb * 2 ** 20) // row)
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        if o.eval_nodes:
            self.sampled_eval = SampledEvaluator(comm, part, o.fanouts, o.eval_nodes,
                                                 o.batch_size, ctx.seed, sampler=self.sampler,
                                                 fetcher=self.fetcher, in_degree=self.in_degree,
                                                 c=self.c)
        else:
            self.eval_forward = halo_forward(self.model, part, comm,
                                             partition_adj(part, ctx.device))
        self.epochs_done = 0

    @classmethod
    def reads_stored_part(cls, options: Any) -> bool:
        # with a sampled evaluation every feature row is read through the fetcher (widened
        # there); the exact one runs halo's full-graph forward on the part as it is
        return bool(options.eval_nodes)

    @classmethod
    def updates_per_pass(cls, options: Any, train_per_part: list[int]) -> int:
        # the loader's schedule: every rank takes the steps of the largest group's pass
        c = options.replication if options.topology == "1.5d" else 1
        groups = [sum(train_per_part[g * c:(g + 1) * c]) for g in range(len(train_per_part) // c)]
        return steps_per_epoch(groups or [0], c, options.batch_size)

    def _reachable(self) -> torch.Tensor:
        """Global ids within ``L`` hops (in-neighbours) of this rank's seeds: every row a
        sample of them can ask for."""
        ip, ix = self.sampler.indptr, self.sampler.indices
        seen = torch.zeros(ip.numel() - 1, dtype=torch.bool)
        seen[self.seeds] = True
        frontier = self.seeds
        for _ in range(len(self.options.fanouts)):   # expand only what is new at each hop
            nb = torch.unique(ix[expand_rows(ip, frontier)[1]])
            frontier = nb[~seen[nb]]
            seen[frontier] = True
        return torch.nonzero(seen).flatten()

    # ------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> EpochResult:
        o, comm = self.options, self.ctx.comm
        self.model.train()
        plan = plan_epoch(self.seeds, self.group, self.group_sizes, self.c, o.batch_size,
                          self.ctx.seed, epoch)
        totals = step_totals(self.group_sizes, self.c, o.batch_size)
        full = plan.steps
        if o.steps_per_epoch and o.steps_per_epoch < full:
            plan = truncate_plan(plan, o.steps_per_epoch, self.c)
        losses, edges, inputs = [], 0, 0
        self.fetcher.hits = self.fetcher.requests = 0
        t0 = time.perf_counter()
        batches = iterate_bulks(plan, self.sampler, o.bulk, self.c, self.replica,
                                self.fetcher.fetch)
        put = self.ctx.put   # sampling and fetching run on the host; the step on the device
        for t, (mb, x) in enumerate(batches):
            self.opt.zero_grad(set_to_none=True)
            if mb.targets.numel():
                out = self.model(put(x), put(mb.adjs(self.in_degree, o.fanouts)))
                y = self.seed_labels[torch.searchsorted(self.seeds, mb.targets)]
                loss = F.cross_entropy(out, put(y), reduction="sum") / float(totals[t])
                loss.backward()
            else:  # an empty minibatch still joins the step's all-reduce
                loss = torch.zeros((), device=self.ctx.device)
            losses.append(sync_gradients(comm, self.params, loss, bits=o.grad_bits))
            self.opt.step()
            edges += sum(b.nnz for b in mb.blocks)
            inputs += mb.input_nodes.numel()
        if len(losses) != plan.steps:
            raise RuntimeError(f"rank {self.ctx.rank}: {len(losses)} steps, expected "
                               f"{plan.steps} (schedule out of step)")
        self.epochs_done = epoch + 1
        return EpochResult(loss=sum(losses) / len(losses), steps=len(losses),
                           work=plan.steps / full,
                           extra={"sampled_edges": edges, "input_nodes": inputs,
                                  "train_loop_s": time.perf_counter() - t0,
                                  "cache_hit_rate": self.fetcher.hits /
                                  max(self.fetcher.requests, 1)})

    def evaluate(self) -> dict[str, float]:
        if not self.options.eval_nodes:
            return global_evaluate(self.model, self.ctx.part, self.ctx.comm, self.eval_forward)
        return self.sampled_eval.evaluate(self.model)

    def evaluate_local(self) -> Optional[dict[str, float]]:
        # a sampled evaluation (eval_nodes > 0) is what was asked for: no local estimate
        return None if self.options.eval_nodes else self._induced_evaluate()

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        # The sampler's randomness is counter-based (seed, epoch, group, minibatch): the seed
        # and the epoch position are its whole state.
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "sampler": {"seed": self.ctx.seed, "epochs_done": self.epochs_done}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        if state["sampler"]["seed"] != self.ctx.seed:
            raise ValueError(f"checkpoint was sampled with seed {state['sampler']['seed']}, this "
                             f"run has train.seed = {self.ctx.seed}; resume with the same seed")
        self.epochs_done = int(state["sampler"]["epochs_done"])
