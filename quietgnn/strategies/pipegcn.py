"""``pipegcn``: PipeGCN -- ``halo``'s exchange, one epoch stale, so that it flies while the
epoch computes.

Paper: Wan, Li, Lin et al., "PipeGCN: Efficient Full-Graph Training of Graph Convolutional
Networks with Pipelined Feature Communication" (ICLR 2022). A seed baseline: AdaQP measures
itself against it.

Training is ``halo``'s (the same parts, keyed dropout, inputs fetched once, exact evaluation)
but, in every hidden layer, the halo rows a rank aggregates are the ones its peers sent in
the *previous* epoch, and the gradients of those rows reach their owners one epoch late too.
This epoch's boundary rows leave as soon as the layer has them (an asynchronous all-to-all)
and the halo rows' gradients as backward reaches them; neither is waited for until the next
epoch needs it (the layer's forward, its backward), so each flies through the rest of this
epoch, the gradient all-reduce, the optimizer step, any evaluation, and the next epoch up
to that layer -- the paper's pipeline. The first epoch has no stale rows: its forward
exchange is waited for at once, as ``halo``'s is. The last epoch of the schedule sends
nothing (no epoch would use it). Waiting earlier changes no number (what arrives is the
same), so an epoch whose state is saved, or after which the run stops early, lands
whatever is in flight (:meth:`~PipeGCN.settle`). An epoch's records count the exchanges it
waited for: from the second epoch on, the previous epoch's. ``smoothing`` = gamma > 0 is the
paper's PipeGCN-GF: the stale rows and gradients used are moving averages,
``gamma * previous + (1 - gamma) * received``.

``stale false`` is ``halo`` with whole rows (``skip_dropped false``): every exchange waited
for where it is made, the same numbers. Traffic per epoch is that of ``halo`` with whole rows
(none in the last epoch's hidden layers):
``4 sum|B| (sum_{1<=l<L} d_l) * 2`` bytes + one all-reduce of ``|theta| + 1 + P`` floats; once
at set-up, the halo's input rows. Gives up: exact gradients (features and their gradients one
step stale) for time, where the link is slow and the epoch has compute to hide it behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from ..comm import HaloExchanger
from ..comm.traffic import Traffic
from ..nn.keyed import mix_key
from .base import EpochResult, register
from .fullgraph import HaloFamily


@dataclass
class PipeGCNOptions:
    """``options.*`` of ``pipegcn``."""

    #: use the previous epoch's halo rows and gradients (the pipeline); false: ``halo``
    stale: bool = True
    #: PipeGCN-GF's gamma: stale rows and gradients as moving averages (0: off, the paper's
    #: PipeGCN; it suggests 0.95 for GF)
    smoothing: float = 0.0
    #: where an exchange is waited for: 'next' (where the next epoch needs it, the paper's
    #: pipeline) or 'epoch' (at this epoch's end, before the gradient all-reduce: it hides
    #: only the rest of the epoch's compute; the same numbers)
    wait: str = "next"

    def __post_init__(self) -> None:
        if self.wait not in ("next", "epoch"):
            raise ValueError(f"options.wait = {self.wait!r}; expected 'next' (the pipeline: "
                             f"where the next epoch needs it) or 'epoch' (at the epoch's end)")
        if not isinstance(self.stale, bool):
            raise ValueError(f"options.stale = {self.stale!r}; expected true or false")
        if not 0.0 <= float(self.smoothing) < 1.0:
            raise ValueError(f"options.smoothing = {self.smoothing!r}; expected a gamma in "
                             f"[0, 1) (0: off; the paper's PipeGCN-GF uses 0.95)")


class StaleExchange:
    """``exchange(h, layer)`` for the model: ``[h ; the halo rows of the previous epoch]``,
    this epoch's boundary rows (and, in backward, the halo rows' gradients) sent on their
    way and landed where the next epoch needs them; :meth:`finish` lands them all now."""

    skips_dropped = False

    def __init__(self, ex: HaloExchanger, smoothing: float) -> None:
        self.ex, self.gamma = ex, float(smoothing)
        self.rows: dict[int, Tensor] = {}       # layer -> [n_halo, d] for the next forward
        self.grads: dict[int, Tensor] = {}      # layer -> [len(send_all), d] for the next backward
        self._flying: dict[tuple[str, int], tuple[Any, Tensor]] = {}   # (way, layer) -> in flight
        #: false in the schedule's last epoch: what it would send no epoch uses
        self.sending = True

    def __call__(self, h: Tensor, layer: int) -> Tensor:
        ex = self.ex
        self._land("fwd", layer)   # the previous epoch's rows, before this epoch's leave
        if not self.sending and layer in self.rows:
            return _StaleFn.apply(h, self, layer)
        ex.comm.declare(Traffic.EMBEDDINGS, "halo exchange", f"{ex.kind}_fwd")
        send = torch.split(h.detach().index_select(0, ex.send_all), ex.send_counts)
        # received straight into the buffer kept for the next epoch (no concatenation after)
        got = h.new_empty((ex.n_halo,) + tuple(h.shape[1:]))
        pending = ex.comm.all_to_all_async(send, f"{ex.kind}_fwd", ex.recv_counts, out=got,
                                           carries=Traffic.EMBEDDINGS)
        self._flying[("fwd", layer)] = (pending, got)
        if layer not in self.rows:   # the first epoch: nothing stale yet, wait as halo does
            self._land("fwd", layer)
        return _StaleFn.apply(h, self, layer)

    def _land(self, way: str, layer: int) -> None:
        """Wait for the exchange in flight for (``way``, ``layer``), if any, and keep it."""
        flying = self._flying.pop((way, layer), None)
        if flying is None:
            return
        pending, got = flying
        pending.wait()
        store = self.rows if way == "fwd" else self.grads
        old = store.get(layer)
        store[layer] = got if old is None or self.gamma == 0.0 else \
            old.mul_(self.gamma).add_(got, alpha=1.0 - self.gamma)

    def finish(self) -> None:
        """Land every exchange in flight (the next epoch would use the same rows)."""
        for way, layer in list(self._flying):
            self._land(way, layer)

    def drop(self) -> None:
        """Forget what is in flight without waiting (a failed run: it may never come; the
        process group's teardown bounds what gloo still waits for by its timeout)."""
        self._flying.clear()

    def state(self) -> dict[str, Any]:
        self.finish()
        return {"rows": dict(self.rows), "grads": dict(self.grads)}

    def load(self, state: dict[str, Any], device: torch.device) -> None:
        self.rows = {int(k): v.to(device) for k, v in state["rows"].items()}
        self.grads = {int(k): v.to(device) for k, v in state["grads"].items()}


class _StaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, se: StaleExchange, layer: int) -> Tensor:
        ctx.se, ctx.layer = se, layer
        return torch.cat([h, se.rows[layer].to(h.dtype)])

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        se, ex = ctx.se, ctx.se.ex
        se._land("bwd", ctx.layer)   # what the peers sent last epoch for the rows owned here
        if se.sending:
            halo = grad[ex.n_own:]
            send = torch.split(halo, [c for c in ex.recv_counts])   # back to the rows' owners
            got = grad.new_empty((ex.send_all.numel(),) + tuple(grad.shape[1:]))
            pending = ex.comm.all_to_all_async(send, f"{ex.kind}_bwd", ex.send_counts,
                                               out=got, carries=Traffic.ACTIVATION_GRADS)
            se._flying[("bwd", ctx.layer)] = (pending, got)
        g = grad[: ex.n_own]
        stale = se.grads.get(ctx.layer)
        if stale is not None:
            g = g.index_add(0, ex.send_all, stale.to(g.dtype))
        return g, None, None


