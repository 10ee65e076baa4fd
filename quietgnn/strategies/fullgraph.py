"""What the seeds' full-graph baselines share (``bns``, ``pipegcn``, ``sancus``): ``halo``'s
parts, model and optimizer, the halo's input rows fetched once at set-up, exact evaluation
with whole rows, and a checkpoint of the model, the optimizer and whatever the strategy's own
exchange keeps between epochs. Each of them adds only its exchange (``setup_exchange``) and its
epoch; ``halo`` itself is not built on this (its lean forward has set-up of its own)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional

from torch import Tensor

from ..comm import HaloExchanger
from ..rows import to_device
from .base import Strategy
from .common import global_evaluate, inputs_with_halo, masked_loss, partition_adj, sync_gradients


class HaloFamily(Strategy):
    """A full-graph strategy on ``halo``'s data path; subclasses set ``name`` and
    ``Options`` and write ``train_epoch`` (with :meth:`forward` and :meth:`finish_step`)."""

    default_partitioner = "metis"
    residency_traffic = "sends boundary nodes' raw input features (fetched once at set-up)"
    #: keep mostly-zero input rows sparse, as ``halo`` does (false: the strategy edits them)
    sparse_inputs: ClassVar[bool] = True

    def setup(self) -> None:
        ctx, p = self.ctx, self.ctx.part
        dev = ctx.device
        self.adj = partition_adj(p, dev)
        self.y, self.train_mask = p.y.to(dev), p.train_mask.to(dev)
        self.ids = p.owned.to(dev)          # global ids: the dropout masks' keys
        self.model = ctx.build_model()
        self.params = list(self.model.parameters())
        self.opt = ctx.optimizer(self.params)
        self.exchanger: Optional[HaloExchanger] = None
        self.x, self.ids_in = to_device(p.x, dev), None
        if ctx.world_size > 1:
            self.exchanger = HaloExchanger(ctx.comm, p, kind=self.name)
            self.x = inputs_with_halo(ctx.comm, p, dev, sparse=self.sparse_inputs)
            self.ids_in = p.local_ids().to(dev)
        self.setup_exchange()

    def setup_exchange(self) -> None:
        """The strategy's own exchange, built after the shared set-up (none by default)."""

    def forward(self, key: Optional[int], exchange: Any, x: Any = None) -> Tensor:
        """Logits of every owned row: ``x`` (default the inputs) through the model with
        ``exchange``, dropout keyed by ``key`` (None: no dropout, as in evaluation)."""
        return self.model(self.x if x is None else x, self.adj, exchange=exchange,
                          dropout_key=key, ids=self.ids, ids_in=self.ids_in,
                          inputs_have_halo=self.ids_in is not None)

    def finish_step(self, logits: Tensor, before_sync: Optional[Callable[[], None]] = None
                    ) -> float:
        """Loss, backward, (``before_sync``), the gradient all-reduce, the optimizer step;
        returns the global loss."""
        loss = masked_loss(logits, self.y, self.train_mask, self.ctx.part.num_train_global)
        loss.backward()
        if before_sync is not None:
            before_sync()
        global_loss = sync_gradients(self.ctx.comm, self.params, loss)
        self.opt.step()
        return global_loss

    def evaluate(self) -> dict[str, float]:
        # exact, as halo's: this epoch's whole rows, every one exchanged where it is needed
        return global_evaluate(self.model, self.ctx.part, self.ctx.comm,
                               lambda: self.forward(None, self.exchanger))

    def evaluate_local(self) -> Optional[dict[str, float]]:
        return self._induced_evaluate()   # as halo: the rank's own subgraph, no traffic

    def exchange_state(self) -> Optional[dict[str, Any]]:
        """What the strategy's exchange keeps between epochs (None: nothing)."""
        return None

    def load_exchange_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`exchange_state`."""

    def state_dict(self) -> dict[str, Any]:
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}
        kept = self.exchange_state()
        if kept is not None:   # a resumed run goes on with what the exchange held
            state["exchange"] = kept
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        if "exchange" in state:
            self.load_exchange_state(state["exchange"])
