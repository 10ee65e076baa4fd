"""``llcg``: Learn Locally, Correct Globally -- local trainers, periodic averaging and a
correction step on the whole graph.

Paper: Ramezani, Cong, Mahdavi, Kandemir, Sivasubramaniam, "Learn Locally, Correct Globally:
A Distributed Algorithm for Training Graph Neural Networks" (ICLR 2022). A seed baseline:
RandomTMA and SuperTMA measure themselves against it.

Each rank trains its own copy of the model, with its own optimizer, on the subgraph induced by
the nodes it owns (edges to other parts dropped, as ``tma``'s trainers do): one full-graph step
per epoch. Every ``period`` epochs the local models are averaged and the *server* model takes
the average and makes ``correction_steps`` steps on the whole graph with its own optimizer;
every local model then restarts from the corrected one (local optimizer states stay local).
The averaging is what plain periodic averaging (PSGD-PA) does; the correction puts back what
the dropped edges took from the gradient. The paper's server holds the graph; here no rank
does, so a correction step is ``halo``'s distributed full-graph step (its gradient is the
server's on the whole graph): the halo's input rows fetched once at set-up, hidden rows and
their gradients exchanged in the step, and the gradient all-reduced.

``train.epochs`` counts passes over the training set, as for every strategy: a local epoch is
one (each rank passes over its own training nodes) and a correction step another.
Evaluation is exact, of the average of the local models (one parameter all-reduce in the
``eval`` phase when the last step was not a correction).

Traffic per ``period`` epochs: one all-reduce of the parameters (``2 (P-1)/P * 4 |theta|``
bytes a rank) and ``correction_steps`` of ``halo``'s epochs; none in the other epochs. Gives
up: the exact gradient between corrections (the local ones miss the cut edges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..comm.traffic import Traffic
from ..nn.keyed import mix_key
from .base import EpochResult, register
from .common import NonFiniteError, induced_forward
from .fullgraph import HaloFamily


@dataclass
class LLCGOptions:
    """``options.*`` of ``llcg``."""

    #: local epochs between two averages (the public code's default)
    period: int = 15
    #: server steps on the whole graph after each average (0: plain periodic averaging)
    correction_steps: int = 1
    #: the local trainers' learning rate; None: ``train.lr`` (0 freezes them: every epoch
    #: with ``period`` 1 is then one ``halo`` epoch, the test of the correction step)
    local_lr: Optional[float] = None

    def __post_init__(self) -> None:
        for key, low in (("period", 1), ("correction_steps", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"options.{key} = {v!r}; expected an int >= {low}")
        if self.local_lr is not None and not (isinstance(self.local_lr, (int, float))
                                              and math.isfinite(self.local_lr)
                                              and self.local_lr >= 0):
            raise ValueError(f"options.local_lr = {self.local_lr!r}; expected a learning rate "
                             f">= 0, or leave it out for train.lr")


@register
class LLCG(HaloFamily):
    name = "llcg"
    description = ("LLCG: local trainers on induced subgraphs, periodic averaging, a "
                   "correction step on the whole graph")
    Options = LLCGOptions
    own_schedule = True     # periodic averaging, as tma
    residency_traffic = ("sends boundary nodes' raw input features (fetched once at set-up, "
                         "for the correction step) and model parameters")

    def setup_exchange(self) -> None:
        ctx, o = self.ctx, self.options
        # the server model is HaloFamily's (self.model, self.opt); the local trainer starts
        # from it
        self.local = ctx.build_model()
        self.local.load_state_dict(self.model.state_dict())
        self.local_opt = ctx.optimizer(self.local.parameters(), lr=o.local_lr)
        self.local_fwd = induced_forward(self.local, ctx.part, ctx.device)
        self.train_idx = torch.nonzero(ctx.part.train_mask).flatten().to(ctx.device)
        self.work_total, self.budget = 0.0, float(ctx.train_cfg.epochs)
        self.synced = True      # the server model holds the local models' average

    def _average(self, kind: str) -> None:
        """The local models' mean into the server model (one all-reduce of the parameters)."""
        P = self.ctx.world_size
        flat = torch.cat([q.detach().reshape(-1) for q in self.local.parameters()])
        if P > 1:
            self.ctx.comm.all_reduce(flat, kind, carries=Traffic.PARAMETERS)
            flat /= P
        # the mean is the same on every rank: all stop here together, none averages a NaN on
        if not bool(torch.isfinite(flat).all()):
            raise NonFiniteError(f"non-finite model parameters in the average of epoch "
                                 f"{self.ctx.comm.epoch} (a local trainer diverged); all ranks "
                                 f"stopped (lower options.local_lr or train.lr, or resume from "
                                 f"the last checkpoint)")
        at = 0
        with torch.no_grad():
            for q in self.model.parameters():
                q.copy_(flat[at:at + q.numel()].view_as(q))
                at += q.numel()
        self.synced = True

    def train_epoch(self, epoch: int) -> EpochResult:
        o = self.options
        self.local.train()
        self.local_opt.zero_grad(set_to_none=True)
        logits = self.local_fwd()
        idx = self.train_idx
        # a rank without training nodes still steps (zero gradient) and joins the average
        loss = F.cross_entropy(logits[idx], self.y[idx]) if idx.numel() else logits.sum() * 0
        loss.backward()
        self.local_opt.step()
        self.synced = False
        work, out = 1.0, float(loss.detach())
        if (epoch + 1) % o.period == 0 and o.correction_steps:
            self._average("llcg_avg")
            self.model.train()
            for k in range(o.correction_steps):
                self.opt.zero_grad(set_to_none=True)
                key = mix_key(self.ctx.train_cfg.seed, epoch) if k == 0 else \
                    mix_key(mix_key(self.ctx.train_cfg.seed, epoch), k)
                out = self.finish_step(self.forward(key, self.exchanger))
            self.local.load_state_dict(self.model.state_dict())
            work += o.correction_steps
        elif (epoch + 1) % o.period == 0:   # plain periodic averaging
            self._average("llcg_avg")
            self.local.load_state_dict(self.model.state_dict())
        self.work_total += work
        return EpochResult(loss=out, work=work)

    def evaluate(self) -> dict[str, float]:
        if not self.synced:     # the average of where the local models are now
            self._average("llcg_eval_avg")
        return super().evaluate()

    def finished(self) -> bool:
        return self.work_total >= self.budget - 1e-9

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "local": self.local.state_dict(),
                "local_optimizer": self.local_opt.state_dict(), "work_total": self.work_total,
                "synced": self.synced}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.local.load_state_dict(state["local"])
        self.local_opt.load_state_dict(state["local_optimizer"])
        self.work_total, self.synced = float(state["work_total"]), bool(state["synced"])
