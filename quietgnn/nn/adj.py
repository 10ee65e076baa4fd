"""Sparse adjacency blocks and the sparse-dense product every layer uses.

A :class:`SparseAdj` is a destination-indexed CSR block with ``n_dst`` rows and ``n_src``
columns where **the first ``n_dst`` sources are the destinations themselves** (the layout of a
local partition ``[owned | halo]``, of a whole graph, and of a sampled mini-batch block with
targets first). A layer maps ``h [n_src, d] -> out [n_dst, d']`` and reads the destination's
own row as ``h[:n_dst]``.

Why not ``torch_geometric.MessagePassing``: gather-scatter materialises ``E x d`` messages;
one CSR kernel call does the same aggregation much faster on a CPU core (measured against
PyG: benchmarks/results/pyg). The transposed structure for the backward pass and the
normalisation weights are computed once per block and cached, never per epoch.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
from torch import Tensor

from ..rows import chunk_bounds, to_device

__all__ = ["SparseAdj", "spmm", "spmm_rows"]

# CSR tensors are only built from our own validated structure; torch's beta notices are noise.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

#: entries a per-edge array is built in at a time (:meth:`SparseAdj._slices`)
EDGE_SLICE = 1 << 22


class SparseAdj:
    """CSR block ``[n_dst, n_src]`` (see module docstring).

    ``src_degree``/``dst_degree``: int64 degrees used for GCN normalisation (the *global*
    in-degree in a partition, so that distributed equals centralized); default: row counts.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, n_src: int,
                 src_degree: Optional[Tensor] = None, dst_degree: Optional[Tensor] = None) -> None:
        self.indptr, self.indices = indptr, indices
        self.n_dst, self.n_src = int(indptr.numel() - 1), int(n_src)
        if self.n_src < self.n_dst:
            raise ValueError(f"SparseAdj: n_src = {self.n_src} < n_dst = {self.n_dst}; sources "
                             f"must start with the destinations themselves")
        self.row_count = indptr[1:] - indptr[:-1]
        self.dst_degree = self.row_count if dst_degree is None else dst_degree
        self.src_degree = src_degree
        self._cache: dict[str, object] = {}

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def __repr__(self) -> str:
        return f"SparseAdj(n_dst={self.n_dst}, n_src={self.n_src}, nnz={self.nnz})"

    # ------------------------------------------------------------------ cached structure
    # Per-edge arrays are what a block's memory is made of at 10^7+ edges, so only what
    # the layers keep using is cached: the normalisation weights and, for the backward pass,
    # the transposed matrix *with its values* (weights fixed per block: GCN, mean, sum).
    # The row index and the transposition permutation are built on the way and dropped,
    # unless a caller asks for them (attention: values change every step).
    def row(self) -> Tensor:
        """int64 [E]: destination row of each entry (cached once asked for)."""
        if "row" not in self._cache:
            self._cache["row"] = self._row()
        return self._cache["row"]  # type: ignore[return-value]

    def _row(self) -> Tensor:
        if "row" in self._cache:
            return self._cache["row"]  # type: ignore[return-value]
        return torch.repeat_interleave(torch.arange(self.n_dst, device=self.device),
                                       self.row_count)

    def _slices(self, budget: Optional[int] = None) -> list[tuple[int, int, int, int]]:
        """``(a, b, s, e)``: rows ``a:b`` hold entries ``s:e``, about ``budget`` entries a
        slice (default :data:`EDGE_SLICE`). A block within the budget is one slice, known
        without reading ``indptr``: on a GPU each read is a sync, and a mini-batch builds its
        blocks every step."""
        budget = EDGE_SLICE if budget is None else budget
        if self.nnz <= budget:
            return [(0, self.n_dst, 0, self.nnz)]
        return [(a, b, int(self.indptr[a]), int(self.indptr[b]))
                for a, b in chunk_bounds(self.indptr, budget)]

    def _per_edge(self, per_row: Tensor) -> Tensor:
        """``per_row[row]`` without materialising the int64 row index. A slice of rows at a
        time: repeat_interleave builds an int64 index of all its output before gathering
        (8 bytes an edge)."""
        out = per_row.new_empty(self.nnz)
        for a, b, s, e in self._slices():
            out[s:e] = torch.repeat_interleave(per_row[a:b], self.row_count[a:b],
                                               output_size=e - s)
        return out

    def transpose_structure(self) -> tuple[Tensor, Tensor, Tensor]:
        """(indptr_T [n_src+1], indices_T [E], perm [E]) with ``values_T = values[perm]``."""
        if "T" not in self._cache:
            # rows are ascending within the CSR, so a stable sort by column alone gives the
            # (column, row) order of the transpose
            perm = torch.sort(self.indices, stable=True).indices
            indptr_t = torch.zeros(self.n_src + 1, dtype=torch.int64, device=self.device)
            indptr_t[1:] = torch.bincount(self.indices, minlength=self.n_src).cumsum(0)
            self._cache["T"] = (indptr_t, self._row()[perm], perm)
        return self._cache["T"]  # type: ignore[return-value]

    def gcn_norm(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """Symmetric GCN weights with self-loops: edge u->v gets 1/sqrt((d_u+1)(d_v+1)), the
        self-loop 1/(d_v+1); d = in-degree (``src_degree``/``dst_degree``)."""
        key = f"gcn:{dtype}"
        if key not in self._cache:
            # a slice of rows at a time (gcn_weights): a gather by int32 indices widens them
            # first, and repeat_interleave builds an int64 index of all its output
            ew = torch.empty(self.nnz, dtype=dtype, device=self.device)
            for a, b, s, e in self._slices():
                ew[s:e] = self.gcn_weights(a, b, dtype, span=(s, e))
            dinv_dst = self.gcn_factors(dtype)[1]
            self._cache[key] = (ew, dinv_dst * dinv_dst)
        return self._cache[key]  # type: ignore[return-value]

    def gcn_factors(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """``(1/sqrt(d_src + 1), 1/sqrt(d_dst + 1))``: edge u->v's GCN weight is their product
        (what :meth:`gcn_norm` stores per edge; a caller short of memory forms it a slice of
        edges at a time). Cached: O(nodes)."""
        key = f"gcnf:{dtype}"
        if key not in self._cache:
            if self.src_degree is None:
                raise ValueError("GCN normalisation needs the source degrees; build the block "
                                 "with src_degree=... (global in-degrees)")
            self._cache[key] = ((self.src_degree.to(dtype) + 1).rsqrt(),
                                (self.dst_degree.to(dtype) + 1).rsqrt())
        return self._cache[key]  # type: ignore[return-value]

    def gcn_weights(self, a: int, b: int, dtype: torch.dtype = torch.float32,
                    span: Optional[tuple[int, int]] = None) -> Tensor:
        """The GCN weights of rows ``a:b``'s edges, the values :meth:`gcn_norm` stores for
        them (the same products), formed now; ``span``: their entries ``(s, e)`` where the
        caller knows them (else read from ``indptr``)."""
        dinv_src, dinv_dst = self.gcn_factors(dtype)
        s, e = span if span is not None else (int(self.indptr[a]), int(self.indptr[b]))
        piece = torch.repeat_interleave(dinv_dst[a:b], self.row_count[a:b], output_size=e - s)
        return torch.mul(dinv_src[self.indices[s:e]], piece)

    def mean_norm(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Edge weights 1/row_count (mean over the neighbours present in the block)."""
        key = f"mean:{dtype}"
        if key not in self._cache:
            inv = 1.0 / self.row_count.clamp(min=1).to(dtype)
            self._cache[key] = self._per_edge(inv)
        return self._cache[key]  # type: ignore[return-value]

    def ones(self, dtype: torch.dtype = torch.float32) -> Tensor:
        key = f"ones:{dtype}"
        if key not in self._cache:
            self._cache[key] = torch.ones(self.nnz, dtype=dtype, device=self.device)
        return self._cache[key]  # type: ignore[return-value]

    def with_self_loops(self) -> "SparseAdj":
        """The same block plus the entry (v, v) in every row (GAT attends to itself)."""
        if "loops" not in self._cache:
            row = torch.cat([self._row(), torch.arange(self.n_dst, device=self.device)])
            col = torch.cat([self.indices, torch.arange(self.n_dst, device=self.device)])
            order = torch.argsort(row * self.n_src + col)
            indptr = torch.zeros_like(self.indptr)
            indptr[1:] = (self.row_count + 1).cumsum(0)
            self._cache["loops"] = SparseAdj(indptr, col[order], self.n_src, self.src_degree,
                                             self.dst_degree)
        return self._cache["loops"]  # type: ignore[return-value]

    def to(self, device: torch.device | str) -> "SparseAdj":
        device = torch.device(device)
        if device == self.device:
            return self
        sd = None if self.src_degree is None else to_device(self.src_degree, device)
        return SparseAdj(to_device(self.indptr, device), to_device(self.indices, device),
                         self.n_src, sd, to_device(self.dst_degree, device))

    def csr(self, values: Tensor) -> Tensor:
        return torch.sparse_csr_tensor(self.indptr, self.indices, values,
                                       (self.n_dst, self.n_src))

    def csr_t(self, values: Tensor) -> Tensor:
        """The transpose ``A(values)^T`` as a CSR tensor ``[n_src, n_dst]``. For the block's own
        cached weights (:meth:`gcn_norm`, :meth:`mean_norm`, :meth:`ones`) it is built once and
        kept; other values (attention) are permuted on each call."""
        fixed = next((k for k, v in self._cache.items()
                      if (v is values or (isinstance(v, tuple) and v[0] is values))), None)
        if fixed is not None:
            key = f"T:{fixed}"
            if key not in self._cache:
                if "T" in self._cache:
                    indptr_t, indices_t, perm = self._cache["T"]  # type: ignore[misc]
                    values_t = values[perm]
                else:
                    perm = torch.sort(self.indices, stable=True).indices
                    indptr_t = torch.zeros(self.n_src + 1, dtype=torch.int64, device=self.device)
                    indptr_t[1:] = torch.bincount(self.indices, minlength=self.n_src).cumsum(0)
                    values_t = values[perm]
                    indices_t = self._row()[perm]
                    del perm
                self._cache[key] = torch.sparse_csr_tensor(indptr_t, indices_t, values_t,
                                                           (self.n_src, self.n_dst))
            return self._cache[key]  # type: ignore[return-value]
        indptr_t, indices_t, perm = self.transpose_structure()
        return torch.sparse_csr_tensor(indptr_t, indices_t, values[perm], (self.n_src, self.n_dst))


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, h: Tensor, adj: SparseAdj) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        ctx.h_meta = (h.shape, h.dtype, h.device)
        # h is needed only for the gradient of the values (attention): otherwise keeping it
        # would hold an [n_src, d] activation per layer until the backward pass
        ctx.save_for_backward(values, h if ctx.needs_input_grad[0] else None)
        if adj.nnz == 0:
            return h.new_zeros((adj.n_dst,) + tuple(h.shape[1:]))
        return adj.csr(values.to(h.dtype)) @ h

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        values, h = ctx.saved_tensors
        adj: SparseAdj = ctx.adj
        g_values = g_h = None
        if ctx.needs_input_grad[1]:
            shape, dtype, device = ctx.h_meta
            g_h = (adj.csr_t(values.to(grad.dtype)) @ grad.contiguous()) if adj.nnz else \
                torch.zeros(shape, dtype=dtype, device=device)
        if ctx.needs_input_grad[0]:
            # d out[v] / d A[v,u] = h[u]: an SDDMM, one dot product per edge
            g_values = (grad[adj.row()] * h[adj.indices]).sum(-1).to(values.dtype)
        return g_values, g_h, None


def spmm(adj: SparseAdj, values: Optional[Tensor], h: Tensor) -> Tensor:
    """``A(values) @ h`` with ``A`` the block's sparsity pattern; differentiable in ``h`` and in
    ``values`` (attention). ``values=None`` means all ones (sum aggregation)."""
    if h.shape[0] != adj.n_src:
        raise ValueError(f"spmm: input has {h.shape[0]} rows, the adjacency block has "
                         f"{adj.n_src} source columns")
    if values is None:
        values = adj.ones(h.dtype)
    return _SpMM.apply(values, h.contiguous(), adj)


@torch.no_grad()
def spmm_rows(adj: SparseAdj, values: Optional[Tensor | Callable[[int, int], Tensor]],
              h: Tensor, budget: int = 1 << 22) -> Tensor:
    """:func:`spmm` without gradient, a slice of about ``budget`` entries' rows at a time: the
    CPU kernel's own temporaries (an int32 copy of the indices, a second output it copies
    from) are then of one slice, not of the whole block (for a layer's aggregation of a
    10^7-node partition, hundreds of MB). Each row's sum is the same as in one piece.
    ``values``: one per edge, None (ones), or ``values(a, b)`` giving the edge values of rows
    ``a:b`` when that slice is used (e.g. :meth:`SparseAdj.gcn_weights`: no per-edge array)."""
    if h.shape[0] != adj.n_src:
        raise ValueError(f"spmm_rows: input has {h.shape[0]} rows, the adjacency block has "
                         f"{adj.n_src} source columns")
    per_slice = values if callable(values) else None
    if per_slice is None:
        values = (adj.ones(h.dtype) if values is None else values).to(h.dtype)
    out = h.new_zeros((adj.n_dst,) + tuple(h.shape[1:]))
    h = h.contiguous()
    for a, b, s, e in adj._slices(budget):
        if e > s:
            w = per_slice(a, b).to(h.dtype) if per_slice is not None else values[s:e]
            # the row offsets in the indices' dtype: a stored part's edges are int32
            block = torch.sparse_csr_tensor((adj.indptr[a:b + 1] - s).to(adj.indices.dtype),
                                            adj.indices[s:e], w, (b - a, adj.n_src))
            out[a:b] = block @ h
    return out
