"""``retexo``: RETEXO, lazy message passing -- train one layer at a time, exchange boundary
embeddings once per layer.

Paper: Kolluri, Choudhary, Hooi, Saxena, "RETEXO: Scalable neural network training over
distributed graphs" (arXiv 2302.13053); ``docs/guide/strategies.md`` for users. Layers in
:mod:`.layers` (RetexoGCN / RetexoSAGE / RetexoGAT via ``model.arch``; GIN works too).

How it trains (rank ``i`` of ``P``, any partition -- ``metis`` by default, ``given``,
``random``, ... -- nodes never move)::

    h_0 = features; EXCHANGE(boundary rows of h_0)                    # once, in round 0
    for layer k = 0 .. L-1:                                            # R_k rounds each
        model_k = conv_k (+ [LayerNorm ->] ReLU -> Linear head for k < L-1), seeded init
        aggregation of the frozen h_k computed once (GAT: attention per step, local)
        each round (= one trainer epoch): validate the current parameters on the local
            validation nodes; full-batch forward on the local training nodes; loss = sum of
            cross-entropy / global train count (each rank's gradient weighted by its share of
            the training nodes); ONE all-reduce of [gradients | loss | NaN flags | val count];
            keep the parameters with the best global validation accuracy; Adam step
        after R_k rounds: validate the last step too, restore the best parameters,
            h_{k+1} = ReLU(LN(conv_k(h_k))) for owned rows (no grad; 'logits': the head's
            C logits instead) and EXCHANGE its boundary rows                 # once per layer
    predict with the last layer

GCN normalises with *global* degrees (stored in every partition, no traffic), so the
aggregation over a partition equals the whole graph's and P ranks compute what one process
computes (tested against a single-process layer-wise reference).

Schedule. One trainer epoch is one round. By default ``train.epochs`` rounds are split evenly
over the layers (``--epochs 200`` with 2 layers: 100 rounds each), so ``--epochs`` buys every
strategy the same number of passes over the training set. ``rounds_per_layer`` (one value for
every layer, or one per layer) fixes ``R_k`` instead; after ``sum R_k`` rounds
:meth:`Retexo.finished` ends the run, so ``train.epochs`` is then only an upper bound. If
``train.epochs`` is smaller the run stops inside an earlier layer (a warning says so); resuming
with more epochs continues a fixed schedule (a default schedule would change with the epochs:
such a resume is refused, naming the two schedules). ``evaluate()`` reports the model as it
stands: while layer ``k`` trains, the ``k+1``-layer prefix with layer ``k``'s head (and at the
end the final model with every layer's best parameters).

What crosses the network, exactly (phase ``train``; rank ``i`` sends, fp32):

* ``embed_fwd``: once per layer ``k``, ``4 d_k sum_j |B_{i->j}|`` bytes (``d_0`` = features,
  then ``hidden``, or ``C`` with ``embed='logits'``): ``L`` exchanges per run in all, each
  one all-to-all while ``num_nodes_global`` rows of it fit in 64 MiB / P, else a round of
  all-to-alls that gather at most 64 MiB each (``HaloExchanger.fill_halo``; same bytes);
* ``grad_allreduce``: once per round, ``|theta_k| + 1 + P + 1`` floats (gradients of layer
  ``k`` with its head, loss, NaN flags, validation count), ``2 (P-1)/P`` of that per rank
  (with ``grad_bits`` < 32 the gradients go quantized: two all-to-alls, ~``b/32`` of it);
* ``val_counts``: once per layer, one float64 (the last step's validation count).

Residency (``runtime.residency`` features / strict): round 0's exchange of raw features is
skipped: layer 0 aggregates the neighbours on its own rank only (a remote neighbour's row
counts as zeros; degrees stay global), so what crosses is learned embeddings of layer >= 1,
gradients of parameters and counts, and no feature, label or id ever leaves its rank.

``lean`` (GCN): the same layers in memory that follows the narrower widths, for parts of
10^7+ rows. The part is read as stored (int32 edges, float16 features, mapped; layer 0's
exchange sends the features as stored, 2 bytes a value), each aggregation runs a slice of rows
at a time with that slice's GCN weights formed when used (:mod:`quietgnn.nn.lean`), and where
layer ``k`` widens (``d_k`` < ``d_{k+1}``, e.g. 16 features -> 64 hidden) ``h_{k+1}`` is never
built: layer ``k``'s aggregates ``A_hat h_k`` of the owned rows cross instead (``4 d_k`` bytes a
boundary row, not ``4 d_{k+1}``), and layer ``k+1`` applies layer ``k``'s row-wise map (conv's
transform, LayerNorm, ReLU) to the rows each slice of edges gathers as it aggregates -- once
per edge instead of once per row, so ``[n_own + n_halo, d_{k+1}]`` never exists. Not after
layer 0 under a residency level (those aggregates are of raw features): ``h_1`` crosses as
itself there.

Evaluation (phase ``eval``) is ``eval_metrics`` only: the model runs on the already exchanged
frozen inputs. Compare ``halo``: per epoch, ``4 sum|B| (sum_l d_l + sum_{l>=1} d_l)`` bytes of
halo rows plus the whole model's gradients.

What it gives up: end-to-end training. Layer ``k`` never sees a gradient from the layers
above it and its output is frozen once trained, so this is a different model from the GNN that
``halo`` trains (often as accurate on homophilous graphs, sometimes less). Dropout acts on the
cached aggregates (GCN/SAGE/GIN), not on the raw inputs. Hidden layers keep the paper's
LayerNorm by default (``layer_norm``; null = follow ``model.norm``): without it Cora / CiteSeer
gain 0.8-1.7 test points at P = 1, but Computers GCN / SAGE lose 12 (hidden magnitudes there
vary too much for the frozen next layer), so it is not a general choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ...comm import HaloExchanger
from ...comm.lowrank import LowRankReducer
from ...comm.traffic import Traffic
from ...nn import GNN
from ...nn import lean as lean_module
from ...rows import to_device
from ...seeds import stream_seed
from ..base import EpochResult, LeanOption, Strategy, check_gradient_compression, register
from ..common import global_evaluate, partition_adj, sync_gradients
from .layers import Lazy, Pre, build_layers

__all__ = ["Retexo", "RetexoOptions"]


def _parse_rounds(v: Any) -> Optional[list[int]]:
    """None, an int, a list of ints or a string ``"100,50"`` -> None or a list of ints."""
    if v is None:
        return None
    items = v if isinstance(v, (list, tuple)) else [v]
    if isinstance(v, str):
        items = [s for s in v.strip("[]() ").split(",") if s.strip()]
    try:
        out = [int(x) for x in items]
        ok = bool(out) and all(not isinstance(x, (bool, float)) for x in items)
    except (TypeError, ValueError):
        out, ok = [], False
    if not ok or any(r < 1 for r in out):
        raise ValueError(f"options.rounds_per_layer = {v!r}; expected an int >= 1 (every layer)"
                         f" or one int >= 1 per layer, e.g. 100 or '100,50'")
    return out


def _pack(h: Optional[Tensor | Lazy]) -> Any:
    """A frozen input as checkpoint data (tensors and plain values only)."""
    return {"z": h.z, "layer": h.layer, "mode": h.mode} if isinstance(h, Lazy) else h


def _unpack(v: Any, device: torch.device) -> Optional[Tensor | Lazy]:
    if isinstance(v, dict):
        return Lazy(v["z"].to(device), int(v["layer"]), str(v["mode"]))
    return None if v is None else v.to(device)


@dataclass
class RetexoOptions:
    """Options of ``retexo`` (``--options.KEY VALUE``)."""

    #: rounds (= trainer epochs) per layer: one int for every layer, or one per layer
    #: ("100,50"); None: ``train.epochs`` split evenly over the layers
    rounds_per_layer: Any = None
    #: what layer k passes to layer k+1: 'hidden' (ReLU(LN(conv)), width model.hidden) or
    #: 'logits' (the layer's C class logits: C/hidden of the exchange bytes)
    embed: str = "hidden"
    #: LayerNorm before the ReLU of hidden layers: true (default, the paper's design) / false,
    #: or None = as ``model.norm`` ('layer': yes, 'none': no)
    layer_norm: Optional[bool] = True
    #: bits per gradient value on the wire: 32 = the exact fp32 all-reduce; 8/4/2 = the
    #: unbiased quantized all-reduce (comm/qreduce.py), ~b/32 of the bytes
    grad_bits: int = 32
    #: rank of the low-rank (PowerSGD, error feedback) gradient all-reduce: 0 = off (exact);
    #: r >= 1 sends each large weight matrix's gradient as rank-r factors (comm/lowrank.py)
    grad_rank: int = 0
    #: GCN, for parts of 10^7+ rows: the part read as stored (int32 edges, float16 features,
    #: mapped), aggregations a slice of rows at a time, and a widening layer's output neither
    #: exchanged nor held -- its narrower aggregates are, and the next layer recomputes the
    #: row-wise map per edge as it aggregates (the same sums in another order; fewer bytes)
    lean: bool = False

    def __post_init__(self) -> None:
        self.rounds_per_layer = _parse_rounds(self.rounds_per_layer)
        if self.embed not in ("hidden", "logits"):
            raise ValueError(f"options.embed = {self.embed!r}; expected 'hidden' (pass hidden "
                             f"embeddings) or 'logits' (pass class logits, fewer bytes)")
        check_gradient_compression(self.grad_bits, self.grad_rank)
        if self.layer_norm is not None and not isinstance(self.layer_norm, bool):
            raise ValueError(f"options.layer_norm = {self.layer_norm!r}; expected true, false, "
                             f"or null (follow model.norm)")

    def schedule(self, layers: int, epochs: int) -> list[int]:
        """Rounds ``R_k`` of each of ``layers`` layers in a run of ``epochs`` epochs."""
        r = self.rounds_per_layer
        if r is None:
            # the earlier layers get the remainder; at least one round each
            return [max(1, epochs // layers + (k < epochs % layers)) for k in range(layers)]
        if len(r) == 1:
            return r * layers
        if len(r) != layers:
            raise ValueError(f"options.rounds_per_layer = {r} gives {len(r)} values but the model"
                             f" has {layers} layers; give one value, or one per layer")
        return list(r)


@register
class Retexo(LeanOption, Strategy):
    name = "retexo"
    description = ("RETEXO: layer-by-layer training on frozen inputs, one boundary embedding "
                   "exchange per layer + per-round gradients of one small layer")
    Options = RetexoOptions
    default_partitioner = "metis"
    own_schedule = True     # its rounds per layer, not centralized's steps, pace it
    residency_levels = ("none", "features", "strict")
    residency_traffic = "sends raw features in its first exchange"   # skipped under residency

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        ctx, p, o, m = self.ctx, self.ctx.part, self.options, self.ctx.model_cfg
        dev = ctx.device
        self.R = o.schedule(m.layers, ctx.train_cfg.epochs)
        if sum(self.R) > ctx.train_cfg.epochs:
            ctx.log(f"retexo: the schedule has {sum(self.R)} rounds ({self.R} per layer) but "
                    f"train.epochs = {ctx.train_cfg.epochs}: this run stops inside an earlier "
                    f"layer; pass --epochs {sum(self.R)} (or resume later with more epochs)")
        if p.num_train_global <= 0:
            raise ValueError("retexo: the global training set is empty")
        self.adj = partition_adj(p, dev)
        self.exchanger = HaloExchanger(ctx.comm, p, kind="embed")
        self.train_rows = torch.nonzero(p.train_mask).flatten().to(dev)
        self.val_rows = torch.nonzero(p.val_mask).flatten().to(dev)
        self.y_train, self.y_val = p.y[self.train_rows.cpu()].to(dev), \
            p.y[self.val_rows.cpu()].to(dev)
        self.layer_norm = m.norm == "layer" if o.layer_norm is None else o.layer_norm
        self.layers = build_layers(m.arch, p.num_features, m.hidden, p.num_classes, m.layers,
                                   m.heads, m.dropout, self.layer_norm, o.embed,
                                   ctx.seed).to(dev)
        self.k, self.round = 0, 0            # layer being trained, rounds it has done
        self.h: Optional[Tensor] = None      # frozen input of layer k, [n_own + n_halo, d_k]
        self.h_next: Optional[Tensor] = None  # its output once layer k is done
        self.pre: Optional[Pre] = None       # layer k's cached aggregates of h
        self._new_optimizer()
        self.best_val, self.best_state = -1.0, None
        self.val_best: list[float] = []      # best validation accuracy of each finished layer

    def _new_optimizer(self) -> None:
        self.params = list(self.layers[self.k].parameters())
        self.opt = self.ctx.optimizer(self.params)
        # one low-rank state per layer: its error memory belongs to that layer's parameters
        r = self.options.grad_rank
        self.lowrank = (LowRankReducer([q.shape for q in self.params], r,
                                        stream_seed(self.ctx.seed, f"retexo.lowrank/{self.k}"))
                        if r else None)

    def _enter(self, k: int, h: Tensor | Lazy) -> None:
        """Start layer ``k`` on frozen input ``h``: aggregate once, fresh Adam."""
        # the previous layer's aggregates go before this layer's are made
        self.k, self.round, self.h, self.h_next, self.pre = k, 0, h, None, None
        self.pre = self._precompute(k, h)
        self._new_optimizer()
        self.best_val, self.best_state = -1.0, None

    def _precompute(self, k: int, h: Tensor | Lazy) -> Pre:
        if isinstance(h, Lazy):
            prev = self.layers[h.layer]
            return self.layers[k].precompute(h.z, self.adj, lean=True,
                                             rowmap=lambda a: prev.next_rows(a, h.mode))
        return self.layers[k].precompute(h, self.adj, lean=self.options.lean)

    def _lazy_after(self, k: int) -> bool:
        """Whether ``h_{k+1}`` travels and stays as layer ``k``'s aggregates (``Lazy``): lean,
        and the aggregates are narrower than ``h_{k+1}``. Not after layer 0 under a residency
        level: its aggregates are of raw features."""
        layer = self.layers[k]
        width = self.ctx.part.num_classes if self.options.embed == "logits" else layer.out_dim
        return (self.options.lean and layer.in_dim < width
                and (k > 0 or self.ctx.comm.residency == "none"))

    def _first_input(self) -> Tensor:
        """Layer 0's frozen input: the features with their halo rows, fetched from the peers,
        or, under a residency level, zeros in the halo rows (raw features stay home)."""
        p = self.ctx.part
        h = to_device(p.x, self.ctx.device)
        if p.n_halo:     # the halo rows are received into one buffer after the own ones
            h = h.new_empty((p.n_own + p.n_halo,) + tuple(h.shape[1:]))
            h[: p.n_own] = p.x
        if self.ctx.comm.residency == "none":
            return self.exchanger.fill_halo(h, Traffic.FEATURES)
        h[p.n_own:] = 0
        return h

    # ------------------------------------------------------------------ training
    def finished(self) -> bool:
        return self.h is not None and self.k == len(self.R) - 1 and self.round == self.R[-1]

    def train_epoch(self, epoch: int) -> EpochResult:
        if self.finished():
            raise RuntimeError(f"retexo: the schedule ({self.R} rounds per layer) is complete; "
                               f"nothing left to train in epoch {epoch}")
        if self.h is None:
            self._enter(0, self._first_input())
        elif self.round == self.R[self.k]:
            self._enter(self.k + 1, self.h_next)
        loss, val_acc = self._round()
        self.round += 1
        if self.round == self.R[self.k]:
            self._finish_layer()
        return EpochResult(loss=loss, extra={"layer": self.k, "layer_round": self.round,
                                             "round_val_acc": val_acc,
                                             "layer_best_val": self.best_val})

    def _round(self) -> tuple[float, float]:
        """One full-batch step of layer ``k``; returns (global loss, global validation accuracy
        of the parameters the round started from)."""
        layer = self.layers[self.k]
        val = torch.tensor([self._val_correct()], device=self.ctx.device)
        layer.train()
        self.opt.zero_grad(set_to_none=True)
        loss = None
        for r in self._row_chunks(self.train_rows.numel()):   # gradients add up over slices
            logits = layer(self.pre, self.train_rows[r])
            # sum / global count: summed over ranks this is the global mean (local-share weights)
            piece = F.cross_entropy(logits, self.y_train[r], reduction="sum") / \
                self.ctx.part.num_train_global
            piece.backward()
            loss = piece.detach() if loss is None else loss + piece.detach()
        global_loss = sync_gradients(self.ctx.comm, self.params, loss, extra=val,
                                     bits=self.options.grad_bits, lowrank=self.lowrank)
        acc = self._consider(float(val[0]))    # before the step: val is of these parameters
        self.opt.step()
        return global_loss, acc

    @torch.no_grad()
    def _val_correct(self) -> float:
        """Local validation nodes the current layer-k model classifies correctly."""
        if not self.val_rows.numel():
            return 0.0
        layer = self.layers[self.k]
        was = layer.training
        layer.eval()
        correct = 0
        try:
            for r in self._row_chunks(self.val_rows.numel()):
                pred = layer(self.pre, self.val_rows[r]).argmax(-1)
                correct += int((pred == self.y_val[r]).sum())
        finally:
            layer.train(was)
        return float(correct)

    def _row_chunks(self, n: int) -> list[slice]:
        """Rows ``0..n`` at once, or with ``lean`` in slices whose activations are a few MB
        (a layer's step over every training row holds several ``[n_train, hidden]`` arrays:
        gigabytes at 10^8 edges)."""
        if not self.options.lean or n == 0:
            return [slice(0, n)]
        layer = self.layers[self.k]
        step = max(1, lean_module._SLICE // max(layer.in_dim, layer.out_dim))
        return [slice(a, min(n, a + step)) for a in range(0, n, step)]

    @torch.no_grad()
    def _logits(self) -> Tensor:
        """The current layer's logits of every owned row (eval mode set by the caller)."""
        layer, n = self.layers[self.k], self.ctx.part.n_own
        chunks = self._row_chunks(n)
        if len(chunks) == 1:
            return layer(self.pre)
        out = torch.empty((n, self.ctx.part.num_classes), device=self.ctx.device)
        for r in chunks:
            out[r] = layer(self.pre, r)
        return out

    def _consider(self, correct: float) -> float:
        """Keep the current parameters if their global validation accuracy is the best yet."""
        n = self.ctx.part.num_val_global
        if n <= 0:
            return float("nan")     # no validation set: the last parameters are kept
        acc = correct / n
        if acc > self.best_val:
            self.best_val = acc
            self.best_state = {k: v.detach().clone()
                               for k, v in self.layers[self.k].state_dict().items()}
        return acc

    def _finish_layer(self) -> None:
        """Validate the last step, restore the best parameters, exchange ``h_{k+1}``."""
        layer, comm = self.layers[self.k], self.ctx.comm
        if self.ctx.part.num_val_global > 0:
            t = torch.tensor([self._val_correct()], dtype=torch.float64, device=self.ctx.device)
            comm.all_reduce(t, "val_counts", carries=Traffic.CONTROL)
            self._consider(float(t[0]))
        if self.best_state is not None:
            layer.load_state_dict(self.best_state)
        self.val_best.append(self.best_val)
        if self.k < len(self.R) - 1 and self._lazy_after(self.k):
            # the aggregates, whose every row the next layer maps to h_{k+1} where it reads it
            p, a = self.ctx.part, self.pre.t[0]
            z = a.new_empty((p.n_own + p.n_halo, a.shape[1]))
            z[: p.n_own] = a
            self.h_next = Lazy(self.exchanger.fill_halo(
                z, Traffic.FEATURES if self.k == 0 else Traffic.EMBEDDINGS), self.k,
                self.options.embed)
        elif self.k < len(self.R) - 1:
            # computed straight into the exchange's buffer: h_{k+1} is never held twice
            p = self.ctx.part
            width = p.num_classes if self.options.embed == "logits" else layer.out_dim
            h = self.pre.t[0].new_empty((p.n_own + p.n_halo, width))
            layer.next_input(self.pre, self.options.embed, out=h[: p.n_own])
            self.h_next = self.exchanger.fill_halo(h, Traffic.EMBEDDINGS)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        if self.pre is None:
            raise RuntimeError("retexo: evaluate() before the first round (nothing trained yet)")
        layer = self.layers[self.k]
        return global_evaluate(layer, self.ctx.part, self.ctx.comm, self._logits)

    def export_model(self) -> Optional[GNN]:
        """Once the last layer trains, what :meth:`evaluate` scores is the end-to-end stack
        ``conv_k -> [LN ->] ReLU`` of every layer's best parameters (the heads only served
        training): a :class:`GNN`. Before that (a prefix with a head), or with
        ``embed='logits'`` (layer k+1 reads layer k's head), it is not one: None."""
        m = self.ctx.model_cfg
        if self.h is None or self.k != len(self.R) - 1 or self.options.embed != "hidden":
            return None
        gnn = GNN(m.arch, self.layers[0].in_dim, m.hidden, self.ctx.part.num_classes, m.layers,
                  m.dropout, "layer" if self.layer_norm else "none", m.heads)
        for i, layer in enumerate(self.layers):
            gnn.convs[i].load_state_dict(layer.conv.state_dict())
            if i < len(self.layers) - 1:
                gnn.norms[i].load_state_dict(layer.norm.state_dict())
        return gnn

    def run_report(self) -> dict[str, Any]:
        return {"schedule": list(self.R), "embed": self.options.embed,
                "layer_norm": self.layer_norm,
                "layers_done": len(self.val_best), "layer_best_val": list(self.val_best),
                "params_per_layer": [sum(p.numel() for p in m.parameters())
                                     for m in self.layers],
                "exchange_widths": [self.layers[0].in_dim] + [
                    self.layers[k].in_dim if self._lazy_after(k) else self.layers[k + 1].in_dim
                    for k in range(len(self.layers) - 1)]}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        # layer 0's frozen input is the raw features: under a residency level they must not
        # reach the run directory (shared by every host), and they are rebuilt from the
        # rank's own part without any traffic (_first_input), so the checkpoint names them
        raw = self.k == 0 and self.h is not None and self.ctx.comm.residency != "none"
        return {"schedule": list(self.R), "k": self.k, "round": self.round,
                "layers": self.layers.state_dict(), "optimizer": self.opt.state_dict(),
                "best_val": self.best_val, "best_state": self.best_state,
                "val_best": list(self.val_best), "h": "input" if raw else _pack(self.h),
                "h_next": _pack(self.h_next),
                "lowrank": self.lowrank.state_dict() if self.lowrank else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["schedule"]) != self.R:
            raise ValueError(f"retexo: the checkpoint's schedule is {state['schedule']} rounds "
                             f"per layer, this run's is {self.R}; resume with the same "
                             f"options.rounds_per_layer and model.layers")
        self.layers.load_state_dict(state["layers"])
        self.k, self.round = int(state["k"]), int(state["round"])
        dev = self.ctx.device   # a checkpoint is read to host memory
        self.h = self._first_input() if isinstance(state["h"], str) else _unpack(state["h"], dev)
        self.h_next = _unpack(state["h_next"], dev)
        # the aggregates are a deterministic local function of h: recomputed, not stored
        self.pre = None if self.h is None else self._precompute(self.k, self.h)
        self._new_optimizer()
        self.opt.load_state_dict(state["optimizer"])
        if self.lowrank is not None:
            self.lowrank.load_state_dict(state.get("lowrank"))
        self.best_val, self.best_state = float(state["best_val"]), state["best_state"]
        self.val_best = list(state["val_best"])
