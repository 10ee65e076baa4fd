"""``grappa``: gradient-only training with periodic repartitioning and coverage-corrected
aggregation.

Paper: Xu, Siebenbrunner, Bindschaedler, "Grappa" (2026, arXiv 2602.01872). The estimator
below is the *derived* sound version (coverage of the whole computation tree), not the public
code's seed-layer correction.

How it trains (rank ``k`` of ``P``):

* Nodes are dealt to ``P`` chunks uniformly at random (the ``random`` partitioner); rank ``k``
  owns chunk ``k`` (its training seeds) and additionally holds the rotating chunk
  ``j_k(s) = k + 1 + (s mod (P-1)) (mod P)`` in super-epoch ``s = epoch // repart_every``.
  The local graph is both chunks with all their in-edges; outside sources are feature-only
  leaves (see :mod:`.data`). Loading chunk ``j_k(s)`` (structure + features + the new
  leaves' features) is the one bulk data movement, once per super-epoch, in the ``data`` phase.
* Each step trains on the local graph alone (full graph, or uniform neighbour sampling on the
  local graph with the same number of steps on every rank) and all-reduces the gradient:
  **no features or activations cross ranks while training.**
* Coverage ``w_v`` of each seed's ``L``-hop computation tree (:func:`.data.coverage`),
  clipped to ``[w_min, 1]``, corrects the aggregation:

  - ``weighting='node'``: ``g = sum_k sum_{v in B_k} w~_v grad l_v / Z``, ``w~ = w^lam``,
    ``Z = sum_k sum_{v in B_k} w~_v``;
  - ``weighting='batch'`` (one scalar per rank, works with any stock loop / DDP):
    ``alpha_k = mean_{v in B_k} w_v``, ``alpha~_k = 1 + lam (alpha_k - 1)``,
    ``g = sum_k |B_k| alpha~_k gbar_k / Z``, ``Z = sum_k |B_k| alpha~_k``: rank ``k`` scales its
    mean loss by ``|B_k| alpha~_k / Z`` (the gradient all-reduce is a *sum*; DDP, which averages,
    would use ``P |B_k| alpha~_k / Z``).

  ``lam = 0`` is plain averaging over all seeds (both variants).

What crosses the network, exactly (``nt`` = parameter count, fp32):

* per step: one ``grad_allreduce`` of ``nt + 1 + P`` floats (:func:`sync_gradients`: gradients,
  loss, non-finite flags): ``2 (P-1)/P * 4 (nt + 1 + P)`` bytes sent per rank; with
  ``grad_bits`` < 32 the gradients go quantized (two all-to-alls, ~``b/32`` of the bytes);
* the normalisers ``Z``: weights are known before training a step, so ``Z`` is precomputed: in
  full-graph mode once per super-epoch (phase ``data``, kind ``grappa_norm``, 1 float), in
  mini-batch mode once per epoch for all ``S`` steps (phase ``train``, kind ``grappa_norm``,
  ``S`` floats = one scalar per step, one latency round per epoch instead of ``S``);
* per super-epoch (phase ``data``): the chunk reload (``chunk_structure``, ``chunk_request``,
  ``chunk_features``);
* evaluation (phase ``eval``): exact full-neighbour inference with the halo exchange over the
  original partition (``halo_fwd``; its input rows are the halo rows the first chunk load
  fetched, so none are fetched for it) + ``eval_metrics``; with ``eval_nodes`` = k > 0 a fixed
  sample of ~k nodes per split through the distributed sampler (its CSR rows and input
  features fetched from their owners, setup: owned ids, the rank's rows and degrees).

What it gives up: edges between a rank's chunks and the rest of the graph beyond one hop are
missing in a super-epoch (deep trees are truncated at the leaves), so the gradient is biased
within a super-epoch; the coverage weighting and the rotation make it consistent over a sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ...comm.lowrank import LowRankReducer
from ...comm.traffic import Traffic
from ...nn import SparseFeatures
from ...nn.sparse import SPARSE_MAX_DENSITY
from ... import heap
from ...sampling.evaluate import SampledEvaluator
from ...sampling.fanouts import parse_fanouts
from ...seeds import stream_seed
from ..base import EpochResult, Strategy, check_gradient_compression, register
from ..common import global_evaluate, halo_forward, partition_adj, sync_gradients
from .data import LocalGraph, coverage, expand
from .loader import ChunkLoader

__all__ = ["Grappa", "GrappaOptions", "DEFAULT_FANOUTS"]

#: the public code's defaults per depth (seed hop first)
DEFAULT_FANOUTS = {1: [25], 2: [25, 10], 3: [15, 10, 5], 4: [20, 15, 10, 5]}


@dataclass
class GrappaOptions:
    """Options of ``grappa`` (``--options.KEY VALUE``)."""

    mode: str = "full"            # full | minibatch
    repart_every: int = 50        # epochs per super-epoch; 0: never rotate the second chunk
    weighting: str = "node"       # node | batch
    lam: float = 1.0              # shrinkage: 0 = plain averaging, 1 = full correction
    w_min: float = 0.1            # coverage weights are clipped to [w_min, 1]
    coverage: str = "mean"        # mean (over tree levels) | path (complete root-leaf paths)
    #: how a row with edges missing (a leaf: all of them) is normalised: 'global' by the node's
    #: whole in-degree, as in evaluation (a leaf's first layer is its own features shrunk by
    #: 1/(d+1)); 'present' by the edges present, as a sampled row (a leaf's first layer is its
    #: own features, a one-sample estimate of its neighbourhood's mean: worse where features
    #: are noisy, see docs/findings.md)
    leaf_norm: str = "global"
    fanouts: Any = None           # minibatch: per hop from the seeds, e.g. [25, 10]; -1 = all
    batch_size: int = 1024        # minibatch: seeds per step (adjusted: equal steps per rank)
    #: bits per gradient value on the wire: 32 = the exact fp32 all-reduce; 8/4/2 = the
    #: unbiased quantized all-reduce (comm/qreduce.py), ~b/32 of the bytes
    grad_bits: int = 32
    #: rank of the low-rank (PowerSGD, error feedback) gradient all-reduce: 0 = off (exact);
    #: r >= 1 sends each large weight matrix's gradient as rank-r factors (comm/lowrank.py)
    grad_rank: int = 0
    #: 0: exact evaluation (full graph through the halo); k > 0: a fixed sample of ~k nodes per
    #: split, mini-batched through the sampler with the training fanouts (graphs whose
    #: full-graph activations do not fit; see quietgnn/sampling/evaluate.py)
    eval_nodes: int = 0
    #: minibatch: 0 = an epoch is one pass over the seeds; s > 0 ends each epoch after s steps
    #: of that pass (a fresh shuffle every epoch; the epoch counts as s / steps-of-a-pass
    #: epoch-equivalents), for graphs where a pass takes hours
    steps_per_epoch: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("full", "minibatch"):
            raise ValueError(f"options.mode = {self.mode!r}; expected 'full' or 'minibatch'")
        if self.weighting not in ("node", "batch"):
            raise ValueError(f"options.weighting = {self.weighting!r}; expected 'node' or "
                             f"'batch'")
        if self.coverage not in ("mean", "path"):
            raise ValueError(f"options.coverage = {self.coverage!r}; expected 'mean' or 'path'")
        if self.leaf_norm not in ("global", "present"):
            raise ValueError(f"options.leaf_norm = {self.leaf_norm!r}; expected 'global' (a "
                             f"row normalised by its node's whole in-degree) or 'present' (by "
                             f"the edges present)")
        if not isinstance(self.repart_every, int) or self.repart_every < 0:
            raise ValueError(f"options.repart_every = {self.repart_every!r}; expected an int >= "
                             f"0 (0 disables repartitioning)")
        if not 0.0 <= float(self.lam) <= 1.0:
            raise ValueError(f"options.lam = {self.lam!r}; expected a value in [0, 1] (0: plain "
                             f"averaging, 1: full coverage correction)")
        if not 0.0 < float(self.w_min) <= 1.0:
            raise ValueError(f"options.w_min = {self.w_min!r}; expected a value in (0, 1]")
        check_gradient_compression(self.grad_bits, self.grad_rank)
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"options.batch_size = {self.batch_size!r}; expected an int >= 1")
        if isinstance(self.eval_nodes, bool) or not isinstance(self.eval_nodes, int) or \
                self.eval_nodes < 0:
            raise ValueError(f"options.eval_nodes = {self.eval_nodes!r}; expected an int >= 0 "
                             f"(0: exact evaluation; k: a fixed sample of about k nodes per "
                             f"split)")
        if isinstance(self.steps_per_epoch, bool) or not isinstance(self.steps_per_epoch, int) \
                or self.steps_per_epoch < 0:
            raise ValueError(f"options.steps_per_epoch = {self.steps_per_epoch!r}; expected an "
                             f"int >= 0 (0: one pass over the seeds per epoch)")
        if self.steps_per_epoch and self.mode != "minibatch":
            raise ValueError(f"options.steps_per_epoch = {self.steps_per_epoch} applies to "
                             f"mode 'minibatch' only (a full-mode epoch is one step); add "
                             f"--options.mode minibatch or leave it out")
        if self.fanouts is not None:   # None: the defaults per depth (DEFAULT_FANOUTS)
            self.fanouts = parse_fanouts(self.fanouts)


@register
class Grappa(Strategy):
    name = "grappa"
    description = ("isolated training on rotating random chunks, gradient-only traffic, "
                   "coverage-corrected aggregation")
    Options = GrappaOptions
    default_partitioner = "random"
    residency_traffic = ("moves chunks of nodes with their features and edges between ranks "
                         "(and evaluates with a halo exchange of raw features, or with "
                         "eval_nodes fetches the sample's feature rows)")

    @classmethod
    def reads_stored_part(cls, options: Any) -> bool:
        # mini-batches with a sampled evaluation read the part only through the chunk loader
        # and the sampled evaluator, which widen what they copy; the exact evaluation and the
        # full mode run halo's full-graph forward on the part as it is
        return options.mode == "minibatch" and bool(options.eval_nodes)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, p, o = self.ctx, self.ctx.part, self.options
        L = ctx.model_cfg.layers
        if o.mode == "minibatch":
            fan = o.fanouts if o.fanouts is not None else DEFAULT_FANOUTS.get(L, [10] * L)
            if len(fan) != L:
                raise ValueError(f"options.fanouts = {fan} has {len(fan)} entries but the model "
                                 f"has {L} layers; give one fanout per layer")
            self.fanouts: list[Optional[int]] = [None if f == -1 else f for f in fan]
        else:
            self.fanouts = [None] * L
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        self.lowrank = (LowRankReducer([q.shape for q in self.params], o.grad_rank,
                                       stream_seed(ctx.seed, "grappa.lowrank"))
                        if o.grad_rank else None)
        self.gen = torch.Generator().manual_seed(stream_seed(ctx.seed, "grappa.sampler",
                                                                  ctx.rank))
        # a run that ends before its second super-epoch never reloads (a resumed one neither:
        # it resumes at an earlier epoch): no halo features kept for a reload
        once = o.repart_every == 0 or ctx.train_cfg.epochs <= o.repart_every
        # the rotating chunk's scratch files go in the run's directory (the disk the run
        # writes to anyway), removed by close()
        # the exact evaluation's input rows are the first load's halo rows: kept through it
        exact = not o.eval_nodes
        self.loader = ChunkLoader(ctx.comm, p, keep_halo=exact or not once,
                                  scratch_dir=ctx.run_dir)
        self.seed_local = torch.nonzero(p.train_mask).flatten()   # own chunk rows come first
        self.y_seed = p.y[self.seed_local]
        # equal step counts without communication: every rank splits its seeds into S batches
        per_rank = math.ceil(p.num_train_global / ctx.world_size)
        self.steps = 1 if o.mode == "full" else max(1, math.ceil(per_rank / o.batch_size))
        if o.eval_nodes:
            # sampled: never the O(N x hidden) activations of a full-graph forward
            self.sampled_eval: Optional[SampledEvaluator] = SampledEvaluator(
                ctx.comm, p, [-1 if f is None else f for f in self.fanouts], o.eval_nodes,
                o.batch_size, ctx.seed)
        else:
            self.sampled_eval = None
        self.lg: Optional[LocalGraph] = None
        self._eval_blocks: Optional[tuple] = None    # (local graph, input rows, blocks)
        self._reload(0)
        if exact:
            # halo's forward on the original partition; its static input rows are the ones the
            # first load fetched for the leaves (the same rows: not fetched twice)
            adj = partition_adj(p, ctx.device)
            self.eval_forward = halo_forward(self.model, p, ctx.comm, adj,
                                             halo_rows=self.loader.halo_rows())
            if once:
                self.loader.drop_halo()

    def super_epoch(self, epoch: int) -> int:
        return epoch // self.options.repart_every if self.options.repart_every > 0 else 0

    def _reload(self, s: int) -> None:
        """Load super-epoch ``s``'s local graph and its coverage weights. Reloads are phase
        ``data``; the first load (in :meth:`setup`) is start-up placement: phase ``setup``."""
        o, comm = self.options, self.ctx.comm
        with comm.phase("data" if self.lg is not None else comm.phase_name):
            # the previous local graph (and what was built on it) dropped first: not two
            # local graphs at once while the next one loads
            if self.lg is not None:
                self.lg.advise(random=False)   # the load and coverage scan the own rows again
            self.lg, self._x, self._eval_blocks = None, None, None
            self._full_blocks = self._full_x = self._full_z = None
            heap.trim()   # what the steps left in the heap, before the load's peak
            self.lg = self.loader.load(s)
            w = coverage(self.lg, self.ctx.model_cfg.layers, o.coverage)
            self.w_seed = w[self.seed_local].clamp(self.options.w_min, 1.0)
            del w
            # the local graph is whole while training (nothing is exchanged), so mostly-zero
            # features stay sparse: full mode keeps its input rows, mini-batches gather theirs
            # (None: dense, read through the local graph's two pieces)
            self._x = self.lg.features(SPARSE_MAX_DENSITY)
            if self._x is not None and self._x.values.dtype == torch.float16:
                # a part read as stored: the few non-zeros widened once
                self._x = SparseFeatures(self._x.indptr, self._x.indices,
                                         self._x.values.float(), self._x.num_cols)
            if o.mode == "full":
                nodes, blocks = expand(self.lg, self.seed_local, self.fanouts,
                                       present=o.leaf_norm == "present")
                self._full_blocks = nodes, self.ctx.put(blocks)
                self._full_x = self._rows(nodes)
                self._full_z = float(self._normalisers([torch.arange(self.seed_local.numel())])[0])
            else:
                # each step reads a few scattered rows of the mapped chunks: no read-around
                self.lg.advise(random=True)
        heap.trim()   # the load's and the coverage's freed temporaries (quietgnn/heap.py)

    def _rows(self, nodes: torch.Tensor):
        """The input rows of ``nodes``, gathered on the host, on the rank's device."""
        if self._x is not None:
            return self.ctx.put(self._x.rows(nodes))
        # float16 when the part was read as stored: the gathered rows widened (exactly)
        x = self.lg.rows(nodes)
        return self.ctx.put(x.to(torch.promote_types(x.dtype, torch.float32)))

    # ------------------------------------------------------------------ weights
    def _step_weights(self, idx: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(per-seed loss weights, this rank's share of Z) for seeds ``seed_local[idx]``."""
        o = self.options
        w = self.w_seed[idx]
        if o.weighting == "node":
            wt = w.pow(float(o.lam))
            return wt, float(wt.sum())
        alpha = float(w.mean()) if idx.numel() else 1.0
        alpha_t = 1.0 + float(o.lam) * (alpha - 1.0)
        return torch.full_like(w, alpha_t), idx.numel() * alpha_t

    def _normalisers(self, batches: list[torch.Tensor]) -> torch.Tensor:
        """``Z`` of every step in one all-reduce of ``len(batches)`` floats (``grappa_norm``)."""
        mass = torch.tensor([self._step_weights(b)[1] for b in batches], dtype=torch.float64)
        self.ctx.comm.all_reduce(mass, "grappa_norm", carries=Traffic.CONTROL)
        return mass

    # ------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> EpochResult:
        s = self.super_epoch(epoch)
        if self.lg is None or s != self.lg.super_epoch:
            self._reload(s)
        self.model.train()
        if self.options.mode == "full":
            batches = [torch.arange(self.seed_local.numel())]
            zs = [self._full_z]
        else:
            perm = torch.randperm(self.seed_local.numel(), generator=self.gen)
            batches = list(torch.tensor_split(perm, self.steps))
            if 0 < self.options.steps_per_epoch < self.steps:   # the same count on every rank
                batches = batches[: self.options.steps_per_epoch]
            zs = self._normalisers(batches).tolist()
        total, wsum = 0.0, 0.0
        for idx, z in zip(batches, zs):
            total += self._step(idx, z)
            wsum += float(self.w_seed[idx].sum())
        n = sum(int(i.numel()) for i in batches)    # the seeds this epoch trained on
        extra = {"super_epoch": s, "chunk": self.lg.chunk, "local_nodes": self.lg.n_loc,
                 "mean_coverage": wsum / n if n else float("nan")}
        return EpochResult(loss=total / len(batches), steps=len(batches),
                           work=len(batches) / self.steps, extra=extra)

    def _step(self, idx: torch.Tensor, z: float) -> float:
        """One optimiser step on seeds ``seed_local[idx]``; ``z`` is the global normaliser."""
        self.opt.zero_grad(set_to_none=True)
        seeds = self.seed_local[idx]
        if seeds.numel():
            if self._full_blocks is not None:
                nodes, blocks = self._full_blocks
            else:
                nodes, blocks = expand(self.lg, seeds, self.fanouts, self.gen,
                                       present=self.options.leaf_norm == "present")
                blocks = self.ctx.put(blocks)
            x = self._full_x if self._full_blocks is not None else self._rows(nodes)
            logits = self.model(x, blocks)
            per_node = F.cross_entropy(logits, self.ctx.put(self.y_seed[idx]), reduction="none")
            wt, _ = self._step_weights(idx)
            loss = (self.ctx.put(wt) * per_node).sum() / z
            loss.backward()
        else:  # an empty batch still joins the all-reduce with zero gradients
            loss = torch.zeros((), device=self.ctx.device)
        global_loss = sync_gradients(self.ctx.comm, self.params, loss,
                                     bits=self.options.grad_bits, lowrank=self.lowrank)
        self.opt.step()
        return global_loss

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        if self.sampled_eval is not None:
            return self.sampled_eval.evaluate(self.model)
        p = self.ctx.part
        return global_evaluate(self.model, p, self.ctx.comm, self.eval_forward)

    def evaluate_local(self) -> Optional[dict[str, float]]:
        """On this super-epoch's local graph: the own chunk's nodes (its first ``n_own`` rows,
        in the partition's order) with every in-edge, their neighbours' trees truncated at the
        leaves as in training; nothing but the counts crosses ranks. None with ``eval_nodes``
        (the sampled evaluation is what was asked for: no full local forward)."""
        if self.sampled_eval is not None:
            return None
        p, lg = self.ctx.part, self.lg
        if self._eval_blocks is None or self._eval_blocks[0] is not lg:
            nodes, blocks = expand(lg, torch.arange(p.n_own), [None] * len(self.fanouts))
            self._eval_blocks = (lg, self._rows(nodes), self.ctx.put(blocks))
        _, x, blocks = self._eval_blocks
        return global_evaluate(self.model, p, self.ctx.comm, lambda: self.model(x, blocks))

    def close(self) -> None:
        self.lg = self._x = self._eval_blocks = self._full_blocks = self._full_x = None
        loader = getattr(self, "loader", None)
        if loader is not None:
            loader.close()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "super_epoch": self.lg.super_epoch if self.lg else 0,
                "chunk": self.lg.chunk if self.lg else None,
                "sampler_rng": self.gen.get_state(), "torch_rng": torch.random.get_rng_state(),
                "lowrank": self.lowrank.state_dict() if self.lowrank else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.gen.set_state(state["sampler_rng"])
        torch.random.set_rng_state(state["torch_rng"])
        if self.lowrank is not None:
            self.lowrank.load_state_dict(state.get("lowrank"))
        # the chunk data is not stored: train_epoch sees that the loaded super-epoch differs
        # from the resumed epoch's and reloads (every rank resumes at the same epoch)
