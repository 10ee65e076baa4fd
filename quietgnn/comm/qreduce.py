"""A sum all-reduce whose messages are stochastically quantized (:mod:`.codecs`), for
strategies whose only traffic is a gradient all-reduce (``grappa``, ``retexo``).

Why two phases and not "quantize, then all-reduce": a sum of quantized integers from
different scales is not a quantized integer, so the reduction has to happen on decoded floats.
The sum is computed as reduce-scatter + all-gather, each one :meth:`Communicator.all_to_all`
(so every byte is counted there):

1. the flat buffer is cut into rows of ``width`` floats and the rows into P equal chunks;
   rank ``j`` owns chunk ``j``. Every rank quantizes chunk ``j`` and sends it to rank ``j``,
   which decodes the ``P - 1`` copies and adds its own *exact* chunk;
2. every rank quantizes its reduced chunk once and sends the same bytes to every peer; all
   ranks (the owner included) take the *decoded* chunk, so every rank ends with bit-identical
   values (the model replicas cannot drift apart).

Both quantizations are unbiased (stochastic rounding), so the result is an unbiased estimate
of the sum; the error of a coordinate is bounded by the range of its row over the levels
(:func:`~.codecs.expected_sq_error`). Bytes each rank sends: ``2 (P - 1) * c * row_bytes(b,
width)`` with ``c`` = rows per chunk, against ``2 (P - 1) / P * 4 N`` for the fp32 ring
all-reduce the communicator accounts: at 8 bits and width 256 about 0.254 of it (b / 32 plus
4 bytes of side information per row), plus the padding of the last chunk.

``exact_tail`` trailing floats (a loss, per-rank flags, counts: values that must not be
perturbed) are summed exactly: sent as raw fp32 next to the last chunk and returned by its
owner in phase 2.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .codecs import QuantizedRows, _check_bits, dequantize, quantize, row_bytes
from .communicator import Communicator
from .traffic import Traffic

__all__ = ["quantized_all_reduce", "quantized_all_reduce_bytes", "encode_flat", "decode_flat",
           "encoded_len"]

#: floats per quantized row: the side information (4 bytes) is 1.6% of a row at 8 bits
DEFAULT_WIDTH = 256


def _layout(n: int, world: int, width: int) -> tuple[int, int]:
    """(row width, rows per chunk) for ``n`` floats over ``world`` ranks."""
    width = max(1, min(int(width), n)) if n else 1
    rows = math.ceil(n / width)
    return width, math.ceil(rows / world)


def quantized_all_reduce_bytes(n: int, world: int, bits: int, rank: int, exact_tail: int = 0,
                               width: int = DEFAULT_WIDTH) -> int:
    """Bytes ``rank`` sends in :func:`quantized_all_reduce` of ``n + exact_tail`` floats: its
    ``2 (P - 1)`` quantized chunks, plus the fp32 tail -- once (to its owner, rank P-1) for
    the other ranks, once per peer for the owner."""
    if world == 1:
        return 0
    width, c = _layout(n, world, width)
    tail = 4 * exact_tail * ((world - 1) if rank == world - 1 else 1)
    return 2 * (world - 1) * c * row_bytes(bits, width) + tail


def quantized_all_reduce(comm: Communicator, flat: Tensor, bits: int, kind: str,
                         exact_tail: int = 0, width: int = DEFAULT_WIDTH,
                         generator: Optional[torch.Generator] = None, *,
                         carries: Optional[Traffic] = None) -> Tensor:
    """Sum of ``flat`` (1-D float) over ranks, quantized at ``bits`` (2, 4, 8; 32 = the exact
    :meth:`Communicator.all_reduce`). Returns a new fp32 tensor, identical on every rank; the
    last ``exact_tail`` entries are summed exactly. Raises ``ValueError`` on non-finite input
    (callers that must survive it, like ``sync_gradients``, zero the values and flag them).
    ``carries``: what ``flat`` is (:mod:`.traffic`), declared by both all-to-alls."""
    if flat.dim() != 1:
        raise ValueError(f"quantized_all_reduce: expected a 1-D tensor, got shape "
                         f"{tuple(flat.shape)}")
    if not 0 <= exact_tail <= flat.numel():
        raise ValueError(f"quantized_all_reduce: exact_tail = {exact_tail} outside "
                         f"[0, {flat.numel()}]")
    bits = _check_bits(bits)
    comm.declare(carries, "quantized_all_reduce", kind)   # before anything, even at P = 1
    flat = flat.detach().float()
    P, me = comm.world_size, comm.rank
    if P == 1:
        return flat.clone()
    if int(bits) == 32:
        return comm.all_reduce(flat.clone(), kind, carries=carries)
    n = flat.numel() - exact_tail
    body, tail = flat[:n], flat[n:]
    width, c = _layout(n, P, width)
    dev = flat.device
    rows = torch.zeros(P * c * width, device=dev)
    rows[:n] = body
    rows = rows.view(P, c, width)
    rb = row_bytes(bits, width)

    # phase 1: reduce-scatter. Chunk j goes to rank j, quantized; the tail rides with chunk P-1
    send = []
    for j in range(P):
        if j == me:
            send.append(torch.zeros(0, dtype=torch.uint8, device=dev))
            continue
        payload = quantize(rows[j], bits, generator).to_bytes().reshape(-1)
        if j == P - 1 and exact_tail:
            payload = torch.cat([payload, tail.contiguous().view(torch.uint8)])
        send.append(payload)
    tail_b = 4 * exact_tail if me == P - 1 else 0
    counts = [0 if j == me else c * rb + tail_b for j in range(P)]
    got = comm.all_to_all(send, kind, recv_counts=counts, carries=carries)
    mine = rows[me].clone()
    tail_sum = tail.clone()
    for j in range(P):
        if j == me:
            continue
        mine += dequantize(QuantizedRows.from_bytes(got[j][:c * rb], bits, width))
        if tail_b:
            tail_sum += got[j][c * rb:].clone().view(torch.float32)

    # phase 2: all-gather of the reduced chunks, quantized once; the owner keeps the decoded
    # copy too, so that every rank holds the same values
    payload = quantize(mine, bits, generator).to_bytes().reshape(-1)
    if tail_b:
        payload = torch.cat([payload, tail_sum.contiguous().view(torch.uint8)])
    send = [torch.zeros(0, dtype=torch.uint8, device=dev) if j == me else payload
            for j in range(P)]
    counts = [0 if j == me else c * rb + (4 * exact_tail if j == P - 1 else 0)
              for j in range(P)]
    got = comm.all_to_all(send, kind, recv_counts=counts, carries=carries)
    got[me] = payload
    out = torch.empty(P, c, width, device=dev)
    for j in range(P):
        out[j] = dequantize(QuantizedRows.from_bytes(got[j][:c * rb], bits, width))
    result = out.reshape(-1)[:n]
    if exact_tail:
        t = got[P - 1][c * rb:].clone().view(torch.float32)
        result = torch.cat([result, t])
    return result


# --------------------------------------------------------------------- one vector as bytes
def encoded_len(numel: int, bits: int, exact_tail: int = 0,
                width: int = DEFAULT_WIDTH) -> int:
    """Bytes of :func:`encode_flat` for a vector of ``numel`` floats."""
    n = numel - exact_tail
    if int(bits) == 32:
        return 4 * numel
    width, rows = _layout(n, 1, width)
    return rows * row_bytes(bits, width) + 4 * exact_tail


def encode_flat(flat: Tensor, bits: int, exact_tail: int = 0, width: int = DEFAULT_WIDTH,
                generator: Optional[torch.Generator] = None) -> bytes:
    """``flat`` (1-D float) as wire bytes: rows of ``width`` values stochastically quantized
    at ``bits`` (unbiased), then the last ``exact_tail`` values as raw fp32. For a message
    that goes through a channel of its own (the star channel of ``tma``), not a collective."""
    flat = flat.detach().float().reshape(-1)
    if int(bits) == 32:
        return flat.contiguous().numpy().tobytes()
    bits = _check_bits(bits)
    n = flat.numel() - exact_tail
    width, rows_n = _layout(n, 1, width)
    rows = torch.zeros(rows_n * width)
    rows[:n] = flat[:n]
    body = quantize(rows.view(rows_n, width), bits, generator).to_bytes().reshape(-1)
    return body.numpy().tobytes() + flat[n:].contiguous().numpy().tobytes()


def decode_flat(buf: bytes, numel: int, bits: int, exact_tail: int = 0,
                width: int = DEFAULT_WIDTH) -> Tensor:
    """Inverse of :func:`encode_flat` (a new fp32 tensor of ``numel`` values)."""
    want = encoded_len(numel, bits, exact_tail, width)
    if len(buf) != want:
        raise ValueError(f"decode_flat: {len(buf)} bytes, expected {want} ({numel} floats at "
                         f"{bits} bits): the ranks disagree on the vector's size or width")
    raw = torch.frombuffer(bytearray(buf), dtype=torch.uint8)
    if int(bits) == 32:
        return raw.view(torch.float32).clone()
    n = numel - exact_tail
    width, rows_n = _layout(n, 1, width)
    cut = rows_n * row_bytes(bits, width)
    body = dequantize(QuantizedRows.from_bytes(raw[:cut], bits, width)).reshape(-1)[:n]
    return torch.cat([body, raw[cut:].clone().view(torch.float32)])
