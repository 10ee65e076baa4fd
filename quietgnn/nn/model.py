"""The model stack: ``L`` conv layers with dropout / norm / ReLU between them.

``GNN.forward(x, adjs, exchange)`` runs layer by layer:

    h = dropout(h); h = exchange(h, l); h = conv_l(h, adj_l); (norm, ReLU unless last)

``x`` is dense, or :class:`~quietgnn.nn.sparse.SparseFeatures` on a whole graph (mostly-zero
input features: dropout and the first transform touch only the non-zeros).
``exchange`` is how distribution enters the model: ``None`` on a whole graph; a
:class:`~quietgnn.comm.HaloExchanger` that appends the halo rows in ``halo``. Dropout is
applied *before* the exchange, so a hidden row's mask is applied once, by its owner; with a
``dropout_key`` the masks are keyed by (key, layer, global node, column)
(:mod:`~quietgnn.nn.keyed`), so input rows a rank holds for its halo (fetched once, layer 0
then exchanges nothing) are dropped exactly as their owner would drop them.
An exchanger that declares ``skips_dropped`` is then told the rate and key and sends only
the kept entries (both ends can recompute the mask). One that declares ``drops_rows`` gets the
rows *before* dropout, with the rate and key, and drops ``[owned ; halo]`` itself after the
exchange -- the same masks, so the same numbers -- for exchangers that keep rows across epochs
(a cached row must not carry one epoch's mask).
Layers are reachable one by one (``model.convs[l]``, :meth:`GNN.block`) for strategies that
train them separately (RETEXO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .adj import SparseAdj
from .keyed import keyed_dropout, mix_key
from .layers import CONVS, GATConv
from .sparse import SparseFeatures

__all__ = ["GNN", "ModelConfig", "build_model", "check_model_fits", "MAX_LAYERS",
           "TRAINING_COPIES"]

Exchange = Callable[[Tensor, int], Tensor]

#: more convolutions than any published GNN trains (RevGNN-Deep: 1001); beyond, model.layers
#: is a typo, and a million layers build a million modules before memory could say no
MAX_LAYERS = 4096
#: copies of the weights that training holds: the weights, their gradients, Adam's two moments
TRAINING_COPIES = 4


@dataclass
class ModelConfig:
    """Architecture of the model (``model.*`` keys of a run config)."""

    arch: str = "gcn"       # convolution: gcn | sage | gat | gin
    hidden: int = 64        # width of the hidden layers
    layers: int = 2         # number of graph convolutions
    dropout: float = 0.5    # dropout probability before every convolution
    norm: str = "none"      # none | layer (LayerNorm after hidden convolutions)
    heads: int = 4          # GAT attention heads (hidden must be divisible by it)

    def __post_init__(self) -> None:
        self.arch = str(self.arch).lower()
        if self.arch not in CONVS:
            raise ValueError(f"model.arch = {self.arch!r}; expected one of {sorted(CONVS)}")
        if not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"model.layers = {self.layers!r}; expected an int >= 1")
        _check_layers(self.layers)
        if not isinstance(self.hidden, int) or self.hidden < 1:
            raise ValueError(f"model.hidden = {self.hidden!r}; expected an int >= 1")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"model.dropout = {self.dropout!r}; expected a value in [0, 1)")
        if self.norm not in ("none", "layer"):
            raise ValueError(f"model.norm = {self.norm!r}; expected 'none' or 'layer' (batch norm "
                             f"would need global statistics across partitions)")
        if not isinstance(self.heads, int) or self.heads < 1:
            raise ValueError(f"model.heads = {self.heads!r}; expected an int >= 1")
        if self.arch == "gat" and self.layers > 1 and self.hidden % self.heads:
            raise ValueError(f"model.hidden = {self.hidden} is not divisible by model.heads = "
                             f"{self.heads}; GAT concatenates heads")


def _check_layers(layers: int) -> None:
    if layers > MAX_LAYERS:
        raise ValueError(f"model.layers = {layers!r}; expected at most {MAX_LAYERS} (the deepest "
                         f"published GNNs have about 1000 layers): lower model.layers")


def _layer_weights(arch: str, a: int, b: int) -> int:
    """Weights of one convolution from ``a`` to ``b`` features, its weight matrices only
    (biases, GAT's attention vectors and GIN's eps left out: a lower bound)."""
    return {"sage": 2 * a * b, "gin": a * b + b * b}.get(arch, a * b)


def check_model_fits(arch: str, in_dim: int, hidden: int, out_dim: int, layers: int, *,
                     copies: int = 1, ranks: int = 1) -> None:
    """Refuse (``ValueError``, one line) a model whose weight matrices, ``copies`` times (1 to
    hold the model, :data:`TRAINING_COPIES` to train it), on each of ``ranks`` processes of this
    host, exceed the machine's available memory, before torch tries to allocate them: an absurd
    ``model.hidden`` (or number of classes) otherwise fails deep in an allocation, overflows
    it, or allocates until the kernel kills the run. The message names the dimension to blame."""
    from ..heap import mem_available_mb
    _check_layers(layers)       # before any list of `layers` entries is built
    if layers == 1:
        first, mid, last = _layer_weights(arch, in_dim, out_dim), 0, 0
    else:
        first, last = _layer_weights(arch, in_dim, hidden), _layer_weights(arch, hidden, out_dim)
        mid = (layers - 2) * _layer_weights(arch, hidden, hidden)
    weights = first + mid + last
    need_mb = weights * 4 * copies * ranks / 2**20
    avail = mem_available_mb()
    if need_mb <= avail:
        return
    # blame the width that makes the largest term large: a typo in model.hidden, a graph with
    # too many input features, or labels that are not class ids 0..C-1 (C = largest label + 1)
    if layers == 1:
        blame = "classes" if out_dim >= in_dim else "input"
    elif last >= max(first, mid) and out_dim > hidden:
        blame = "classes"
    elif first >= max(mid, last) and in_dim > hidden:
        blame = "input"
    else:
        blame = "hidden"
    if blame == "classes":
        what = f"{out_dim} classes (the model's output width)"
        fix = ("check the labels: the number of classes is the largest label + 1, so labels "
               "must be class ids 0..C-1, not raw values")
    elif blame == "hidden":
        what = f"model.hidden = {hidden!r}" + (f" with model.layers = {layers}"
                                               if layers > 2 else "")
        fix = "lower model.hidden" + (" or model.layers" if layers > 2 else "")
    else:
        what = f"{in_dim} input features"
        fix = "the input is too wide for this machine: reduce its features" + \
            (" or lower model.hidden" if layers > 1 else "")
    held = "the model" if copies == 1 else \
        f"training (weights, gradients, two Adam moments: {copies} copies)"
    per = f", on each of the {ranks} ranks of this host," if ranks > 1 else ""
    raise ValueError(f"{what}: the model's weight matrices alone are at least {weights:.3g} "
                     f"floats ({weights * 4 / 2**30:.3g} GiB); {held}{per} needs "
                     f"{need_mb / 1024:.3g} GiB, more than the {avail / 1024:.3g} GiB "
                     f"available here; {fix}")


class GNN(nn.Module):
    """``layers`` convolutions of type ``arch`` (see :class:`ModelConfig`)."""

    def __init__(self, arch: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 dropout: float = 0.5, norm: str = "none", heads: int = 4) -> None:
        super().__init__()
        self.arch, self.dropout, self.num_layers = arch, float(dropout), layers
        self.hidden, self.norm_kind, self.heads = hidden, norm, heads
        check_model_fits(arch, in_dim, hidden, out_dim, layers)   # before any allocation
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        convs = []
        for i in range(layers):
            last = i == layers - 1
            if arch == "gat":
                convs.append(GATConv(dims[i], dims[i + 1], heads=1 if last else heads,
                                     concat=not last))
            else:
                convs.append(CONVS[arch](dims[i], dims[i + 1]))
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList(
            [nn.LayerNorm(hidden) if norm == "layer" else nn.Identity() for _ in range(layers - 1)])
        self.dims = dims

    def spec(self) -> dict[str, Any]:
        """The constructor arguments: ``GNN(**model.spec())`` builds the same architecture
        (what a run's ``model.json`` records next to the weights)."""
        return {"arch": self.arch, "in_dim": self.dims[0], "hidden": self.hidden,
                "out_dim": self.dims[-1], "layers": self.num_layers, "dropout": self.dropout,
                "norm": self.norm_kind, "heads": self.heads}

    def block(self, i: int, h: Tensor, adj: SparseAdj) -> Tensor:
        """Layer ``i`` alone on an already-exchanged input: conv (+ norm, ReLU unless last)."""
        h = self.convs[i](h, adj)
        if i < self.num_layers - 1:
            h = F.relu(self.norms[i](h))
        return h

    def forward(self, x: Union[Tensor, SparseFeatures], adjs: Union[SparseAdj, Sequence[SparseAdj]],
                exchange: Optional[Exchange] = None, *, dropout_key: Optional[int] = None,
                ids: Optional[Tensor] = None, ids_in: Optional[Tensor] = None,
                inputs_have_halo: bool = False) -> Tensor:
        """``dropout_key`` (with ``ids``, the global ids of the owned rows): masks keyed by
        (key, layer, node, column) instead of drawn (:mod:`quietgnn.nn.keyed`), identical on
        every rank. ``inputs_have_halo``: ``x`` already holds ``[owned ; halo]`` rows (static
        inputs fetched once; their ids are ``ids_in``), so layer 0 exchanges nothing."""
        h = x
        if isinstance(h, SparseFeatures) and exchange is not None and not inputs_have_halo:
            raise TypeError("sparse input features need the whole graph (no exchange): "
                            "exchange dense rows, or pass x as a dense tensor")
        for i in range(self.num_layers):
            adj = adjs if isinstance(adjs, SparseAdj) else adjs[i]
            exchanging = exchange is not None and not (i == 0 and inputs_have_halo)
            late = self._known_zeros(h, i, dropout_key, ids) \
                if exchanging and getattr(exchange, "drops_rows", False) else None
            if late is not None:   # the exchanger drops [owned ; halo] after it (same masks)
                h = exchange(h, i, drop=late)
            else:
                h = self._dropout(h, i, dropout_key, ids_in if i == 0 and ids_in is not None
                                  else ids)
                if exchanging:
                    keep = self._known_zeros(h, i, dropout_key, ids) \
                        if getattr(exchange, "skips_dropped", False) else None
                    h = exchange(h, i, keep=keep) if keep is not None else exchange(h, i)
            h = self.block(i, h, adj)
        return h

    def _known_zeros(self, h: Union[Tensor, SparseFeatures], layer: int, key: Optional[int],
                     ids: Optional[Tensor]) -> Optional[tuple[float, int]]:
        """(rate, key) of the keyed dropout just applied to ``h`` when the receiving ranks can
        recompute its mask, so the exchange need not send the dropped entries."""
        if not (self.training and self.dropout > 0.0 and key is not None and ids is not None
                and isinstance(h, Tensor)):
            return None
        return self.dropout, mix_key(key, layer)

    def _dropout(self, h: Union[Tensor, SparseFeatures], layer: int, key: Optional[int],
                 ids: Optional[Tensor]) -> Union[Tensor, SparseFeatures]:
        if not self.training or self.dropout == 0.0:
            return h
        if key is not None and ids is not None:
            k = mix_key(key, layer)
            if isinstance(h, SparseFeatures):
                return h.dropout(self.dropout, True, key=k, ids=ids)
            return keyed_dropout(h, self.dropout, k, ids)
        return h.dropout(self.dropout, True) if isinstance(h, SparseFeatures) else \
            F.dropout(h, self.dropout, True)


def build_model(cfg: ModelConfig, in_dim: int, out_dim: int, seed: int,
                copies: int = TRAINING_COPIES) -> GNN:
    """Build the model with weights drawn from ``seed`` alone, so every rank that calls this
    with the same arguments holds identical weights without any communication. ``copies``:
    how many copies of the weights this process will hold in host memory (to train on the
    CPU: weights, gradients and Adam's moments; 1 when they live on a GPU)."""
    # This rank's own copies against what is available now. Not the host's ranks together
    # (the launcher counts those before any rank starts): by now the siblings' data and models
    # are loaded, so counting them again refused on some ranks only, near the limit.
    check_model_fits(cfg.arch, in_dim, cfg.hidden, out_dim, cfg.layers, copies=copies)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return GNN(cfg.arch, in_dim, cfg.hidden, out_dim, cfg.layers, cfg.dropout, cfg.norm,
                   cfg.heads)
    finally:
        torch.random.set_rng_state(state)
