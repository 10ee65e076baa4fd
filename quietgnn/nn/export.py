"""The model out of a run: ``model.json`` + ``model.pt`` in the run directory, loaded back as a
plain module that predicts from PyG inputs, and converted to PyG layers.

Every run writes (rank 0, at the end; :class:`~quietgnn.runtime.trainer.Trainer`):

* ``model.json`` - the architecture (``GNN(**spec)``: kind, dims, layers, dropout, norm,
  heads) and which weights these are (``epoch``, ``val_acc``, ``selected``: ``best_val`` or
  ``last`` when no validation set scored any);
* ``model.pt`` - the ``state_dict`` of those weights, tensors only: it is read with
  ``torch.load(weights_only=True)``, so a file crafted to run code is refused, not unpickled.

:class:`TrainedModel` runs on any graph given as PyG's ``(x, edge_index)``: messages flow
source -> target (``edge_index[0] -> edge_index[1]``); give both directions of an undirected
graph, as PyG datasets do. As in training, self-loops and repeated edges are dropped (the
layers add the self-loop they need) and GCN normalises with the in-degrees of the graph given.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..graph import csr_from_edges
from ..serial import loads_json
from .adj import SparseAdj
from .model import GNN, ModelConfig

__all__ = ["TrainedModel", "PyGModel", "adj_from_edge_index", "save_model", "load_model",
           "MODEL_JSON", "MODEL_PT"]

MODEL_JSON, MODEL_PT = "model.json", "model.pt"
_FORMAT = 1


def adj_from_edge_index(edge_index: Tensor, num_nodes: int) -> SparseAdj:
    """The whole-graph block of a PyG ``[2, E]`` edge list (source, target), without self-loops
    or repeated edges, degrees = in-degrees (the normalisation training used)."""
    ei = torch.as_tensor(edge_index)
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype.is_floating_point:
        raise ValueError(f"edge_index has shape {tuple(ei.shape)} and dtype {ei.dtype}; expected "
                         f"an integer [2, num_edges] tensor (source row, target row), as in PyG")
    ei = ei.to(torch.int64)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= num_nodes):
        bad = int(ei.min()) if int(ei.min()) < 0 else int(ei.max())
        raise ValueError(f"edge_index holds node id {bad}, outside [0, {num_nodes}) where "
                         f"{num_nodes} is the number of rows of x")
    keep = ei[0] != ei[1]
    indptr, indices = csr_from_edges(ei[0][keep], ei[1][keep], num_nodes)
    deg = indptr[1:] - indptr[:-1]
    return SparseAdj(indptr, indices, num_nodes, deg, deg)


class TrainedModel(nn.Module):
    """A trained :class:`~quietgnn.nn.GNN` behind PyG's calling convention, in eval mode.

    ``model(x, edge_index)`` -> logits ``[N, C]``; :meth:`predict_proba` -> softmax;
    :meth:`embed` -> the last hidden layer ``[N, hidden]``; :meth:`to_pyg` -> the same network
    built from ``torch_geometric.nn`` layers. ``gnn`` is the quietgnn module itself and
    ``info`` what ``model.json`` said (epoch, validation accuracy, strategy, dataset)."""

    def __init__(self, gnn: GNN, info: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        self.gnn = gnn
        self.info = dict(info or {})
        self.eval()

    def _inputs(self, x: Tensor, edge_index: Tensor) -> tuple[Tensor, SparseAdj]:
        x = torch.as_tensor(x)
        if x.dim() != 2 or x.shape[1] != self.gnn.dims[0]:
            raise ValueError(f"x has shape {tuple(x.shape)}; this model takes [num_nodes, "
                             f"{self.gnn.dims[0]}] features (the width of the graph it was "
                             f"trained on)")
        x = x.float()
        finite = torch.isfinite(x).all(dim=1)
        if not bool(finite.all()):
            # message passing spreads a NaN to every node within the model's reach
            raise ValueError(f"x holds NaN/Inf values (first in node "
                             f"{int((~finite).nonzero()[0])}); the predictions of its "
                             f"neighbourhood would be NaN: clean or impute those features first")
        return x, adj_from_edge_index(edge_index, int(x.shape[0]))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Class logits of every node."""
        h, adj = self._inputs(x, edge_index)
        return self.gnn(h, adj)

    @torch.no_grad()
    def predict_proba(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Per-node class probabilities (rows sum to 1)."""
        return F.softmax(self(x, edge_index), dim=-1)

    @torch.no_grad()
    def embed(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """The last hidden layer (after its norm and ReLU): what the output layer reads."""
        if self.gnn.num_layers < 2:
            raise ValueError("embed: a 1-layer model has no hidden layer; train with "
                             "model.layers >= 2 or use the class probabilities")
        h, adj = self._inputs(x, edge_index)
        was = self.gnn.training
        self.gnn.eval()
        try:
            for i in range(self.gnn.num_layers - 1):
                h = self.gnn.block(i, h, adj)
        finally:
            self.gnn.train(was)
        return h

    def to_pyg(self) -> "PyGModel":
        """The same network from ``torch_geometric.nn`` layers (``GCNConv``, ``SAGEConv``,
        ``GATConv``, ``GINConv``) with these weights: ``to_pyg()(x, edge_index)`` equals
        ``self(x, edge_index)`` up to float rounding."""
        return PyGModel.from_gnn(self.gnn)


class PyGModel(nn.Module):
    """A layer stack of ``torch_geometric.nn`` convolutions run as :class:`GNN` runs its own:
    ``dropout -> conv -> (norm, ReLU unless last)``. Build it with :meth:`from_gnn`."""

    def __init__(self, convs: list[nn.Module], norms: nn.ModuleList, dropout: float) -> None:
        super().__init__()
        self.convs, self.norms, self.dropout = nn.ModuleList(convs), norms, float(dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(F.dropout(h, self.dropout, self.training), edge_index)
            if i < len(self.convs) - 1:
                h = F.relu(self.norms[i](h))
        return h

    @classmethod
    @torch.no_grad()
    def from_gnn(cls, gnn: GNN) -> "PyGModel":
        from torch_geometric import nn as pyg
        convs: list[nn.Module] = []
        for conv in gnn.convs:
            d_in, d_out = conv.in_dim, conv.out_dim
            if gnn.arch == "gcn":      # D^-1/2 (A + I) D^-1/2 h W + b, in-degrees: PyG's defaults
                c = pyg.GCNConv(d_in, d_out, add_self_loops=True, normalize=True)
                c.lin.weight.copy_(conv.lin.weight)
                c.bias.copy_(conv.bias)
            elif gnn.arch == "sage":   # lin_l (with bias) on the mean, lin_r on the root: PyG's
                c = pyg.SAGEConv(d_in, d_out, aggr="mean", root_weight=True)
                c.load_state_dict(conv.state_dict())
            elif gnn.arch == "gin":    # MLP((1 + eps) h + sum), eps learnt
                c = pyg.GINConv(copy.deepcopy(conv.mlp), train_eps=True)
                c.nn.load_state_dict(conv.mlp.state_dict())   # PyG re-initialises its nn
                c.eps.copy_(conv.eps)
            elif gnn.arch == "gat":    # heads over in-neighbours and the node itself
                H, D = conv.heads, conv.head_dim
                c = pyg.GATConv(d_in, D, heads=H, concat=conv.concat,
                                negative_slope=conv.negative_slope, add_self_loops=True)
                c.lin.weight.copy_(conv.lin.weight)
                c.att_src.copy_(conv.att_src.view(1, H, D))
                c.att_dst.copy_(conv.att_dst.view(1, H, D))
                c.bias.copy_(conv.bias)
            else:
                raise ValueError(f"to_pyg: no PyG layer for model kind {gnn.arch!r}")
            convs.append(c)
        out = cls(convs, copy.deepcopy(gnn.norms), gnn.dropout)
        return out.train(gnn.training)


# ---------------------------------------------------------------------- files
def save_model(run_dir: str | os.PathLike, spec: dict[str, Any], state: dict[str, Tensor],
               info: dict[str, Any]) -> Path:
    """Write ``model.pt`` (tensors only) then ``model.json`` into ``run_dir``, each through a
    temporary file and a rename, so a reader never finds half a model; a failed write (a full
    disk) leaves no temporary file and raises ``safefiles.WriteError`` naming the file."""
    from ..safefiles import atomic_write
    from ..serial import save_bytes
    run_dir = Path(run_dir)
    pt, js = run_dir / MODEL_PT, run_dir / MODEL_JSON
    atomic_write(pt, save_bytes({k: v.detach().cpu() for k, v in state.items()}, "model"))
    atomic_write(js, json.dumps({"format": _FORMAT, "kind": "gnn", "spec": spec, **info},
                                indent=1).encode())
    return pt


def _check_spec(spec: Any) -> None:
    """The architecture a ``model.json`` names, checked as a run's ``model.*`` keys are (a
    file edited to ``hidden: -1`` fails here, not inside torch)."""
    if not isinstance(spec, dict):
        raise ValueError(f"spec is {type(spec).__name__}, expected a mapping")
    ModelConfig(**{k: spec[k] for k in ("arch", "hidden", "layers", "dropout", "norm", "heads")
                   if k in spec})
    for k in ("in_dim", "out_dim"):
        if not isinstance(spec.get(k), int) or isinstance(spec[k], bool) or spec[k] < 1:
            raise ValueError(f"spec.{k} = {spec.get(k)!r}, expected an int >= 1")


def load_model(run_dir: str | os.PathLike) -> TrainedModel:
    """The model a run wrote (:func:`save_model`), ready to predict (eval mode, CPU). Its files
    are read as regular files of the run directory, never through a link planted there."""
    from ..safefiles import open_no_follow
    from ..serial import load_file
    run_dir = Path(run_dir)
    js, pt = run_dir / MODEL_JSON, run_dir / MODEL_PT
    if not os.path.lexists(js) or not os.path.lexists(pt):
        raise ValueError(f"{str(run_dir)!r} holds no trained model ({MODEL_JSON} and {MODEL_PT} "
                         f"are written at the end of every run); pass the directory of a "
                         f"finished run, e.g. runs/<time>-<strategy>-<dataset>-p<P>")
    with open_no_follow(js) as f:
        raw = f.read()
    try:
        meta = loads_json(raw)
        spec = meta["spec"]
        _check_spec(spec)
        gnn = GNN(**spec)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{str(js)!r} is not a model description quietgnn wrote ({exc}); "
                         f"expected keys format, kind, spec") from None
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{str(js)!r} has format {meta.get('format')!r}; this quietgnn reads "
                         f"format {_FORMAT}")
    with open_no_follow(pt) as f:
        state = load_file(pt, "model weights", "pass the model.pt a run wrote", src=f)
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"model weights {str(pt)!r} are not a state_dict (a mapping of names to "
                         f"tensors); pass the model.pt a run wrote")
    # training stops before a step that would make a weight NaN/Inf, so such a file was damaged
    # or edited; its model would predict NaN for every node (and a run would exit 0)
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise ValueError(f"model weights {str(pt)!r} hold NaN/Inf values (in {bad[0]!r}"
                         f"{f' and {len(bad) - 1} more tensor(s)' if len(bad) > 1 else ''}), "
                         f"so every prediction would be NaN; the file is damaged or was "
                         f"edited: pass the model.pt a run wrote, or train again")
    try:
        gnn.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"model weights {str(pt)!r} do not fit {str(js)!r} ({first}); the two "
                         f"files come from different runs") from None
    return TrainedModel(gnn, {k: v for k, v in meta.items() if k not in ("format", "spec")})
