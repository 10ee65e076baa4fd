"""``adaqp``: halo training with quantized messages, adaptive bit-widths and overlap.

Wan, Zhao, Wu, "Adaptive Message Quantization and Parallelization for Distributed Full-graph
GNN Training", MLSys 2023 (arXiv 2306.01381). ``halo``'s data flow, with three changes:

1. **Quantized messages.** Every halo row -- features, embeddings (forward) and embedding
   gradients (backward) -- travels as stochastically rounded 2/4/8-bit integers with a bf16
   min/scale per row (:mod:`quietgnn.comm.codecs`; unbiased). Parameter gradients are still
   all-reduced in fp32 and evaluation exchanges fp32 rows (so accuracy is measured exactly).
2. **Adaptive widths** (``bits="adaptive"``). Every ``assign_cycle`` epochs (8 bits before the
   first) each receiver scores its incoming messages: ``sigma = beta^2 * mean over the cycle of
   (D/6)(M - m)^2``, ``beta`` the total aggregation weight of the row at the receiver (forward;
   backward gradients are added with weight 1 at the owner, so ``beta = 1``), sorts them, and
   cuts groups of ``group_size``. Group sums are all-reduced, rank 0 picks a width per group
   trading variance against the round time of a per-channel linear time model
   (:mod:`quietgnn.comm.bitassign`: by default a Pareto sweep that reaches the exact MILP's
   objective; the MILP itself with ``solver="milp"``) and
   broadcasts them; receivers expand groups to rows and tell each sender the width of every
   row it sends (one byte per row and exchange). All of this is ``adaqp_assign`` traffic in
   the ``train`` phase. The time model comes from a start-up profile (``adaqp_profile``, phase
   ``setup``): a few payload sizes over every channel, fitted as ``t = alpha MB + gamma``; or
   from a network tier (``time_model="lan"``).
3. **Overlap** (``overlap=True``). Owned nodes are ordered central | marginal; the central rows
   (no remote in-neighbour) are aggregated while the quantized messages fly, the marginal rows
   after they land; the same in backward (:mod:`.exchange`). Narrowing GCN/SAGE
   layers transform the owned rows once, while the messages fly (:mod:`.split`).
   ``EpochResult.extra`` reports the time the exchanges were in flight (``exch_span_s``), the
   part of it this rank sat waiting (``exch_wait_s``), per exchange the CPU computed while it
   flew (``inflight``), and the rows sent per width (``bits_hist``, ``bits_by_key``).

Dropout masks are ``halo``'s keyed ones (:mod:`quietgnn.nn.keyed`), so from the same seed the
two strategies differ by quantization alone. Layer 0's input rows never change: like
``halo``, ``adaqp`` fetches them once at setup, exact (``cache_inputs``, the default), so only
hidden activations and their gradients travel quantized; ``cache_inputs false`` is the paper's
data flow (every layer's rows quantized every epoch).

``lean`` (GCN): ``halo``'s memory-lean forward (:mod:`quietgnn.nn.lean`) with this exchange
as its halo exchange, for parts whose hidden activations do not fit: the part read as
stored, a narrowing layer's rows quantized after its transform (the output layer's ``C``
columns instead of ``hidden``), the row-wise work recomputed a slice of rows at a time. No
central | marginal split (its two blocks copy the part's edges), so no overlap.

Traffic per epoch: the halo rows at ``ceil(b D / 8) + 4`` bytes instead of ``4 D``
(``adaqp_fwd``/``adaqp_bwd``), the fp32 gradient all-reduce, and once per cycle the assignment
(group sums, widths, one byte per halo row per exchange). With ``bits=32`` the strategy is
``halo`` exactly (same rows, same sums; tested). What is given up: exactness (the messages are
noisy, unbiased), and some CPU time to quantize.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F

from ...comm import fetch_static_rows
from ...nn import SparseAdj
from ...nn.keyed import keyed_dropout, mix_key
from ...nn.lean import lean_forward
from ...partition.local import gather_rows
from ...seeds import stream_seed
from ..base import EpochResult, LeanOption, Strategy, register
from ..common import global_evaluate, inputs_with_halo, masked_loss, partition_adj, sync_gradients
from .assign import Assignment
from .exchange import QuantizedHalo
from .split import SplitConv

__all__ = ["AdaQP", "AdaQPOptions"]


@dataclass
class AdaQPOptions:
    """``bits``: ``adaptive`` or a fixed width 2/4/8 (32 = quantization off = ``halo``);
    ``overlap``: central rows computed while messages fly; ``assign_cycle``: epochs between
    bit assignments; ``group_size``: messages per width decision; ``lam``: weight of variance
    against time; ``solver``: ``fast`` (the Pareto sweep of :mod:`quietgnn.comm.bitassign`,
    in process, reaches the MILP's objective -- tested), ``milp`` (exact, PuLP + CBC: a CBC
    subprocess per exchange and cycle, on rank 0's critical path while the other ranks
    wait), ``auto`` (MILP up to 64 groups per exchange);
    ``time_model``: ``profile`` (measured at start-up) or a network tier name (``lan``, ...)."""

    bits: Union[str, int] = "adaptive"   # adaptive, or a fixed width 2/4/8 (32 = halo)
    overlap: bool = True         # aggregate central rows while the messages fly
    assign_cycle: int = 20       # epochs between bit assignments
    group_size: int = 100        # messages per width decision
    lam: float = 0.5             # weight of variance against time in the assignment
    solver: str = "fast"         # fast (Pareto sweep) | milp (exact, PuLP + CBC) | auto
    time_model: str = "profile"  # profile (measured at start-up) or a network tier (lan, ...)
    profile_reps: int = 3        # repetitions per payload size of the start-up profile
    #: fetch the halo's static input rows once at setup (exact fp32, sparse when smaller)
    #: instead of quantizing and sending them every epoch (false: the paper's data flow)
    cache_inputs: bool = True
    #: GCN, for parts of 10^7+ rows: halo's memory-lean forward (:mod:`quietgnn.nn.lean`) with
    #: the quantized exchange -- the part read as stored, a narrowing layer's rows quantized
    #: after its transform (fewer of them), the hidden activations recomputed a slice of rows
    #: at a time. No central/marginal overlap (its two blocks would copy the part's edges)
    lean: bool = False

    def __post_init__(self) -> None:
        for key in ("cache_inputs", "lean"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"options.{key} = {getattr(self, key)!r}; expected true or "
                                 f"false")
        if self.lean and not self.cache_inputs:
            raise ValueError("options.lean = true needs options.cache_inputs = true (the lean "
                             "forward fetches the input rows once; set cache_inputs true or "
                             "lean false)")
        if str(self.bits).lower() == "adaptive":
            self.bits = "adaptive"
        else:
            try:
                self.bits = int(self.bits)
            except (TypeError, ValueError):
                self.bits = -1
            if self.bits not in (2, 4, 8, 32):
                raise ValueError(f"options.bits = {self.bits!r}; expected 'adaptive', 2, 4, 8 or "
                                 f"32 (32 = no quantization)")
        if isinstance(self.overlap, str):
            self.overlap = self.overlap.lower() in ("1", "true", "yes", "on")
        for name in ("assign_cycle", "group_size", "profile_reps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"options.{name} = {getattr(self, name)!r}; expected an int >= 1")
            setattr(self, name, int(getattr(self, name)))
        self.lam = float(self.lam)
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"options.lam = {self.lam!r}; expected a weight in [0, 1]")
        if self.solver not in ("auto", "milp", "fast"):
            raise ValueError(f"options.solver = {self.solver!r}; expected auto, milp or fast")
        if self.time_model != "profile":
            from ...comm.network import TIERS
            if self.time_model not in TIERS:
                raise ValueError(f"options.time_model = {self.time_model!r}; expected 'profile' "
                                 f"or one of {sorted(TIERS)}")


@register
class AdaQP(Assignment, LeanOption, Strategy):
    name = "adaqp"
    description = "halo exchange with stochastic 2/4/8-bit messages, adaptive widths, overlap"
    Options = AdaQPOptions
    default_partitioner = "metis"
    residency_traffic = ("sends boundary nodes' raw input features, quantized (layer 1's halo "
                         "exchange)")

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, o, comm = self.ctx, self.options, self.ctx.comm
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        self.L = self.model.num_layers
        self._epoch = 0
        self.gen = torch.Generator().manual_seed(stream_seed(ctx.seed, "adaqp.rounding", ctx.rank))
        if o.lean:
            self._setup_lean()
        else:
            self._setup_split()
        self._to_device()
        start = 8 if o.bits == "adaptive" else int(o.bits)
        self.ex.set_uniform(start if start != 32 else 8, self.L)
        self.ex.reset_trace(self.L)
        self.assignments = 0
        self.assign_log: list[dict[str, Any]] = []
        if o.bits == "adaptive" and comm.world_size > 1:
            self._beta_fwd = self._forward_beta()
            self._channel_model()

    def _to_device(self) -> None:
        """What the forward reads, on the rank's device (the set-up's index work ran on the
        host): inputs, labels, masks, blocks, orders, and the ids that key dropout masks."""
        put = self.ctx.put
        self.x, self.y, self.train_mask = put(self.x), put(self.y), put(self.train_mask)
        self.perm, self.inv = put(self.perm), put(self.inv)
        for name in ("adj", "adj_c", "adj_m", "halo_x", "ids_in"):
            if getattr(self, name, None) is not None:
                setattr(self, name, put(getattr(self, name)))
        p = self.ctx.part
        self.x_own = put(p.x)   # layer 0's rows in the partition's order (dropout keys)
        self.owned, self.halo_ids = put(p.owned), put(p.halo)

    def _setup_lean(self) -> None:
        """The partition's own row order and block (no central | marginal split); the input
        rows with their halo, fetched once; exchanges as wide as the lean forward sends them
        (a narrowing layer's output width)."""
        ctx, p = self.ctx, self.ctx.part
        self.check_model(self.options, ctx.model_cfg)
        if self.options.overlap and ctx.rank == 0:
            ctx.log("adaqp: options.lean runs without the central/marginal overlap")
        self.perm = self.inv = None
        self.n_c = 0
        self.adj = partition_adj(p, ctx.device)
        self.x, self.y, self.train_mask = p.x, p.y, p.train_mask
        self.ids_in = None
        self.cached = ctx.world_size > 1
        if self.cached:
            self.x = inputs_with_halo(ctx.comm, p, ctx.device, sparse=False)
            self.ids_in = p.local_ids()
        dims = [c.out_dim if c.out_dim < c.in_dim else c.in_dim for c in self.model.convs]
        self.ex = QuantizedHalo(ctx.comm, list(p.send_idx), [int(c) for c in p.recv_counts],
                                p.n_own, 0, dims, self.gen)

    def _setup_split(self) -> None:
        p, o, comm = self.ctx.part, self.options, self.ctx.comm
        central = p.central_mask()
        self.perm = torch.cat([torch.nonzero(central).flatten(), torch.nonzero(~central).flatten()])
        self.inv = torch.empty_like(self.perm)
        self.inv[self.perm] = torch.arange(p.n_own)
        self.n_c = int(central.sum())
        self.x, self.y = p.x[self.perm], p.y[self.perm]
        self.train_mask = p.train_mask[self.perm]
        self._build_blocks()
        self.ex = QuantizedHalo(comm, [self.inv[t] for t in p.send_idx],
                                [int(c) for c in p.recv_counts], p.n_own, self.n_c,
                                self.model.dims, self.gen)
        # layer 0's input rows never change: fetched once, layer 0 then exchanges nothing
        self.halo_x = fetch_static_rows(comm, p, p.x.float(), kind="data").to(p.x.dtype) \
            if o.cache_inputs and comm.world_size > 1 else None
        self.cached = self.halo_x is not None

    def _build_blocks(self) -> None:
        """Central block over ``[central | marginal]`` and marginal block over
        ``[marginal | central | halo]`` (module docstring of ``adaqp.exchange``)."""
        p, n_own, nc = self.ctx.part, self.ctx.part.n_own, self.n_c
        nm = n_own - nc
        indptr, cols = gather_rows(p.indptr, p.indices, self.perm)
        own = cols < n_own
        cols = torch.where(own, self.inv[cols.clamp(max=n_own - 1)], cols)
        deg = torch.cat([p.in_degree[:n_own][self.perm], p.in_degree[n_own:]])
        cut = int(indptr[nc])
        # cloned: a view would keep every local edge's column alive for the run (the marginal
        # block gets its own remapped copy below)
        self.adj_c = SparseAdj(indptr[:nc + 1].clone(), cols[:cut].clone(), n_own, deg[:n_own],
                               deg[:nc])
        mcols = cols[cut:]
        mcols = torch.where(mcols >= n_own, mcols,
                            torch.where(mcols >= nc, mcols - nc, mcols + nm))
        self.adj_m = SparseAdj(indptr[nc:] - cut, mcols, p.n_local,
                               torch.cat([deg[nc:n_own], deg[:nc], deg[n_own:]]), deg[nc:n_own])

    # ------------------------------------------------------------------ model
    def _forward(self, train: bool) -> torch.Tensor:
        """Logits in central | marginal order (lean: in the partition's own order)."""
        ex, m = self.ex, self.model
        ex.quantize = train and self.options.bits != 32
        ex.trace = train
        if self.options.lean:
            def exchange(h: torch.Tensor, i: int) -> torch.Tensor:
                return torch.cat([h, ex(h, i, None, halo_only=True)[1]])

            key = mix_key(self.ctx.train_cfg.seed, self._epoch) if m.training else None
            return lean_forward(m, self.x, self.adj, exchange if self.cached else None,
                                dropout_key=key, ids=self.owned, ids_in=self.ids_in,
                                inputs_have_halo=self.cached)
        h = self.x
        for i in range(self.L):
            if m.training and m.dropout > 0:
                # the masks halo uses (keyed by seed, epoch, layer, global node, column; in the
                # partition's own row order, then permuted): at 32 bits the two train
                # identically and otherwise they differ by quantization alone
                h_own = self.x_own if i == 0 else h[self.inv]
                key = mix_key(mix_key(self.ctx.train_cfg.seed, self._epoch), i)
                h = keyed_dropout(h_own, m.dropout, key, self.owned)[self.perm]
            halo_in = None
            if i == 0 and self.halo_x is not None:   # cached inputs: the owners' masks
                halo_in = self.halo_x
                if m.training and m.dropout > 0:
                    key = mix_key(mix_key(self.ctx.train_cfg.seed, self._epoch), 0)
                    halo_in = keyed_dropout(halo_in, m.dropout, key, self.halo_ids)
            if SplitConv.supports(m.convs[i]):   # narrowing: transform the owned rows once
                sp = SplitConv(m.convs[i], self.adj_c, self.adj_m)
                if halo_in is not None:
                    out_c, halo = sp.central(h), halo_in
                elif self.options.overlap:
                    out_c, halo = ex(h, i, sp.central, halo_only=True)
                else:
                    _, halo = ex(h, i, None, halo_only=True)
                    out_c = sp.central(h)
                h = torch.cat([out_c, sp.marginal(halo)])
                if i < self.L - 1:    # what GNN.block does after the conv
                    h = F.relu(m.norms[i](h))
                continue
            if halo_in is not None:
                src = torch.cat([h[self.n_c:], h[:self.n_c], halo_in])
                out_c = m.block(i, h, self.adj_c)
            elif self.options.overlap:
                out_c, src = ex(h, i, lambda hh, i=i: m.block(i, hh, self.adj_c))
            else:
                _, src = ex(h, i, None)
                out_c = m.block(i, h, self.adj_c)
            h = torch.cat([out_c, m.block(i, src, self.adj_m)])
        return h

    def forward(self, train: bool = False) -> torch.Tensor:
        """Logits of every owned node in the partition's own order."""
        out = self._forward(train)
        return out if self.inv is None else out[self.inv]

    def train_epoch(self, epoch: int) -> EpochResult:
        self._epoch = epoch
        o, ex = self.options, self.ex
        solve_s = 0.0
        if (o.bits == "adaptive" and self.ctx.world_size > 1 and epoch > 0
                and epoch % o.assign_cycle == 0 and any(ex.traced_n.values())):
            n_log = len(self.assign_log)
            self._assign()
            # rank 0's solver runs while the others wait (CBC in a subprocess: wall seconds)
            solve_s = sum(e["solve_s"] for e in self.assign_log[n_log:])
        ex.reset_stats()
        t0 = time.perf_counter()
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        loss = masked_loss(self._forward(True), self.y, self.train_mask,
                           self.ctx.part.num_train_global)
        loss.backward()
        for key in ex.traced_n:
            ex.traced_n[key] += 1
        global_loss = sync_gradients(self.ctx.comm, self.params, loss)
        self.opt.step()
        st = ex.stats
        extra = {"bits_hist": {str(b): n for b, n in sorted(st["rows"].items())},
                 "bits_by_key": {k: {str(b): n for b, n in sorted(v.items())}
                                 for k, v in st["by_key"].items()},
                 "halo_bytes": st["bytes"], "exch_span_s": st["span_s"],
                 "exch_wait_s": st["wait_s"], "codec_s": st["codec_s"],
                 "inflight": st["inflight"], "solve_s": solve_s,
                 "step_s": time.perf_counter() - t0, "assignments": self.assignments}
        return EpochResult(loss=global_loss, extra=extra)

    def evaluate(self) -> dict[str, float]:
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm,
                               lambda: self.forward(False))

    def evaluate_local(self) -> Optional[dict[str, float]]:
        # lean: the induced subgraph would be a second copy of the part's edges (as halo's)
        return None if self.options.lean else self._induced_evaluate()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        ex = self.ex
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "widths": {k: {s: [t.clone() for t in v] for s, v in d.items()}
                           for k, d in ex.widths.items()},
                "traced": {k: [t.clone() for t in v] for k, v in ex.traced.items()},
                "traced_n": dict(ex.traced_n), "rng": self.gen.get_state(),
                "assignments": self.assignments}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.ex.widths = state["widths"]
        self.ex.traced = state["traced"]
        self.ex.traced_n = dict(state["traced_n"])
        self.gen.set_state(state["rng"])
        self.assignments = int(state["assignments"])
