"""Sparse input features: the first layer's input kept in CSR form.

Bag-of-words and keyword features (Cora, CiteSeer, Coauthor, most citation and product
graphs) are ~1 % non-zero. Dense, the first layer spends its time on zeros twice: dropout
draws one random number per entry of ``x [N, F]`` and ``x W^T`` multiplies them all. Kept
sparse, both touch only the non-zeros, and the result is the same model: dropout of a zero
is zero whatever the mask, so dropping out only the non-zeros draws from the same
distribution (a different random stream than ``F.dropout`` on the dense matrix, though).

Only the input is sparse: the first layer transforms it (``x W^T``, narrowing to the hidden
width) and everything after is dense. :func:`maybe_sparse` decides from the density.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..rows import to_device

__all__ = ["SparseFeatures", "maybe_sparse", "mostly_zero", "count_nonzero",
           "SPARSE_MAX_DENSITY", "BATCH_MAX_DENSITY"]

#: Above this fraction of non-zeros the dense path is faster. Measured on random matrices, no
#: dataset involved (``benchmarks/calibrate_sparse.py``: 10^4 x 10^3, hidden 64, dropout 0.5,
#: one thread): the sparse first layer (dropout of the non-zeros, x W^T and the weight
#: gradient) costs 0.08 / 0.31 / 0.66 / 0.90 / 1.15 of the dense one at densities
#: 0.05 / 0.2 / 0.4 / 0.5 / 0.6 - most of the dense cost is ``F.dropout`` drawing one mask
#: entry per feature. The break-even is near 0.55.
SPARSE_MAX_DENSITY = 0.5
#: The same for an input gathered anew every step (a mini-batch's fetched rows): its transpose,
#: which the weight gradient needs, is built each time (a sort of its non-zeros) instead of
#: once, and the crossing moves down to about 0.2 (``calibrate_sparse.py --fresh``, 767
#: columns, 8,000 rows).
BATCH_MAX_DENSITY = 0.2


class SparseFeatures:
    """A CSR matrix ``[n, F]``: row ``v``'s non-zeros are ``values[indptr[v]:indptr[v+1]]``
    in columns ``indices[indptr[v]:indptr[v+1]]`` (int64 ``[n+1]``, int64 ``[nnz]``, float
    ``[nnz]``). Immutable: :meth:`dropout` returns a copy with new values sharing the
    structure (and its cached transpose, needed for the weight gradient)."""

    def __init__(self, indptr: Tensor, indices: Tensor, values: Tensor, num_cols: int,
                 _transpose: Optional[dict] = None, _values_t: Optional[Tensor] = None) -> None:
        self.indptr, self.indices, self.values = indptr, indices, values
        self.num_cols = int(num_cols)
        self._transpose = {} if _transpose is None else _transpose
        self._values_t = _values_t   # the values in transposed order, when already known

    @classmethod
    def from_dense(cls, x: Tensor) -> "SparseFeatures":
        # a block of rows at a time: a whole matrix's mask would be a temporary as large as
        # the matrix; and the rows' counts come from the non-zeros' row ids, since counting
        # or summing a mask along its rows widens all of it to int64 first
        step = _block_rows(x.shape[1])
        counts, cols, values = [], [], []
        for i in range(0, x.shape[0], step):
            blk = x[i:i + step]
            at = (blk != 0).nonzero()
            counts.append(torch.bincount(at[:, 0], minlength=blk.shape[0]))
            cols.append(at[:, 1])
            values.append(blk[at[:, 0], at[:, 1]])
        indptr = torch.zeros(x.shape[0] + 1, dtype=torch.int64, device=x.device)
        if counts:
            torch.cumsum(torch.cat(counts), 0, out=indptr[1:])
        return cls(indptr, _cat(cols, torch.int64, x.device), _cat(values, x.dtype, x.device),
                   x.shape[1])

    @classmethod
    def cat(cls, parts: "Sequence[SparseFeatures]") -> "SparseFeatures":
        """The rows of ``parts`` one after the other (``[owned ; halo]``), as one matrix."""
        if not parts:
            raise ValueError("SparseFeatures.cat needs at least one matrix")
        widths = {p.num_cols for p in parts}
        if len(widths) != 1:
            raise ValueError(f"SparseFeatures.cat: matrices of widths {sorted(widths)}; "
                             f"expected one width")
        starts = list(itertools.accumulate((p.nnz for p in parts[:-1]), initial=0))
        indptr = torch.cat([parts[0].indptr[:1]] +
                           [p.indptr[1:] + s for p, s in zip(parts, starts)])
        return cls(indptr, torch.cat([p.indices for p in parts]),
                   torch.cat([p.values for p in parts]), parts[0].num_cols)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.indptr.numel() - 1, self.num_cols))

    @property
    def nnz(self) -> int:
        return int(self.values.numel())

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def __repr__(self) -> str:
        n, f = self.shape
        return f"SparseFeatures({n} x {f}, nnz={self.nnz}, density={self.nnz / max(n * f, 1):.4f})"

    def to(self, device: torch.device | str) -> "SparseFeatures":
        if torch.device(device) == self.device:
            return self
        return SparseFeatures(to_device(self.indptr, device), to_device(self.indices, device),
                              to_device(self.values, device), self.num_cols)

    def to_dense(self) -> Tensor:
        return self.csr().to_dense()

    def csr(self, values: Optional[Tensor] = None) -> Tensor:
        return torch.sparse_csr_tensor(self.indptr, self.indices,
                                       self.values if values is None else values, self.shape)

    def dropout(self, p: float, training: bool = True, key: Optional[int] = None,
                ids: Optional[Tensor] = None) -> "SparseFeatures":
        """Inverted dropout of the non-zeros (zeros stay zero whatever their mask).

        The mask is drawn in the transposed order, where the weight gradient reads it, and
        gathered (as bytes) into the row order of the forward product: cheaper than
        gathering the dropped-out float values for the backward pass. With ``key`` and the
        rows' global ``ids`` the mask is the keyed one of :mod:`quietgnn.nn.keyed` (the same
        entries as :func:`~quietgnn.nn.keyed.keyed_dropout` of the dense matrix keeps)."""
        if not training or p == 0.0:
            return self
        t = self._structure()
        skey = ("scaled", float(p), self.values.data_ptr())
        if skey not in t:   # the kept values, scaled by 1 / (1 - p): one select per epoch
            scale = 1.0 / (1.0 - p)
            t[skey] = (self.values * scale, self.transposed_values() * scale)
        scaled, scaled_t = t[skey]
        if key is not None and ids is not None:
            from .keyed import keep_mask
            if "rows" not in t:   # the row of every non-zero, row order (once per structure)
                t["rows"] = t["indices"].new_empty(self.nnz)
                t["rows"][t["perm"]] = t["indices"]
            keep = keep_mask(ids.to(torch.int64)[t["rows"]] * self.num_cols + self.indices, p,
                             key)
            values = scaled * keep
            values_t = scaled_t * keep[t["perm"]]
            return SparseFeatures(self.indptr, self.indices, values, self.num_cols,
                                  self._transpose, values_t)
        keep_t = torch.rand(self.nnz, device=self.device) >= p
        values_t = scaled_t * keep_t          # (a product: ~3x faster than torch.where)
        values = scaled * keep_t[t["inv"]]
        return SparseFeatures(self.indptr, self.indices, values, self.num_cols, self._transpose,
                              values_t)

    def float(self) -> "SparseFeatures":
        """The same matrix with float32 values (itself when they are)."""
        if self.values.dtype == torch.float32:
            return self
        return SparseFeatures(self.indptr, self.indices, self.values.float(), self.num_cols)

    def row_range(self, lo: int, hi: int) -> "SparseFeatures":
        """Rows ``lo`` to ``hi - 1``, as views of this matrix's arrays (a minibatch's rows of
        a bulk's fetch)."""
        a, b = int(self.indptr[lo]), int(self.indptr[hi])
        return SparseFeatures(self.indptr[lo:hi + 1] - a, self.indices[a:b], self.values[a:b],
                              self.num_cols)

    def head(self, n: int) -> "SparseFeatures":
        """The first ``n`` rows (a destination block's own rows)."""
        if n == self.shape[0]:
            return self
        end = int(self.indptr[n])
        return SparseFeatures(self.indptr[: n + 1], self.indices[:end], self.values[:end],
                              self.num_cols)   # another structure: its own transpose

    def scale_rows(self, factor: Tensor) -> "SparseFeatures":
        """``diag(factor) x``: every row's non-zeros times its factor, as a new matrix that
        shares this one's structure (its transpose) but not the per-values caches of
        :meth:`dropout` (keyed by the values' storage, which a per-epoch copy would recycle)."""
        t = self._structure()
        if "rows" not in t:   # the row of every non-zero, row order (once per structure)
            t["rows"] = t["indices"].new_empty(self.nnz)
            t["rows"][t["perm"]] = t["indices"]
        shared = {k: v for k, v in t.items() if isinstance(k, str)}
        return SparseFeatures(self.indptr, self.indices,
                              self.values * factor.to(self.values)[t["rows"]], self.num_cols,
                              _transpose=shared)

    def rows(self, idx: Tensor) -> "SparseFeatures":
        """The rows ``idx`` in that order (a mini-batch's input rows), as a new matrix:
        its own structure, so its transpose is built on demand, at a cost of its non-zeros."""
        idx = idx.to(device=self.device, dtype=torch.int64)
        start = self.indptr[idx]
        counts = self.indptr[idx + 1] - start
        indptr = torch.zeros(idx.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        total = int(indptr[-1])
        # position of the j-th gathered non-zero in the source: its row's start + its rank
        # within the row (vectorised: no loop over rows)
        pos = torch.repeat_interleave(start - indptr[:-1], counts, output_size=total) + \
            torch.arange(total, device=self.device)
        return SparseFeatures(indptr, self.indices[pos], self.values[pos], self.num_cols)

    def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """``x W^T (+ b)``, differentiable in ``weight`` (the input is data, not a parameter)."""
        out = _SparseLinear.apply(weight, self)
        return out if bias is None else out + bias

    def _structure(self) -> dict:
        """The transpose's structure (cached, shared with dropout copies): ``perm`` (transposed
        position -> row-order position), ``inv`` (its inverse), ``indptr``/``indices``."""
        if "perm" not in self._transpose:
            n = self.shape[0]
            perm = torch.sort(self.indices, stable=True).indices   # rows ascend within a column
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=self.device)
            indptr_t = torch.zeros(self.num_cols + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(torch.bincount(self.indices, minlength=self.num_cols), 0,
                         out=indptr_t[1:])
            rows = torch.repeat_interleave(torch.arange(n, device=self.device),
                                           self.indptr[1:] - self.indptr[:-1])
            self._transpose.update(perm=perm, inv=inv, indptr=indptr_t, indices=rows[perm])
        return self._transpose

    def transposed_values(self) -> Tensor:
        """``values`` in the order of the transpose ``x^T`` (computed once per object)."""
        if self._values_t is None:
            self._values_t = self.values[self._structure()["perm"]]
        return self._values_t

    def transposed(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """``x^T`` as a CSR tensor ``[F, n]``."""
        t = self._structure()
        return torch.sparse_csr_tensor(t["indptr"], t["indices"],
                                       self.transposed_values().to(dtype or self.dtype),
                                       (self.num_cols, self.shape[0]))


class _SparseLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: Tensor, x: SparseFeatures) -> Tensor:  # type: ignore[override]
        ctx.x = x
        if x.nnz == 0:
            return weight.new_zeros((x.shape[0], weight.shape[0]))
        return x.csr(x.values.to(weight.dtype)) @ weight.t()

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x: SparseFeatures = ctx.x
        if x.nnz == 0:
            return grad.new_zeros((grad.shape[1], x.num_cols)), None
        # dL/dW = grad^T x = (x^T grad)^T: one sparse product with the cached transpose
        return (x.transposed(grad.dtype) @ grad.contiguous()).t(), None


def maybe_sparse(x: Tensor, max_density: float = SPARSE_MAX_DENSITY) -> Tensor | SparseFeatures:
    """``x`` as :class:`SparseFeatures` when at most ``max_density`` of it is non-zero."""
    if x.dim() != 2 or x.numel() == 0 or x.is_sparse or x.layout != torch.strided:
        return x
    return SparseFeatures.from_dense(x) if count_nonzero(x) / x.numel() <= max_density else x


def mostly_zero(x: Tensor, max_density: float = SPARSE_MAX_DENSITY) -> Optional[SparseFeatures]:
    """``x`` as float32 :class:`SparseFeatures` when at most ``max_density`` of it is
    non-zero (a float16 part read as stored: its few non-zeros widened), else None."""
    if x.dim() != 2 or not x.is_floating_point() or x.numel() == 0 or \
            count_nonzero(x) > max_density * x.numel():
        return None
    return SparseFeatures.from_dense(x).float()


def count_nonzero(x: Tensor) -> int:
    """The non-zeros of a dense matrix, counted a block of rows at a time: ``(x != 0)`` of a
    whole feature matrix, summed, makes a bool and an int64 temporary of all of it
    (gigabytes for a large local graph)."""
    step = _block_rows(x.shape[1])
    return sum(int(torch.count_nonzero(x[i:i + step])) for i in range(0, x.shape[0], step))


def _block_rows(width: int) -> int:
    """Rows per block of the blockwise passes over a dense matrix: about 4M values."""
    return max(1, (1 << 22) // max(1, int(width)))


def _cat(pieces: list[Tensor], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=device)
