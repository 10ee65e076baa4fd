"""A memory-lean full-graph GCN forward: activations of the layers' input and output widths,
never of the hidden width over all rows at once.

Why. A full-graph GCN layer holds ``[n, hidden]`` activations several times over (the
transform's output, ReLU's, dropout's mask and output, the next transform's saved input), and
a halo exchange of hidden rows appends ``[n_halo, hidden]`` more: gigabytes a rank once a part
has 10^7 rows. Two rewrites bound this, both exact (the same sums, in another order):

1. **Transform before the exchange.** A narrowing layer (``d_out < d_in``, e.g. the output
   layer) applies its weight on the owner, so the halo rows travel ``d_out`` wide:
   ``A (H W) = (A H) W``. Fewer bytes too (and no dropout mask to recompute on arrival:
   the rows are dense after the transform).
2. **Row-chunked recomputation.** Everything between two aggregations (bias, norm, ReLU,
   keyed dropout, the next layer's narrowing transform) is row-wise, so it runs a slice of
   rows at a time under activation checkpointing: autograd keeps the slice's input (the
   aggregation's output, which exists anyway) and recomputes the rest in backward. Keyed
   dropout masks (:mod:`.keyed`) are a function of (key, node, column), so the recomputation
   draws the same mask; ``torch.utils.checkpoint`` restores the RNG for unkeyed dropout.

The aggregation runs a slice of destination rows at a time in forward and scatters its
gradient back a slice at a time (``index_add``) in backward: no transposed copy of the block,
whose construction (a sort of every edge) would cost more memory than all the rest.

GCN only: its aggregation is linear with fixed weights. GraphSAGE would fit the same scheme;
GAT's attention and GIN's inner MLP do not (:func:`lean_forward` says so).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..rows import chunk_bounds
from .adj import SparseAdj, spmm_rows
from .keyed import keyed_dropout, mix_key

__all__ = ["lean_forward", "LEAN_ARCHS", "propagate", "propagate_input", "propagate_rowwise"]

LEAN_ARCHS = ("gcn",)

#: entries of a slice: edges of an aggregation slice, row x width of a recomputed slice
_SLICE = 1 << 21


class _Propagate(torch.autograd.Function):
    """``A @ h + self_w * h[:n_dst]`` with ``A`` the block's GCN weights, a slice of rows at a
    time; backward scatters ``A^T grad`` the same way. Differentiable in ``h`` only. The
    weights of a slice's edges are formed when it is used (the products
    :meth:`SparseAdj.gcn_norm` would keep for every edge: 4 bytes an edge, for the run), and
    the self-loop term is added in place (as a separate product and sum it would make two
    more ``[n_dst, d]`` temporaries). The forward is :func:`~quietgnn.nn.adj.spmm_rows` with
    those per-slice weights."""

    @staticmethod
    def forward(ctx, h: Tensor, adj: SparseAdj, self_w: Tensor) -> Tensor:  # type: ignore[override]
        ctx.adj, ctx.self_w, ctx.n_src = adj, self_w, h.shape[0]
        out = spmm_rows(adj, adj.gcn_weights, h, _SLICE)
        # in place, row by row: no [n_dst, d] temporary for the self-loop term
        return out.addcmul_(self_w[:, None].to(h.dtype), h[: adj.n_dst])

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        adj = ctx.adj
        g_h = grad.new_zeros((ctx.n_src, grad.shape[1]))
        g_h[: adj.n_dst].addcmul_(ctx.self_w[:, None].to(grad.dtype), grad)
        for a, b in chunk_bounds(adj.indptr, _SLICE // max(1, grad.shape[1])):
            s, e = int(adj.indptr[a]), int(adj.indptr[b])
            if e > s:
                rows = torch.repeat_interleave(torch.arange(a, b, device=grad.device),
                                               adj.row_count[a:b], output_size=e - s)
                g_h.index_add_(0, adj.indices[s:e],
                               grad[rows] * adj.gcn_weights(a, b)[:, None].to(grad.dtype))
        return g_h, None, None


def propagate(adj: SparseAdj, h: Tensor) -> Tensor:
    """The GCN aggregation with self-loops, ``D^-1/2 (A + I) D^-1/2 h`` (no transform, no
    bias), in slices (see the module docstring)."""
    if h.shape[0] != adj.n_src:
        raise ValueError(f"propagate: input has {h.shape[0]} rows, the adjacency block has "
                         f"{adj.n_src} source columns")
    dinv_dst = adj.gcn_factors(torch.float32)[1]
    return _Propagate.apply(h, adj, dinv_dst * dinv_dst)


def propagate_input(adj: SparseAdj, x: Tensor) -> Tensor:
    """:func:`propagate` of rows that need no gradient, in any float dtype (a stored part's
    float16 rows are widened a block of columns at a time), as float32."""
    if x.dtype == torch.float32:
        with torch.no_grad():
            return propagate(adj, x)
    return _columns(x, adj, lambda h, a, b, c0, c1: h)


@torch.no_grad()
def propagate_rowwise(adj: SparseAdj, z: Tensor, fn: Callable[[Tensor], Tensor],
                      width: int) -> Tensor:
    """``propagate(adj, fn(z))`` for a row-wise ``fn`` (``[m, d] -> [m, width]``, no
    gradient), without ever holding ``fn(z)``: each slice of edges applies ``fn`` to the source
    rows it gathers, and each slice of destination rows to its own rows (the self-loop term).
    ``fn`` runs once per edge instead of once per source row -- more arithmetic (the mean
    degree times), in exchange for no ``[n_src, width]`` array when ``z`` is narrower."""
    if z.shape[0] != adj.n_src:
        raise ValueError(f"propagate_rowwise: input has {z.shape[0]} rows, the adjacency block "
                         f"has {adj.n_src} source columns")
    dinv_dst = adj.gcn_factors(torch.float32)[1]
    out = torch.empty((adj.n_dst, width), dtype=torch.float32, device=z.device)
    step = max(1, _SLICE // max(1, width, z.shape[1]))
    for a, b in chunk_bounds(adj.indptr, step, max_items=step):
        s, e = int(adj.indptr[a]), int(adj.indptr[b])
        out[a:b] = fn(z[a:b].float()).mul_((dinv_dst[a:b] * dinv_dst[a:b])[:, None])
        if e > s:
            # one column per edge: the slice's rows sum their own edges' transformed sources
            crow = adj.indptr[a:b + 1] - s
            block = torch.sparse_csr_tensor(crow, torch.arange(e - s, device=z.device),
                                            adj.gcn_weights(a, b), (b - a, e - s))
            out[a:b] += block @ fn(z.index_select(0, adj.indices[s:e]).float())
    return out


def _rowwise(fn: Callable[[Tensor, int, int], Tensor], h: Tensor, width_out: int) -> Tensor:
    """``fn`` over slices of rows of ``h``, each slice checkpointed when gradients flow:
    autograd keeps the slices of ``h`` only, and recomputes ``fn`` in backward."""
    n = h.shape[0]
    if n == 0:
        return fn(h, 0, 0)
    step = max(1, _SLICE // max(1, h.shape[1], width_out))
    if step >= n:
        return checkpoint(fn, h, 0, n, use_reentrant=False) if torch.is_grad_enabled() \
            else fn(h, 0, n)
    out = None
    for a in range(0, n, step):
        b = min(n, a + step)
        y = checkpoint(fn, h[a:b], a, b, use_reentrant=False) if torch.is_grad_enabled() \
            else fn(h[a:b], a, b)
        if out is None:
            out = y.new_empty((n,) + tuple(y.shape[1:]))
        # written into one output (autograd records the slice copies): concatenating the
        # slices at the end would hold them twice
        out[a:b] = y
    return out


def _drop_cols(h: Tensor, p: float, keyed: bool, key: Optional[int], ids: Optional[Tensor],
               cols: tuple[int, int], width: int) -> Tensor:
    """Dropout of the columns ``cols`` of rows ``width`` wide (keyed: the entries the whole
    rows would keep)."""
    if p == 0.0:
        return h
    if keyed:
        return keyed_dropout(h, p, mix_key(key, 0), ids, cols=cols, width=width)
    return F.dropout(h, p, True)


def _columns(x: Tensor, adj: SparseAdj,
             drop: Callable[[Tensor, int, int, int, int], Tensor]) -> Tensor:
    """``propagate(adj, drop(x))`` for input rows that need no gradient, a block of columns at
    a time: each block's fp32 copy of the rows (dropped out a slice of rows at a time, into
    it) is at most the size of the ``[n_dst, F]`` output."""
    n, F_ = x.shape
    cb = max(1, min(F_, (adj.n_dst * F_) // max(1, adj.n_src)))
    out = torch.empty((adj.n_dst, F_), dtype=torch.float32, device=x.device)
    with torch.no_grad():
        for c0 in range(0, F_, cb):
            c1 = min(F_, c0 + cb)
            block = torch.empty((n, c1 - c0), dtype=torch.float32, device=x.device)
            step = max(1, _SLICE // (c1 - c0))
            for a in range(0, n, step):
                b = min(n, a + step)
                block[a:b] = drop(x[a:b, c0:c1].float(), a, b, c0, c1)
            out[:, c0:c1] = propagate(adj, block)
            del block
    return out


def lean_forward(model, x: Tensor, adj: SparseAdj, exchange=None, *,
                 dropout_key: Optional[int] = None, ids: Optional[Tensor] = None,
                 ids_in: Optional[Tensor] = None, inputs_have_halo: bool = False) -> Tensor:
    """The logits of :meth:`quietgnn.nn.GNN.forward` (same arguments) for a GCN ``model``,
    computed as the module docstring says. ``x`` is dense (any float dtype: a stored part's
    float16 rows are widened a slice at a time)."""
    if model.arch not in LEAN_ARCHS:
        raise ValueError(f"the lean forward supports model.arch in {list(LEAN_ARCHS)}, not "
                         f"{model.arch!r}: use model.arch gcn, or turn the lean option off")
    if not isinstance(x, Tensor) or x.layout != torch.strided:
        raise TypeError("the lean forward takes dense input rows")
    L = model.num_layers
    p = model.dropout if model.training else 0.0
    keyed = p > 0.0 and dropout_key is not None and ids is not None

    def drop(h: Tensor, layer: int, rows: Optional[Tensor]) -> Tensor:
        if p == 0.0:
            return h
        if keyed:
            return keyed_dropout(h, p, mix_key(dropout_key, layer), rows)
        return F.dropout(h, p, True)

    def narrow(i: int) -> bool:
        conv = model.convs[i]
        return conv.out_dim < conv.in_dim

    def pre(h: Tensor, i: int, rows: Optional[Tensor]) -> Tensor:
        """Layer i's input rows -> what it exchanges and aggregates."""
        h = drop(h, i, rows)
        return F.linear(h, model.convs[i].lin.weight) if narrow(i) else h

    def _next(agg: Tensor, i: int) -> Tensor:
        """Post of layer i and pre of layer i + 1, a slice of rows at a time."""
        w = model.convs[i + 1].out_dim if narrow(i + 1) else model.convs[i].out_dim
        return _rowwise(lambda h, a, b: pre(post(h, i), i + 1,
                                            None if ids is None else ids[a:b]), agg, w)

    def post(agg: Tensor, i: int) -> Tensor:
        """Layer i's aggregation -> its output (transform unless done before, bias, norm,
        ReLU unless last)."""
        conv = model.convs[i]
        out = agg if narrow(i) else F.linear(agg, conv.lin.weight)
        if conv.bias is not None:
            out = out + conv.bias
        if i < L - 1:
            out = F.relu(model.norms[i](out))
        return out

    ids0 = ids_in if ids_in is not None else ids
    first = 0
    if not narrow(0) and (inputs_have_halo or exchange is None):
        # layer 0 aggregates its input rows as they are: data (no gradient), and dropout and
        # aggregation act column by column, so a block of columns at a time widens and drops
        # no more than the aggregation's own output holds
        agg = _columns(x, adj, lambda h, a, b, c0, c1: _drop_cols(
            h, p, keyed, dropout_key, None if ids0 is None else ids0[a:b], (c0, c1), x.shape[1]))
        if L == 1:
            return post(agg, 0)
        first = 1
        m = _next(agg, 0)
    else:
        # the input rows are exchanged first, or a narrowing transform (gradient) acts on them
        width0 = model.convs[0].out_dim if narrow(0) else x.shape[1]
        m = _rowwise(lambda h, a, b: pre(h.float(), 0, None if ids0 is None else ids0[a:b]),
                     x, width0)
    for i in range(first, L):
        if exchange is not None and not (i == 0 and inputs_have_halo):
            keep = (p, mix_key(dropout_key, i)) if (keyed and not narrow(i) and getattr(
                exchange, "skips_dropped", False)) else None
            m = exchange(m, i, keep=keep) if keep is not None else exchange(m, i)
        agg = propagate(adj, m)
        del m
        if i == L - 1:
            return post(agg, i)
        m = _next(agg, i)
        del agg
    raise AssertionError("unreachable")   # the loop returns at its last layer
