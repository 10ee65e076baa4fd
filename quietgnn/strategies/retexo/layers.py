"""One RETEXO layer: a convolution trained on its own, over frozen, pre-aggregated inputs.

Layer ``k`` of a RETEXO model is a small model of its own (Kolluri et al., arXiv 2302.13053)::

    hidden layer (k < L-1):  logits = head(dropout(ReLU(LN(conv_k(h_k)))))   head: Linear -> C
                             (LN optional; h_{k+1} = ReLU(LN(conv_k(h_k))), no dropout)
    last layer   (k = L-1):  logits = conv_k(h_k)

Its input ``h_k`` is frozen while it trains, so for GCN, GraphSAGE and GIN the neighbourhood
aggregation of ``h_k`` is computed **once** (:meth:`RetexoLayer.precompute`) and every training
step is a dense map of the cached aggregates, i.e. no sparse product per step. GAT's attention
depends on the parameters, so it is recomputed every step over the cached neighbour rows (still
local: the halo rows of ``h_k`` were exchanged once).

Shapes (``n_src = n_own + n_halo`` rows of ``h_k``, ``n_dst = n_own``; ``rows`` selects destination
rows, e.g. the local training nodes)::

    precompute(h [n_src, d_in], adj) -> Pre        (a tuple of [n_dst, d_in] tensors; GAT: h)
    forward(pre, rows) -> logits [len(rows), C]
    next_input(pre, mode) -> h_{k+1} [n_dst, d_out]  ('hidden': ReLU(LN(conv)); 'logits': C)

The arithmetic equals the layers of :mod:`quietgnn.nn.layers` (``conv.forward(h, adj)``) up to
float rounding; dropout is applied to the cached aggregates (GCN/SAGE/GIN) or to ``h`` (GAT),
since dropping inputs before a precomputed aggregation is not possible, and in hidden layers
also to the head's input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...nn import SparseAdj
from ...nn.adj import spmm_rows
from ...nn.layers import CONVS, GATConv
from ...nn.lean import propagate_input, propagate_rowwise
from ...seeds import stream_seed

__all__ = ["RetexoLayer", "build_layers", "Pre", "Lazy"]

#: values per slice of rows in the maps over every owned row (the GCN self-loop term,
#: :meth:`RetexoLayer.next_input` into a buffer): their temporaries are a few tens of MB
#: however large the partition, not extra [n_own, d] arrays
SLICE_VALUES = 1 << 24


def row_slices(n: int, width: int) -> list[slice]:
    """Consecutive row ranges of ``0..n`` with about :data:`SLICE_VALUES` entries of ``width``
    each."""
    step = max(1, SLICE_VALUES // max(1, width))
    return [slice(a, min(n, a + step)) for a in range(0, n, step)]


@dataclass(frozen=True)
class Pre:
    """Cached, parameter-free inputs of one layer: ``t`` = the aggregates (GCN: ``(A_hat h,)``;
    SAGE: ``(mean_N h, h_self)``; GIN: ``(h_self, sum_N h)``; GAT: ``(h,)``), and for GAT the
    block ``adj`` its attention runs over every step."""

    t: tuple[Tensor, ...]
    adj: Optional[SparseAdj] = None


@dataclass(frozen=True)
class Lazy:
    """A frozen input ``h_{k+1}`` that is not held (``options.lean``): ``z`` ``[n_own + n_halo,
    d_k]`` is layer ``layer``'s aggregates of every row (its own, and the halo's as their
    owners computed them), and ``h_{k+1} = layers[layer].next_rows(z, mode)`` row by row."""

    z: Tensor
    layer: int
    mode: str


class RetexoLayer(nn.Module):
    """Layer ``k`` with its training head (see the module docstring)."""

    def __init__(self, arch: str, in_dim: int, out_dim: int, num_classes: int, last: bool,
                 heads: int = 4, dropout: float = 0.5, layer_norm: bool = True) -> None:
        super().__init__()
        if arch not in CONVS:
            raise ValueError(f"retexo: model.arch = {arch!r}; expected one of {sorted(CONVS)}")
        self.arch, self.last, self.dropout = arch, last, float(dropout)
        self.in_dim, self.out_dim = in_dim, out_dim
        if arch == "gat":
            self.conv: nn.Module = GATConv(in_dim, out_dim, heads=1 if last else heads,
                                           concat=not last)
        else:
            self.conv = CONVS[arch](in_dim, out_dim)
        if not last:
            self.norm: nn.Module = nn.LayerNorm(out_dim) if layer_norm else nn.Identity()
            self.head: Optional[nn.Module] = nn.Linear(out_dim, num_classes)
        else:
            self.head = None

    # ------------------------------------------------------------------ the cached inputs
    @torch.no_grad()
    def precompute(self, h: Tensor, adj: SparseAdj, lean: bool = False,
                   rowmap: Optional[Callable[[Tensor], Tensor]] = None) -> Pre:
        """The parameter-free part of the convolution over frozen ``h`` (once per layer).

        ``lean`` (GCN): the aggregation runs a slice of rows at a time with each slice's
        weights formed when used (:mod:`quietgnn.nn.lean`; ``h`` may be float16), and with
        ``rowmap`` the frozen input is ``rowmap(h)`` -- a row-wise map of narrower rows ``h``,
        applied to the rows each slice gathers, so the wide input is never held."""
        n = adj.n_dst
        if lean:
            if self.arch != "gcn":
                raise ValueError(f"retexo: the lean aggregation needs model.arch gcn, not "
                                 f"{self.arch!r}")
            if rowmap is not None:
                return Pre((propagate_rowwise(adj, h, rowmap, self.in_dim),))
            return Pre((propagate_input(adj, h),))
        if rowmap is not None:
            raise ValueError("retexo: a row-mapped input needs the lean aggregation")
        if self.arch == "gcn":
            ew, sw = adj.gcn_norm(h.dtype)       # global degrees: equals the whole-graph GCN
            a = spmm_rows(adj, ew, h)
            # the self-loop term added in place, a slice at a time (the same sums as
            # ``a + sw * h``, without two more [n, d] arrays)
            for r in row_slices(n, h.shape[1]):
                a[r] += sw[r, None] * h[r]
            return Pre((a,))
        if self.arch == "sage":
            return Pre((spmm_rows(adj, adj.mean_norm(h.dtype), h), h[:n]))
        if self.arch == "gin":
            return Pre((h[:n], spmm_rows(adj, None, h)))
        return Pre((h,), adj)                    # gat: attention needs the parameters

    # ------------------------------------------------------------------ forward
    def _drop(self, t: Tensor, inplace: bool = False) -> Tensor:
        return F.dropout(t, self.dropout, self.training, inplace)

    def conv_out(self, pre: Pre, rows: Optional[Tensor | slice] = None) -> Tensor:
        """``conv_k(h_k)`` for destination ``rows`` (indices or a slice; all owned rows when
        None)."""
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        # rows given as indices pick a copy of the cached rows, which dropout may overwrite:
        # the same masks and values, one [len(rows), d] array fewer at a time
        own = isinstance(rows, Tensor)
        c, t = self.conv, pre.t
        if self.arch == "gcn":
            out = F.linear(self._drop(pick(t[0]), own), c.lin.weight)
            return out if c.bias is None else out + c.bias
        if self.arch == "sage":
            return c.lin_l(self._drop(pick(t[0]), own)) + c.lin_r(self._drop(pick(t[1]), own))
        if self.arch == "gin":
            return c.mlp((1 + c.eps) * self._drop(pick(t[0]), own) +
                         self._drop(pick(t[1]), own))
        return pick(c(self._drop(t[0]), pre.adj))

    def hidden(self, pre: Pre, rows: Optional[Tensor | slice] = None) -> Tensor:
        z = self.conv_out(pre, rows)
        return z if self.last else F.relu(self.norm(z))

    def forward(self, pre: Pre, rows: Optional[Tensor | slice] = None) -> Tensor:
        """Class logits of destination ``rows`` (the loss of this layer's training)."""
        z = self.hidden(pre, rows)
        # the head stands in for the layers above, and in the end-to-end stack every layer
        # reads its input through dropout: dropping h_{k+1} here keeps the hidden units from
        # co-adapting to one linear read-out (0.2-1.7 points at P = 1 on Cora / CiteSeer)
        return z if self.head is None else self.head(self._drop(z))

    @torch.no_grad()
    def next_rows(self, a: Tensor, mode: str = "hidden") -> Tensor:
        """``h_{k+1}`` of rows whose aggregates are ``a`` (GCN: ``A_hat h_k`` rows, of any
        node: the map is row-wise), as :meth:`next_input` computes it."""
        was = self.training
        self.eval()
        try:
            pre = Pre((a,))
            return self.hidden(pre) if mode == "hidden" else self(pre)
        finally:
            self.train(was)

    @torch.no_grad()
    def next_input(self, pre: Pre, mode: str = "hidden", out: Optional[Tensor] = None
                   ) -> Tensor:
        """``h_{k+1}`` of every owned row (eval mode, no dropout): ``ReLU(LN(conv))`` or, in
        the logit-passing variant, this layer's logits. ``out`` (``[n_own, d_out]``): written
        there a slice of rows at a time (every map is row-wise), so that neither the result
        nor the conv's intermediates exist as separate whole-partition arrays."""
        was = self.training
        self.eval()
        f = self.hidden if mode == "hidden" else self
        try:
            if out is None:
                return f(pre)
            if self.arch == "gat":       # attention runs over the whole block at once
                out.copy_(f(pre))
                return out
            for r in row_slices(out.shape[0], max(self.in_dim, out.shape[1])):
                out[r] = f(pre, r)
            return out
        finally:
            self.train(was)

    def extra_repr(self) -> str:
        return f"{self.arch}, {self.in_dim} -> {self.out_dim}, last={self.last}"


def build_layers(arch: str, in_dim: int, hidden: int, num_classes: int, layers: int,
                 heads: int, dropout: float, layer_norm: bool, embed: str,
                 seed: int) -> nn.ModuleList:
    """All ``layers`` RETEXO layers, weights drawn from ``seed`` alone (identical on every rank
    without communication; the global RNG is left untouched). ``embed='logits'`` makes every
    layer after the first read the previous layer's ``num_classes`` logits."""
    state = torch.random.get_rng_state()
    out = []
    try:
        for k in range(layers):
            torch.manual_seed(stream_seed(seed, f"retexo.layer/{k}"))
            last = k == layers - 1
            d_in = in_dim if k == 0 else (hidden if embed == "hidden" else num_classes)
            out.append(RetexoLayer(arch, d_in, num_classes if last else hidden, num_classes,
                                   last, heads, dropout, layer_norm))
    finally:
        torch.random.set_rng_state(state)
    return nn.ModuleList(out)
