"""``halo``: vanilla distributed full-graph training (the exact distributed baseline).

Each rank owns a partition (METIS by default) and its 1-hop halo. Per layer the owners send
the boundary rows ``H^l[B_{i->j}]`` to every peer, each rank aggregates over ``[owned | halo]``
with global degrees, and in backward the halo-row gradients go back to their owners. Parameter
gradients (and the loss) are summed in one all-reduce. Result: exactly the ``centralized``
forward and gradients, for any number of partitions.

Traffic per epoch: ``4 sum|B| (sum_{l<L} d_l + sum_{1<=l<L} d_l)`` bytes of halo rows (layer 0
features need no backward) + one all-reduce of ``|theta| + 1 + P`` floats.
"""

from __future__ import annotations

from typing import Any

from ..comm import HaloExchanger
from ..nn import maybe_sparse
from .base import (EpochResult, Strategy, global_evaluate, masked_loss, partition_adj, register,
                   sync_gradients)


@register
class Halo(Strategy):
    name = "halo"
    description = "full-graph training with a halo exchange per layer (exact)"
    default_partitioner = "metis"
    exact = True

    def setup(self) -> None:
        ctx, p = self.ctx, self.ctx.part
        dev = ctx.device
        self.adj = partition_adj(p, dev)
        self.x, self.y = p.x.to(dev), p.y.to(dev)
        if ctx.world_size == 1:
            # the whole graph: mostly-zero features stay sparse (nothing to exchange)
            self.x = maybe_sparse(self.x)
        self.train_mask = p.train_mask.to(dev)
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        # one rank holds the whole graph: nothing to exchange
        self.exchanger = HaloExchanger(ctx.comm, p, kind="halo") if ctx.world_size > 1 else None

    def forward(self):
        """Logits of every owned node (full neighbourhood through the halo)."""
        return self.model(self.x, self.adj, exchange=self.exchanger)

    def train_epoch(self, epoch: int) -> EpochResult:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        loss = masked_loss(self.forward(), self.y, self.train_mask, self.ctx.part.num_train_global)
        loss.backward()
        global_loss = sync_gradients(self.ctx.comm, self.params, loss)
        self.opt.step()
        return EpochResult(loss=global_loss)

    def evaluate(self) -> dict[str, float]:
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm, self.forward)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
