"""``halo``: distributed full-graph training (the exact distributed baseline).

Each rank owns a partition (METIS by default) and its 1-hop halo. The halo's *input* rows never
change, so each rank fetches them once at setup (``cache_inputs``, the default; sent sparse
when that is smaller) and keeps ``[owned ; halo]`` inputs. Per hidden layer the owners send the
boundary rows ``H^l[B_{i->j}]`` to every peer, each rank aggregates over ``[owned | halo]``
with global degrees, and in backward the halo-row gradients go back to their owners. Parameter
gradients (and the loss) are summed in one all-reduce. Dropout masks are keyed by (seed, epoch,
layer, global node, column) (:mod:`quietgnn.nn.keyed`), so a halo input row is dropped exactly
as its owner would drop it. Result: exactly the ``centralized`` forward and gradients, dropout
on, for any number of partitions.

Traffic per epoch (``sum|B|`` boundary rows, ``d_l`` layer widths, L layers, dropout p):
about ``(1 - p) 4 sum|B| (sum_{1<=l<L} d_l) * 2`` bytes of halo rows and their gradients (only
the entries dropout kept travel, ``skip_dropped``; evaluation sends whole rows) + one
all-reduce of ``|theta| + 1 + P`` floats; once at setup, the halo's input rows (``data``).
The literature's vanilla baseline, kept for comparison (``cache_inputs false``,
``skip_dropped false``), sends layer 0's rows every epoch and at every evaluation too
(``+ 4 sum|B| d_0``) and whole hidden rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..comm import HaloExchanger
from ..nn import maybe_sparse
from ..nn.lean import lean_forward
from ..nn.keyed import mix_key
from ..rows import to_device
from .base import EpochResult, LeanOption, Strategy, register
from .common import global_evaluate, inputs_with_halo, masked_loss, partition_adj, sync_gradients


@dataclass
class HaloOptions:
    """``options.*`` of ``halo`` (and ``centralized``)."""

    #: fetch the halo's static input rows once at setup instead of every epoch (false: the
    #: vanilla baseline of the papers, which re-sends them in every forward pass)
    cache_inputs: bool = True
    #: send only the entries of a hidden row that dropout kept (the receiver recomputes the
    #: keyed mask); false: send the dropped zeros too, as the papers' vanilla baseline does
    skip_dropped: bool = True
    #: memory-lean forward (GCN): narrowing layers transform before the exchange (their halo
    #: rows travel d_out wide) and the row-wise work between aggregations is recomputed a
    #: slice of rows at a time in backward (:mod:`quietgnn.nn.lean`): activations of the
    #: input and output widths instead of the hidden one; the part's edges and features stay
    #: memory-mapped as stored. Exact, like the default; fewer bytes, more compute
    lean: bool = False

    def __post_init__(self) -> None:
        for key in ("cache_inputs", "skip_dropped", "lean"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"options.{key} = {getattr(self, key)!r}; expected true or "
                                 f"false")


@register
class Halo(LeanOption, Strategy):
    name = "halo"
    description = "full-graph training with a halo exchange per layer (exact)"
    default_partitioner = "metis"
    residency_traffic = "sends boundary nodes' raw input features (layer 1's halo exchange)"
    exact = True
    Options = HaloOptions

    def setup(self) -> None:
        ctx, p = self.ctx, self.ctx.part
        dev = ctx.device
        self.adj = partition_adj(p, dev)
        self.x, self.y = to_device(p.x, dev), p.y.to(dev)
        self.ids = p.owned.to(dev)          # global ids: the dropout masks' keys
        self.ids_in: Optional[torch.Tensor] = None
        self.inputs_have_halo = False
        self._epoch = 0
        if self.options.lean:
            self.check_model(self.options, ctx.model_cfg)
            if ctx.world_size > 1 and self.options.cache_inputs:
                self.x = inputs_with_halo(ctx.comm, p, dev, sparse=False)
                self.ids_in = p.local_ids().to(dev)
                self.inputs_have_halo = True
        elif ctx.world_size == 1:
            # the whole graph: mostly-zero features stay sparse (nothing to exchange)
            self.x = maybe_sparse(self.x)
        elif self.options.cache_inputs:
            self.x = inputs_with_halo(ctx.comm, p, dev)
            self.ids_in = p.local_ids().to(dev)
            self.inputs_have_halo = True
        self.train_mask = p.train_mask.to(dev)
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        # one rank holds the whole graph: nothing to exchange
        self.exchanger = None if ctx.world_size == 1 else \
            HaloExchanger(ctx.comm, p, kind="halo", skip_dropped=self.options.skip_dropped)

    def forward(self):
        """Logits of every owned node (full neighbourhood through the halo)."""
        key = mix_key(self.ctx.train_cfg.seed, self._epoch) if self.model.training else None
        if self.options.lean:
            return lean_forward(self.model, self.x, self.adj, exchange=self.exchanger,
                                dropout_key=key, ids=self.ids, ids_in=self.ids_in,
                                inputs_have_halo=self.inputs_have_halo)
        return self.model(self.x, self.adj, exchange=self.exchanger, dropout_key=key,
                          ids=self.ids, ids_in=self.ids_in,
                          inputs_have_halo=self.inputs_have_halo)

    def train_epoch(self, epoch: int) -> EpochResult:
        self._epoch = epoch
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        loss = masked_loss(self.forward(), self.y, self.train_mask, self.ctx.part.num_train_global)
        loss.backward()
        global_loss = sync_gradients(self.ctx.comm, self.params, loss)
        self.opt.step()
        return EpochResult(loss=global_loss)

    def evaluate(self) -> dict[str, float]:
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm, self.forward)

    def evaluate_local(self) -> Optional[dict[str, float]]:
        # lean: the induced subgraph would be a second copy of the part's edges, in memory;
        # the exact evaluation (narrow rows exchanged) is what the trainer then runs
        return None if self.options.lean else self._induced_evaluate()

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
