"""Stochastic per-row quantization of message rows (AdaQP's codec), usable by any strategy.

Wan, Zhao, Wu, "Adaptive Message Quantization and Parallelization for Distributed Full-graph
GNN Training", MLSys 2023 (arXiv 2306.01381), section 3.

A row ``x in R^D`` is sent at ``b in {2, 4, 8}`` bits as::

    m = min x (rounded *down* to bf16),  s = (2^b - 1) / (max x - m) (rounded *down* to bf16)
    q = clamp(floor((x - m) * s + u), 0, 2^b - 1),   u ~ U[0, 1)      (stochastic rounding)
    x_hat = q / s + m

``E[q] = (x - m) s`` exactly, so ``E[x_hat] = x`` (unbiased); the error of one coordinate with
fractional part ``f`` of ``(x - m) s`` has variance ``f (1 - f) / s^2``, i.e. on average (``f``
uniform) ``1 / (6 s^2)``: ``E||x_hat - x||^2 ~= D (M - m)^2 / (6 (2^b - 1)^2)``.

Rounding the side information *down* keeps ``(x - m) s`` inside ``[0, 2^b - 1]``, so the clamp
never cuts (no bias from bf16). What is given up: the effective range ``M - m_bf16`` can exceed
``M - m`` by one bf16 ulp of ``m`` (relative 2^-8), which raises the variance of rows whose
spread is tiny compared with their offset.

Wire format of one row (``b < 32``): ``[m: bf16 (2 B) | s: bf16 (2 B) | ceil(b D / 8) packed
bytes]``; values are packed ``8 / b`` per byte, low bits first, each row starting on a byte
boundary. ``b = 32`` sends the raw fp32 row (``4 D`` bytes, no side information).

Constant rows (``max x = min x``) take an exact path: ``s = 0`` marks them, the ``m`` field
holds the high 16 bits of the fp32 value and the first two payload bytes its low 16 bits, so
the row is reproduced bit for bit (zero rows, the common case after ReLU or for unused
gradients, cost nothing extra). With fewer than two payload bytes (``b D < 16``) a constant row
whose value is not a bf16 number takes the stochastic path instead (still unbiased).

A block of rows with *mixed* bit-widths (what adaptive bit assignment produces) is encoded by
:func:`encode_rows` into one flat ``uint8`` payload (rows grouped by width: 2, 4, 8, 32 bits,
ascending row order within a width) that can go through ``Communicator.all_to_all`` as a 1-D
``uint8`` block; the receiver, who knows the per-row widths, decodes it with
:func:`decode_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["QuantizedRows", "quantize", "dequantize", "row_bytes", "payload_bytes",
           "encode_rows", "decode_rows", "expected_sq_error", "SUPPORTED_BITS"]

#: widths a row can be sent at (32 = uncompressed fp32)
SUPPORTED_BITS = (2, 4, 8, 32)
SIDE_BYTES = 4  # m and s, bf16 each


def _check_bits(bits: int) -> int:
    b = int(bits)
    if b not in SUPPORTED_BITS:
        raise ValueError(f"bits = {bits!r}; expected one of {SUPPORTED_BITS} (32 = no "
                         f"quantization)")
    return b


def row_bytes(bits: int, d: int) -> int:
    """Wire bytes of one row of width ``d`` at ``bits``: ``ceil(b d / 8) + 4`` (``4 d`` at 32)."""
    b = _check_bits(bits)
    return 4 * d if b == 32 else (b * d + 7) // 8 + SIDE_BYTES


def payload_bytes(bits_per_row: Tensor, d: int) -> int:
    """Wire bytes of a mixed-width block (sum of :func:`row_bytes`)."""
    if bits_per_row.numel() == 0:
        return 0
    counts = torch.bincount(bits_per_row.to(torch.int64), minlength=33)
    return sum(int(counts[b]) * row_bytes(b, d) for b in SUPPORTED_BITS)


def _bf16_down(v: Tensor) -> Tensor:
    """fp32 -> bf16 rounded toward -inf (so that ``bf16(v) <= v``)."""
    r = v.to(torch.bfloat16)
    up = r.float() > v
    if bool(up.any()):
        r = torch.where(up, torch.nextafter(r, torch.full_like(r, float("-inf"))), r)
    return r


@dataclass
class QuantizedRows:
    """``n`` rows of width ``d`` at ``bits``: ``packed`` uint8 ``[n, ceil(b d / 8)]``, ``mn`` and
    ``scale`` bf16 ``[n]`` (``scale == 0``: constant row, exact). At 32 bits ``packed`` holds the
    raw fp32 bytes ``[n, 4 d]`` and ``mn``/``scale`` are empty."""

    bits: int
    n: int
    d: int
    packed: Tensor
    mn: Tensor
    scale: Tensor

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (what :meth:`to_bytes` returns)."""
        return self.n * row_bytes(self.bits, self.d)

    def to_bytes(self) -> Tensor:
        """uint8 ``[n, row_bytes]``: per row ``[m | s | packed]`` (or the raw fp32 row)."""
        if self.bits == 32:
            return self.packed
        side = torch.stack([self.mn, self.scale], 1).contiguous().view(torch.uint8)  # [n, 4]
        return torch.cat([side.view(self.n, SIDE_BYTES), self.packed], 1)

    @classmethod
    def from_bytes(cls, buf: Tensor, bits: int, d: int) -> "QuantizedRows":
        """Inverse of :meth:`to_bytes`; ``buf`` is uint8 ``[n, row_bytes]`` or flat."""
        b = _check_bits(bits)
        rb = row_bytes(b, d)
        if buf.dtype != torch.uint8 or buf.numel() % rb:
            raise ValueError(f"from_bytes: got {buf.numel()} bytes of {buf.dtype}, expected uint8 "
                             f"and a multiple of {rb} (rows of width {d} at {b} bits)")
        buf = buf.reshape(-1, rb)
        n = buf.shape[0]
        if b == 32:
            return cls(32, n, d, buf, buf.new_empty(0), buf.new_empty(0))
        # a fresh [n, 4] copy: aligned and densely strided even for a single row of odd
        # length (clone() of a one-row slice keeps its stride, which view() rejects)
        side = torch.empty(n, SIDE_BYTES, dtype=torch.uint8, device=buf.device).copy_(
            buf[:, :SIDE_BYTES])
        side = side.view(torch.bfloat16)  # [n, 2]
        return cls(b, n, d, buf[:, SIDE_BYTES:], side[:, 0].contiguous(),
                   side[:, 1].contiguous())

    def ranges(self) -> Tensor:
        """fp32 ``[n]``: the effective range ``(2^b - 1) / s`` of every row (0 for constant
        rows); what the receiver knows of a row's spread without decoding it."""
        if self.bits == 32:
            x = _as_f32(self.packed, self.n, self.d)
            return (x.amax(1) - x.amin(1)) if self.d else x.new_zeros(self.n)
        s = self.scale.float()
        return torch.where(s > 0, (2 ** self.bits - 1) / s.clamp(min=1e-38), torch.zeros_like(s))


