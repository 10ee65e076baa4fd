"""``sancus``: SANCUS -- ``halo``'s training, each rank re-sending its boundary rows only when
they have drifted from what it last sent; its peers use their cached copy otherwise.

Paper: Peng, Chen, Shao, Shen, Chen, Cao, "SANCUS: Staleness-Aware Communication-Avoiding
Full-Graph Decentralized Training in Large-Scale Graph Neural Networks" (VLDB 2022). A seed
baseline: AdaQP measures itself against it.

Per hidden layer and epoch each rank decides, for all its peers alike (SANCUS skips whole
broadcasts), whether to send: it sends when its boundary rows' relative drift since its last
send, ``||H[B] - H_sent[B]|| / ||H_sent[B]||``, reaches ``bound`` (the paper's
variation-based staleness bound) or its last send is ``max_stale`` epochs old (the
epoch-based bound). The decisions cross as one byte per peer and layer (control traffic); the
rows of a rank that skips come from its peers' caches. A cached row is a constant: no
gradient goes back for it (the paper's bounded gradient error); fresh rows' gradients go back
to their owners as in ``halo``. The rows are exchanged and cached *before* dropout and every
rank drops ``[owned ; halo]`` itself with the owners' keyed masks (the same numbers as
dropping before the exchange), so that a drift measures the model, not the masks.

``bound 0`` sends every row every epoch without deciding: ``halo`` with whole rows, bytes
included. Traffic per epoch: ``halo``'s whole-row bytes for the ranks that send, ``P - 1``
bytes per rank and layer of decisions, one all-reduce of ``|theta| + 1 + P`` floats; once at
set-up, the halo's input rows. Gives up: fresh neighbours (rows up to ``max_stale`` epochs old
within ``bound``) and their gradients, for the broadcasts skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from ..comm import HaloExchanger
from ..comm.traffic import Traffic
from ..nn.keyed import keyed_dropout, mix_key
from .base import EpochResult, register
from .fullgraph import HaloFamily


@dataclass
class SancusOptions:
    """``options.*`` of ``sancus``."""

    #: re-send when the boundary rows drifted by this fraction (relative Frobenius norm)
    #: since the last send; 0: every epoch (``halo``)
    bound: float = 0.1
    #: re-send at the latest after this many epochs, whatever the drift
    max_stale: int = 8

    def __post_init__(self) -> None:
        if not float(self.bound) >= 0.0:
            raise ValueError(f"options.bound = {self.bound!r}; expected a relative drift >= 0 "
                             f"(0: send every epoch, as halo; 0.1: re-send after a 10 % drift)")
        if isinstance(self.max_stale, bool) or not isinstance(self.max_stale, int) or \
                self.max_stale < 1:
            raise ValueError(f"options.max_stale = {self.max_stale!r}; expected a whole number "
                             f"of epochs >= 1")


class SkipExchange:
    """``exchange(h, layer, drop=(rate, key))`` for the model: ``[h ; halo]`` with each peer's
    block fresh when that peer sent it this epoch, else this rank's cached copy; then keyed
    dropout over all rows."""

    drops_rows = True

    def __init__(self, ex: HaloExchanger, owned: Tensor, options: SancusOptions) -> None:
        self.ex, self.bound, self.max_stale = ex, float(options.bound), int(options.max_stale)
        self.ids = torch.cat([owned, ex.halo_ids])    # the dropout masks' keys, [own ; halo]
        self.sent: dict[int, Tensor] = {}     # layer -> the boundary rows as last sent
        self.age: dict[int, int] = {}         # layer -> epochs since this rank last sent
        self.cache: dict[int, Tensor] = {}    # layer -> [n_halo, d], each peer's last rows
        self.skipped = 0                      # this rank's skipped sends (for the records)

    def _decide(self, rows: Tensor, layer: int) -> list[bool]:
        """Which ranks send this layer now (every rank learns every decision)."""
        ex, P = self.ex, self.ex.comm.world_size
        last = self.sent.get(layer)
        if self.bound == 0.0:   # every epoch: nothing to decide, no decision sent
            return [True] * P
        fresh = last is None or self.age[layer] + 1 >= self.max_stale
        if not fresh:   # one read of both norms (on a GPU each read is a sync)
            drift, size = torch.stack([torch.linalg.vector_norm(rows - last),
                                       torch.linalg.vector_norm(last)]).cpu().tolist()
            fresh = drift >= self.bound * size
        flag = torch.tensor([[int(fresh)]], dtype=torch.uint8, device=rows.device)
        got = ex.comm.all_to_all([flag] * P, "sancus_skip", [1] * P, carries=Traffic.CONTROL)
        # every peer's flag in one read, not one read per peer (on a GPU each is a sync)
        flags = torch.cat([g.reshape(-1) for g in got]).cpu().tolist()
        return [bool(f) if j != ex.comm.rank else fresh for j, f in enumerate(flags)]

    def __call__(self, h: Tensor, layer: int, drop: Optional[tuple[float, int]] = None) -> Tensor:
        ex = self.ex
        ex.comm.declare(Traffic.EMBEDDINGS, "halo exchange", f"{ex.kind}_fwd")
        rows = h.detach().index_select(0, ex.send_all)
        fresh = self._decide(rows, layer)
        if fresh[ex.comm.rank]:
            self.sent[layer], self.age[layer] = rows, 0
        else:
            self.age[layer] += 1
            self.skipped += 1
        out = _SkipFn.apply(h, self, layer, fresh)
        return keyed_dropout(out, drop[0], drop[1], self.ids) if drop is not None else out

    def state(self) -> dict[str, Any]:
        return {"sent": {str(k): v for k, v in self.sent.items()},
                "age": {str(k): v for k, v in self.age.items()},
                "cache": {str(k): v for k, v in self.cache.items()}}

    def load(self, state: dict[str, Any], device: torch.device) -> None:
        self.sent = {int(k): v.to(device) for k, v in state["sent"].items()}
        self.age = {int(k): int(v) for k, v in state["age"].items()}
        self.cache = {int(k): v.to(device) for k, v in state["cache"].items()}


class _SkipFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, se: SkipExchange, layer: int, fresh: list[bool]) -> Tensor:
        ex, me = se.ex, se.ex.comm.rank
        ctx.se, ctx.fresh = se, fresh
        send = torch.split(h.index_select(0, ex.send_all), ex.send_counts)
        send = [s if fresh[me] else s[:0] for s in send]
        counts = [c if fresh[j] else 0 for j, c in enumerate(ex.recv_counts)]
        got = ex.comm.all_to_all(send, f"{ex.kind}_fwd", counts, carries=Traffic.EMBEDDINGS)
        cache = se.cache.get(layer)
        if cache is None:
            cache = se.cache[layer] = h.new_zeros((ex.n_halo,) + tuple(h.shape[1:]))
        at = 0
        for j, c in enumerate(ex.recv_counts):
            if fresh[j] and c:
                cache[at:at + c] = got[j]
            at += c
        return torch.cat([h, cache])

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        se, fresh = ctx.se, ctx.fresh
        ex, me = se.ex, se.ex.comm.rank
        # only the fresh rows' gradients go back to their owners: a cached row is a constant
        halo = torch.split(grad[ex.n_own:], ex.recv_counts)
        send = [g if fresh[j] else g[:0] for j, g in enumerate(halo)]
        counts = [c if fresh[me] else 0 for c in ex.send_counts]
        back = grad.new_empty((sum(counts),) + tuple(grad.shape[1:]))   # received in place
        ex.comm.all_to_all(send, f"{ex.kind}_bwd", counts, out=back,
                           carries=Traffic.ACTIVATION_GRADS)
        g = grad[: ex.n_own]
        if fresh[me] and ex.send_all.numel():
            g = g.index_add(0, ex.send_all, back)
        return g, None, None, None


@register
class Sancus(HaloFamily):
    name = "sancus"
    description = "SANCUS: halo exchange skipped while a rank's boundary rows drift little"
    Options = SancusOptions

    def setup_exchange(self) -> None:
        self.skip: Optional[SkipExchange] = None
        if self.exchanger is not None:
            self.skip = SkipExchange(self.exchanger, self.ids, self.options)

    def train_epoch(self, epoch: int) -> EpochResult:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        before = self.skip.skipped if self.skip is not None else 0
        logits = self.forward(mix_key(self.ctx.train_cfg.seed, epoch), self.skip)
        loss = self.finish_step(logits)
        after = self.skip.skipped if self.skip is not None else 0
        return EpochResult(loss=loss, extra={"skipped_sends": after - before})

    def exchange_state(self) -> Optional[dict[str, Any]]:
        return self.skip.state() if self.skip is not None else None   # caches and ages

    def load_exchange_state(self, state: dict[str, Any]) -> None:
        if self.skip is not None:
            self.skip.load(state, self.ctx.device)
