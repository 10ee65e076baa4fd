"""Blocks of static fp32 rows (input features) on the wire: sparse when that is smaller.

A block of ``r`` rows of width ``F`` with ``nnz`` non-zeros travels as int32 words, either
dense (``r F`` words: the values' bits) or sparse (``r + 2 nnz`` words: each row's count of
non-zeros, their columns, then their values' bits), whichever is smaller
(:func:`sparse_is_smaller`). Sender and receiver choose alike from ``(r, nnz, F)``: a caller
either exchanges each block's ``nnz`` first (8 bytes per peer; a count of -1 says "dense",
for a sender that did not count), or lets the all-to-all learn each block's size and reads
the form off it (:func:`nnz_of_words`). Bag-of-words and one-hot features are about 1 %
non-zero: a sparse block is tens of times smaller, and neither side ever holds it dense
(:class:`SparseFeatures` in, and out when asked).

Used where rows of input features cross ranks: ``halo``'s and its family's static input rows
(:func:`quietgnn.comm.halo.fetch_static_rows`), ``grappa``'s chunk reloads (counts first)
and ``minibatch``'s fetches (sizes learnt, every bulk).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..nn.sparse import SparseFeatures, count_nonzero

__all__ = ["sparse_is_smaller", "block_nnz", "encode_rows", "wire_words", "decode_rows",
           "nnz_of_words"]


def sparse_is_smaller(rows: int, nnz: int, width: int) -> bool:
    """Whether a block of ``rows`` x ``width`` fp32 values with ``nnz`` non-zeros is smaller as
    (int32 non-zeros per row, int32 column, fp32 value) than dense: ``4 rows + 8 nnz <
    4 rows width``. Sender and receiver decide alike from the exchanged ``nnz``."""
    return 4 * rows + 8 * nnz < 4 * rows * width


def block_nnz(block: Tensor | SparseFeatures) -> int:
    """The non-zeros of a block (counted a slice at a time when it is dense)."""
    return block.nnz if isinstance(block, SparseFeatures) else count_nonzero(block)


def _sparse_wire(rows: int, nnz: int, width: int) -> bool:
    return rows > 0 and nnz >= 0 and sparse_is_smaller(rows, nnz, width)


def wire_words(rows: int, nnz: int, width: int) -> int:
    """int32 words of a block on the wire (``nnz`` -1: dense)."""
    return rows + 2 * nnz if _sparse_wire(rows, nnz, width) else rows * width


def nnz_of_words(rows: int, words: int, width: int) -> int:
    """The ``nnz`` a block of ``rows`` arrived with, from its size alone (-1: dense): a
    block goes sparse only when that is strictly smaller than dense, so ``words`` below
    ``rows x width`` means sparse, with ``(words - rows) / 2`` non-zeros. A receiver that
    learnt the size (an all-to-all with its size handshake) needs no count exchanged."""
    return (words - rows) // 2 if 0 < rows and words < rows * width else -1


def encode_rows(block: Tensor | SparseFeatures, nnz: int) -> Tensor:
    """``block`` (fp32, dense or sparse, ``nnz`` non-zeros, or -1: send it dense) as the int32
    words it travels as."""
    if _sparse_wire(int(block.shape[0]), nnz, int(block.shape[1])):
        sb = block if isinstance(block, SparseFeatures) else SparseFeatures.from_dense(block)
        counts = (sb.indptr[1:] - sb.indptr[:-1]).to(torch.int32)
        return torch.cat([counts, sb.indices.to(torch.int32),
                          sb.values.contiguous().view(torch.int32)])
    dense = block.to_dense() if isinstance(block, SparseFeatures) else block
    return dense.contiguous().reshape(-1).view(torch.int32)


def decode_rows(words: Tensor, rows: int, nnz: int, width: int,
                sparse: bool) -> Tensor | SparseFeatures:
    """The block :func:`encode_rows` made, from its words: :class:`SparseFeatures` when
    ``sparse`` (a dense block is converted), else a dense fp32 ``[rows, width]`` (a view of
    ``words`` when it travelled dense)."""
    if _sparse_wire(rows, nnz, width):
        counts, cols = words[:rows].to(torch.int64), words[rows:rows + nnz].to(torch.int64)
        values = words[rows + nnz:].view(torch.float32)
        indptr = torch.zeros(rows + 1, dtype=torch.int64, device=words.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        block = SparseFeatures(indptr, cols, values, width)
        return block if sparse else block.to_dense()
    dense = words.view(torch.float32).reshape(rows, width)
    return SparseFeatures.from_dense(dense) if sparse else dense