def _as_f32(packed: Tensor, n: int, d: int) -> Tensor:
    """View raw fp32 row bytes as floats (copying when the slice is not 4-byte aligned)."""
    p = packed.contiguous()
    if p.storage_offset() % 4:
        p = p.clone()
    return p.view(torch.float32).view(n, d)


def _pack(q: Tensor, bits: int) -> Tensor:
    """uint8 codes ``[n, d]`` (< 2^bits) -> ``[n, ceil(bits d / 8)]``, low bits first."""
    n, d = q.shape
    per = 8 // bits
    if per == 1:
        return q
    pad = (-d) % per
    if pad:
        q = torch.cat([q, q.new_zeros(n, pad)], 1)
    q = q.view(n, -1, per)
    out = q[..., 0].clone()
    for k in range(1, per):       # uint8 shifts and ors: no widening, one pass per slot
        out |= q[..., k] << (bits * k)
    return out


def _unpack(p: Tensor, bits: int, d: int) -> Tensor:
    n = p.shape[0]
    per = 8 // bits
    if per == 1:
        return p[:, :d]
    mask = 2 ** bits - 1
    q = torch.stack([(p >> (bits * k)) & mask for k in range(per)], -1)
    return q.view(n, -1)[:, :d]


def quantize(x: Tensor, bits: int, generator: Optional[torch.Generator] = None) -> QuantizedRows:
    """Stochastically quantize every row of ``x`` (``[n, d]`` float) to ``bits`` (see module
    docstring). ``generator`` draws the rounding noise (pass one to make runs reproducible)."""
    b = _check_bits(bits)
    if x.dim() != 2:
        raise ValueError(f"quantize: expected a 2-D [rows, width] tensor, got shape "
                         f"{tuple(x.shape)}")
    x = x.detach().float().contiguous()
    n, d = x.shape
    if b == 32:
        return QuantizedRows(32, n, d, x.view(torch.uint8).view(n, 4 * d),
                             x.new_empty(0, dtype=torch.uint8), x.new_empty(0, dtype=torch.uint8))
    if n == 0 or d == 0:
        return QuantizedRows(b, n, d, x.new_zeros((n, (b * d + 7) // 8), dtype=torch.uint8),
                             x.new_zeros(n, dtype=torch.bfloat16),
                             x.new_zeros(n, dtype=torch.bfloat16))
    if not bool(torch.isfinite(x).all()):
        raise ValueError("quantize: the rows contain NaN or Inf; a diverged model cannot be "
                         "quantized (lower the learning rate or check the inputs)")
    levels = 2 ** b - 1
    lo, hi = x.amin(1), x.amax(1)
    nbytes_payload = (b * d + 7) // 8
    const = hi == lo
    bits32 = lo.view(torch.int32)
    lo16 = bits32 & 0xFFFF
    if nbytes_payload < 2:  # no room for the low half: exact only if the value is a bf16
        const = const & (lo16 == 0)
    mn = _bf16_down(lo)
    rng = hi - mn.float()
    scale = _bf16_down(torch.where(const | (rng <= 0), torch.zeros_like(rng),
                                   levels / rng.clamp(min=1e-38)))
    # a range so wide that s underflows bf16 cannot be represented: clamp (tiny bias, never NaN)
    bad = ~const & (scale.float() <= 0)
    if bool(bad.any()):
        scale = torch.where(bad, torch.full_like(scale, 2.0 ** -133), scale)
    s = scale.float()
    # v = (x - m) s + u >= 0, so truncation is floor; clamp guards float rounding at the top
    v = torch.sub(x, mn.float()[:, None]).mul_(s[:, None])
    # the noise is drawn where the generator lives (a host generator on a GPU run: the same
    # draws as on the CPU, so both runs round alike) and added where the rows are
    u = torch.rand(x.shape, generator=generator,
                   device=generator.device if generator is not None else x.device)
    v.add_(u.to(x.device)).clamp_(0, levels)
    q = v.to(torch.uint8)
    any_const = bool(const.any())
    if any_const:
        q[const] = 0
    packed = _pack(q, b)
    if any_const:
        # exact constant rows: m = high half of the fp32 value, low half in payload bytes 0..1
        hi16 = (bits32 >> 16).to(torch.int16)
        mn = torch.where(const, hi16.view(torch.bfloat16), mn)
        scale = torch.where(const, torch.zeros_like(scale), scale)
        if nbytes_payload >= 2:
            low = lo16[const].to(torch.int32)
            packed[const, 0] = (low & 0xFF).to(torch.uint8)
            packed[const, 1] = ((low >> 8) & 0xFF).to(torch.uint8)
    return QuantizedRows(b, n, d, packed, mn, scale)


def dequantize(qr: QuantizedRows) -> Tensor:
    """fp32 ``[n, d]``: ``q / s + m`` (constant rows exactly)."""
    n, d, b = qr.n, qr.d, qr.bits
    if b == 32:
        return _as_f32(qr.packed, n, d).clone()
    if n == 0 or d == 0:
        return torch.zeros(n, d, device=qr.packed.device)
    s = qr.scale.float()
    const = s == 0
    q = _unpack(qr.packed, b, d).float()
    out = q / torch.where(const, torch.ones_like(s), s)[:, None] + qr.mn.float()[:, None]
    if bool(const.any()):
        hi = qr.mn[const].view(torch.int16).to(torch.int32) << 16
        if qr.packed.shape[1] >= 2:
            p = qr.packed[const].to(torch.int32)
            hi = hi | p[:, 0] | (p[:, 1] << 8)
        out[const] = hi.view(torch.float32)[:, None].expand(-1, d)
    return out


def encode_rows(x: Tensor, bits_per_row: Tensor,
                generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
    """Encode the rows of ``x`` (``[n, d]``) at per-row widths ``bits_per_row`` (int ``[n]``,
    values in :data:`SUPPORTED_BITS`) into one flat uint8 payload of
    :func:`payload_bytes` bytes. Returns ``(payload, ranges)`` with ``ranges`` the effective
    per-row range (as the receiver will see it)."""
    n, d = x.shape
    if bits_per_row.shape != (n,):
        raise ValueError(f"encode_rows: {bits_per_row.numel()} widths for {n} rows")
    bits_per_row = bits_per_row.to(x.device)   # the widths select rows where the rows are
    if n and bool((bits_per_row == bits_per_row[0]).all()):   # one width: no regrouping
        qr = quantize(x, int(bits_per_row[0]), generator)
        return qr.to_bytes().reshape(-1), qr.ranges()
    parts, ranges = [], torch.zeros(n, device=x.device)
    for b in SUPPORTED_BITS:
        sel = torch.nonzero(bits_per_row == b).flatten()
        if sel.numel():
            qr = quantize(x[sel], b, generator)
            parts.append(qr.to_bytes().reshape(-1))
            ranges[sel] = qr.ranges()
    if len(parts) != sum(1 for b in SUPPORTED_BITS if bool((bits_per_row == b).any())) or \
            sum(p.numel() for p in parts) != payload_bytes(bits_per_row, d):
        raise ValueError(f"encode_rows: widths must be in {SUPPORTED_BITS}, got "
                         f"{sorted(set(bits_per_row.tolist()))}")
    payload = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=x.device)
    return payload, ranges


def decode_rows(payload: Tensor, bits_per_row: Tensor, d: int,
                with_ranges: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """Inverse of :func:`encode_rows`: ``(rows [n, d] fp32, ranges [n] or None)``."""
    n = int(bits_per_row.numel())
    want = payload_bytes(bits_per_row, d)
    if payload.numel() != want:
        raise ValueError(f"decode_rows: payload has {payload.numel()} bytes, the widths say "
                         f"{want}; sender and receiver disagree on the bit assignment")
    if n and bool((bits_per_row == bits_per_row[0]).all()):
        qr = QuantizedRows.from_bytes(payload, int(bits_per_row[0]), d)
        return dequantize(qr), (qr.ranges() if with_ranges else None)
    bits_per_row = bits_per_row.to(payload.device)
    out, ranges = torch.empty(n, d, device=payload.device), torch.zeros(n, device=payload.device)
    off = 0
    for b in SUPPORTED_BITS:
        sel = torch.nonzero(bits_per_row == b).flatten()
        if sel.numel():
            k = sel.numel() * row_bytes(b, d)
            qr = QuantizedRows.from_bytes(payload[off:off + k], b, d)
            out[sel] = dequantize(qr)
            if with_ranges:
                ranges[sel] = qr.ranges()
            off += k
    return out, (ranges if with_ranges else None)


def expected_sq_error(d: int, rng: float, bits: int) -> float:
    """``D (M - m)^2 / (6 (2^b - 1)^2)``: mean squared error of one row whose values are spread
    uniformly within their quantization buckets."""
    return d * rng ** 2 / (6 * (2 ** bits - 1) ** 2) if bits < 32 else 0.0

