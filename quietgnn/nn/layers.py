"""GCN, GraphSAGE, GAT and GIN layers over a :class:`~quietgnn.nn.adj.SparseAdj` block.

Every layer maps ``h [n_src, d_in] -> [n_dst, d_out]``; the destination's own row is
``h[:n_dst]``. Layers never modify their inputs and hold no per-graph state (normalisation
weights are cached on the adjacency block, not on the layer), so one layer object runs on a
whole graph, on a partition with halo, and on a sampled block alike.

The first layer may get its input as :class:`~quietgnn.nn.sparse.SparseFeatures` (mostly-zero
features, whole graph): GCN and SAGE then transform it first with one sparse product, the
other layers densify it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .adj import SparseAdj, spmm
from .sparse import SparseFeatures

Features = Tensor | SparseFeatures   # a layer's input: dense, or sparse input features

__all__ = ["GCNConv", "SAGEConv", "GATConv", "GINConv", "CONVS"]


class GCNConv(nn.Module):
    """Kipf & Welling: ``out = D^-1/2 (A + I) D^-1/2 h W + b`` with global degrees.

    When the layer narrows (d_out < d_in) it transforms before aggregating: the same result
    with a cheaper sparse product."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, h: Features, adj: SparseAdj) -> Tensor:
        ew, sw = adj.gcn_norm(h.dtype)
        if isinstance(h, SparseFeatures) or self.out_dim < self.in_dim:
            h = h.linear(self.lin.weight) if isinstance(h, SparseFeatures) else self.lin(h)
            out = spmm(adj, ew, h) + sw[:, None] * h[: adj.n_dst]
        else:
            out = self.lin(spmm(adj, ew, h) + sw[:, None] * h[: adj.n_dst])
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}"


class SAGEConv(nn.Module):
    """Hamilton et al.: ``out = W_r h_v + W_l mean_{u in N(v)} h_u``."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin_l = nn.Linear(in_dim, out_dim, bias=bias)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, h: Features, adj: SparseAdj) -> Tensor:
        w = adj.mean_norm(h.dtype)
        if isinstance(h, SparseFeatures):
            # both transforms in one pass over the non-zeros
            z = h.linear(torch.cat([self.lin_l.weight, self.lin_r.weight]))
            agg = spmm(adj, w, z[:, : self.out_dim])
            if self.lin_l.bias is not None:
                agg = agg + self.lin_l.bias
            return agg + z[: adj.n_dst, self.out_dim:]
        if self.out_dim < self.in_dim:  # transform first: the sparse product runs on d_out columns
            agg = spmm(adj, w, F.linear(h, self.lin_l.weight))
            if self.lin_l.bias is not None:
                agg = agg + self.lin_l.bias
        else:
            agg = self.lin_l(spmm(adj, w, h))
        return agg + self.lin_r(h[: adj.n_dst])

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}"


class GINConv(nn.Module):
    """Xu et al.: ``out = MLP((1 + eps) h_v + sum_{u in N(v)} h_u)`` (eps learnable)."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.eps = nn.Parameter(torch.zeros(1))
        self.mlp = nn.Sequential(nn.Linear(in_dim, out_dim, bias=bias), nn.ReLU(),
                                 nn.Linear(out_dim, out_dim, bias=bias))

    def forward(self, h: Features, adj: SparseAdj) -> Tensor:
        if isinstance(h, SparseFeatures):
            h = h.to_dense()
        return self.mlp((1 + self.eps) * h[: adj.n_dst] + spmm(adj, None, h))

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}"


class GATConv(nn.Module):
    """Velickovic et al.: attention over in-neighbours and the node itself.

    ``heads`` heads of width ``out_dim // heads`` concatenated (``concat=True``) or of width
    ``out_dim`` averaged (``concat=False``, used for the output layer)."""

    def __init__(self, in_dim: int, out_dim: int, heads: int = 4, concat: bool = True,
                 negative_slope: float = 0.2, bias: bool = True) -> None:
        super().__init__()
        if concat and out_dim % heads:
            raise ValueError(f"GAT: width {out_dim} is not divisible by heads = {heads}; choose "
                             f"a hidden size that is a multiple of the number of heads")
        self.in_dim, self.out_dim, self.heads, self.concat = in_dim, out_dim, heads, concat
        self.head_dim = out_dim // heads if concat else out_dim
        self.lin = nn.Linear(in_dim, heads * self.head_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, self.head_dim))
        self.att_dst = nn.Parameter(torch.empty(heads, self.head_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None
        self.negative_slope = negative_slope
        nn.init.xavier_uniform_(self.lin.weight)
        bound = math.sqrt(6.0 / (1 + self.head_dim))
        nn.init.uniform_(self.att_src, -bound, bound)
        nn.init.uniform_(self.att_dst, -bound, bound)

    def forward(self, h: Features, adj: SparseAdj) -> Tensor:
        if isinstance(h, SparseFeatures):
            h = h.to_dense()
        a = adj.with_self_loops()
        H, D = self.heads, self.head_dim
        z = self.lin(h).view(-1, H, D)                            # [n_src, H, D]
        s_src = (z * self.att_src).sum(-1)                        # [n_src, H]
        s_dst = (z[: a.n_dst] * self.att_dst).sum(-1)             # [n_dst, H]
        row = a.row()
        e = F.leaky_relu(s_src[a.indices] + s_dst[row], self.negative_slope)   # [E, H]
        # softmax over each destination's entries (max-shifted for stability)
        emax = torch.full((a.n_dst, H), float("-inf"), dtype=e.dtype, device=e.device)
        emax = emax.scatter_reduce(0, row[:, None].expand(-1, H), e.detach(), "amax")
        ex = (e - emax[row]).exp()
        denom = torch.zeros(a.n_dst, H, dtype=e.dtype, device=e.device).index_add(0, row, ex)
        alpha = ex / denom[row]
        outs = [spmm(a, alpha[:, k].contiguous(), z[:, k]) for k in range(H)]
        out = torch.cat(outs, dim=-1) if self.concat else torch.stack(outs).mean(0)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, heads={self.heads}, concat={self.concat}"


CONVS = {"gcn": GCNConv, "sage": SAGEConv, "gat": GATConv, "gin": GINConv}
