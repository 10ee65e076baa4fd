"""``bns``: BNS-GCN -- full-graph training on a random sample of the boundary nodes each epoch.

Paper: Wan, Li, Kim, Lin, "BNS-GCN: Efficient Full-Graph Training of Graph Convolutional
Networks with Partition-Parallelism and Random Boundary Node Sampling" (MLSys 2022). A seed
baseline: RETEXO and Grappa measure themselves against it at ``p = 0.1``.

Training is ``halo``'s, but each epoch only a fraction ``p`` of the boundary nodes take part:
a node is in the epoch's sample when a keyed hash of (seed, epoch, its global id) says so, so
its owner and every rank that holds it as a halo row agree without a message. In every layer
only the sampled rows cross (forward and backward), and the receiver scales them by ``1/p``
and holds zeros for the rest: each aggregation is an unbiased estimate of the full one for the
sum and mean aggregators of GCN, GraphSAGE and GIN (weights fixed by global degrees; GAT's
attention is not linear in its inputs, so there it is an approximation). Layer 0's input rows
are fetched once, as ``halo``'s are, and sampled locally. Evaluation is exact (every row).
``p = 1`` is ``halo`` with whole rows (``skip_dropped false``).

Traffic per epoch: about ``p * 4 sum|B| (sum_{1<=l<L} d_l) * 2`` bytes of halo rows and their
gradients + one all-reduce of ``|theta| + 1 + P`` floats; once at set-up, the halo's input
rows. Gives up: the exact gradient (a sampled estimate of it) unless ``p = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..comm import HaloExchanger
from ..nn.keyed import mix_key
from ..rows import to_device
from .base import (EpochResult, Strategy, global_evaluate, inputs_with_halo, masked_loss,
                   partition_adj, register, sync_gradients)


@dataclass
class BNSOptions:
    """``options.*`` of ``bns``."""

    #: fraction of the boundary nodes sampled each epoch (the paper's p; 1: halo exactly)
    p: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < float(self.p) <= 1.0:
            raise ValueError(f"options.p = {self.p!r}; expected a fraction in (0, 1] (0.1 is "
                             f"the paper's default, 1 samples every boundary node)")


@register
class BNS(Strategy):
    name = "bns"
    description = "BNS-GCN: halo exchange of a random p of the boundary nodes each epoch"
    default_partitioner = "metis"
    Options = BNSOptions

    def setup(self) -> None:
        ctx, p = self.ctx, self.ctx.part
        dev = ctx.device
        self.adj = partition_adj(p, dev)
        self.y, self.train_mask = p.y.to(dev), p.train_mask.to(dev)
        self.ids = p.owned.to(dev)
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        self.exchanger: Optional[HaloExchanger] = None
        self.x, self.ids_in = to_device(p.x, dev), None
        if ctx.world_size > 1:
            self.exchanger = HaloExchanger(ctx.comm, p, kind="bns")
            self.x = inputs_with_halo(ctx.comm, p, dev, sparse=False)
            self.ids_in = p.local_ids().to(dev)

    def _inputs(self, masks: tuple[torch.Tensor, torch.Tensor], scale: float) -> torch.Tensor:
        """Layer 0's ``[owned ; halo]`` rows with the epoch's sample applied to the halo."""
        n_own = self.ctx.part.n_own
        halo = self.x[n_own:] * (masks[1].to(self.x.dtype) * scale).unsqueeze(1)
        return torch.cat([self.x[:n_own], halo])

    def train_epoch(self, epoch: int) -> EpochResult:
        rate = float(self.options.p)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        key = mix_key(self.ctx.train_cfg.seed, epoch)
        if self.exchanger is None:
            logits = self.model(self.x, self.adj, dropout_key=key, ids=self.ids)
            sent = 0
        else:
            ex = self.exchanger
            masks = ex.row_sample(rate, mix_key(key, 0x626E73))   # 'bns': the sample's stream
            logits = self.model(self._inputs(masks, 1.0 / rate), self.adj,
                                exchange=lambda h, i: ex.sampled(h, i, masks, 1.0 / rate),
                                dropout_key=key, ids=self.ids, ids_in=self.ids_in,
                                inputs_have_halo=True)
            sent = int(masks[0].sum())
        loss = masked_loss(logits, self.y, self.train_mask, self.ctx.part.num_train_global)
        loss.backward()
        global_loss = sync_gradients(self.ctx.comm, self.params, loss)
        self.opt.step()
        return EpochResult(loss=global_loss, extra={"sampled_boundary_rows": sent})

    def evaluate(self) -> dict[str, float]:
        # every row, as halo evaluates: the inputs fetched at set-up, whole hidden rows
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm, lambda: self.model(
            self.x, self.adj, exchange=self.exchanger, inputs_have_halo=self.ids_in is not None))

    def evaluate_local(self) -> Optional[dict[str, float]]:
        return self._induced_evaluate()   # as halo: the rank's own subgraph, no traffic

    def state_dict(self) -> dict[str, Any]:
        # the sample is a function of (seed, epoch): nothing of it to keep
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
