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

import torch

from ..nn import SparseFeatures
from ..nn.keyed import mix_key
from .base import EpochResult, register
from .fullgraph import HaloFamily


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
class BNS(HaloFamily):
    name = "bns"
    description = "BNS-GCN: halo exchange of a random p of the boundary nodes each epoch"
    Options = BNSOptions
    # the sample is a function of (seed, epoch): the checkpoint needs nothing of it

    def _inputs(self, masks: tuple[torch.Tensor, torch.Tensor], scale: float):
        """Layer 0's ``[owned ; halo]`` rows with the epoch's sample applied to the halo (a
        mostly-zero input stays sparse: only its non-zeros are scaled)."""
        n_own = self.ctx.part.n_own
        if isinstance(self.x, SparseFeatures):
            factor = torch.ones(self.x.shape[0], dtype=self.x.dtype, device=self.x.device)
            factor[n_own:] = masks[1].to(factor) * scale
            return self.x.scale_rows(factor)
        halo = self.x[n_own:] * (masks[1].to(self.x.dtype) * scale).unsqueeze(1)
        return torch.cat([self.x[:n_own], halo])

    def train_epoch(self, epoch: int) -> EpochResult:
        rate = float(self.options.p)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        key = mix_key(self.ctx.train_cfg.seed, epoch)
        if self.exchanger is None:
            logits, sent = self.forward(key, None), 0
        else:
            ex = self.exchanger
            masks = ex.row_sample(rate, mix_key(key, 0x626E73))   # 'bns': the sample's stream
            logits = self.forward(key, lambda h, i: ex.sampled(h, i, masks, 1.0 / rate),
                                  x=self._inputs(masks, 1.0 / rate))
            sent = int(masks[0].sum())
        return EpochResult(loss=self.finish_step(logits),
                           extra={"sampled_boundary_rows": sent})