@register
class PipeGCN(HaloFamily):
    name = "pipegcn"
    description = "PipeGCN: halo exchange one epoch stale, overlapped with the epoch's compute"
    Options = PipeGCNOptions

    def setup_exchange(self) -> None:
        self.stale: Optional[StaleExchange] = None
        self.last_epoch: Optional[int] = None   # set by max_calls
        if self.exchanger is not None and self.options.stale:
            self.stale = StaleExchange(self.exchanger, self.options.smoothing)

    def max_calls(self, epochs: int) -> int:
        self.last_epoch = epochs - 1
        return epochs

    def train_epoch(self, epoch: int) -> EpochResult:
        if self.stale is not None:
            self.stale.sending = epoch != self.last_epoch
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        logits = self.forward(mix_key(self.ctx.train_cfg.seed, epoch),
                              self.stale or self.exchanger)
        # wait 'next': the exchanges stay in flight, the next epoch lands them where it
        # needs them
        early = self.stale is not None and self.options.wait == "epoch"
        return EpochResult(loss=self.finish_step(logits, self.settle if early else None))

    def settle(self) -> None:
        if self.stale is not None:
            self.stale.finish()

    def close(self) -> None:
        # the trainer settled a run that ended well; one that failed (a peer gone) must not
        # wait here for what will not come
        if self.stale is not None:
            self.stale.drop()

    def exchange_state(self) -> Optional[dict[str, Any]]:
        return self.stale.state() if self.stale is not None else None   # the pipeline

    def load_exchange_state(self, state: dict[str, Any]) -> None:
        if self.stale is not None:
            self.stale.load(state, self.ctx.device)
