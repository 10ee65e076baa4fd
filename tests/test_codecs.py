"""The stochastic row quantizer: packing, wire size, exact constant rows, unbiasedness and the
error-variance formula (statistical, fixed seeds, bounds that a biased rounding or a wrong
variance constant would fail)."""

from __future__ import annotations

import pytest
import torch

from quietgnn.comm.codecs import (QuantizedRows, decode_rows, dequantize, encode_rows,
                                  expected_sq_error, payload_bytes, quantize, row_bytes)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_wire_bytes_per_row():
    # the spec's example: D = 256 -> 1024 B fp32, 260 / 132 / 68 B at 8 / 4 / 2 bits
    assert [row_bytes(b, 256) for b in (32, 8, 4, 2)] == [1024, 260, 132, 68]
    assert row_bytes(2, 7) == 2 + 4 and row_bytes(4, 3) == 2 + 4   # ceil(b D / 8) + side info
    x = torch.randn(10, 37)
    for b in (2, 4, 8, 32):
        q = quantize(x, b, _gen())
        assert q.to_bytes().dtype == torch.uint8
        assert q.to_bytes().shape == (10, row_bytes(b, 37)) and q.nbytes == 10 * row_bytes(b, 37)


def test_packing_layout_is_b_bits_per_value_low_bits_first():
    # values on the grid quantize deterministically: m = 0, M = 3, s = 1 at 2 bits
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 3.0]])
    q = quantize(x, 2, _gen())
    assert q.packed.tolist() == [[0 | 1 << 2 | 2 << 4 | 3 << 6, 3]]
    assert torch.equal(dequantize(q), x)
    back = QuantizedRows.from_bytes(q.to_bytes().reshape(-1), 2, 5)
    assert torch.equal(dequantize(back), x)


def test_constant_rows_are_exact_and_never_nan():
    x = torch.randn(6, 16)
    x[1] = 0.0
    x[2] = 1.2345678          # not a bf16 number: exact through the low-half payload bytes
    x[3] = -3.0e-30
    for b in (2, 4, 8):
        y = dequantize(quantize(x, b, _gen()))
        assert torch.equal(y[1:4], x[1:4]), b
        assert torch.isfinite(y).all()
    # too narrow for the low half (b D < 16): stochastic but finite and unbiased
    tiny = torch.full((4000, 3), 0.1)
    y = dequantize(quantize(tiny, 2, _gen()))
    assert torch.isfinite(y).all() and abs(float(y.mean()) - 0.1) < 1e-5


def _round_to_nearest(x, bits):
    """A *biased* reference (what the test must reject)."""
    lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    s = (2 ** bits - 1) / (hi - lo)
    return torch.round((x - lo) * s) / s + lo


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantizer_is_unbiased(bits):
    N, D = 4000, 48
    base = torch.rand(6, D, generator=_gen(1)) * 4 - 1
    reps = base.repeat(N, 1)                                   # N draws of every row
    qr = quantize(reps, bits, _gen(2))
    mean = dequantize(qr).view(N, 6, D).mean(0)
    step = 1.0 / qr.scale.float()[:6]                          # bucket width per row
    # one coordinate's rounding error has std <= step / 2, so its mean over N draws has std
    # <= step / (2 sqrt N); 5 of those is a bound the 288 coordinates all meet
    bound = 5 * step[:, None] / (2 * N ** 0.5)
    assert ((mean - base).abs() <= bound).all()
    # round-to-nearest is biased by up to half a bucket: the same bound rejects it
    assert not ((_round_to_nearest(base, bits) - base).abs() <= bound).all()


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_error_variance_matches_formula(bits):
    rows, D = 400, 256
    x = 0.5 + torch.rand(rows, D, generator=_gen(3)) * (1 + torch.rand(rows, 1, generator=_gen(4)))
    qr = quantize(x, bits, _gen(5))
    err = ((dequantize(qr) - x) ** 2).sum(1)                   # per-row squared error
    rng = x.amax(1) - x.amin(1)
    formula = torch.tensor([expected_sq_error(D, float(r), bits) for r in rng])
    ratio = float(err.sum() / formula.sum())
    # D (M - m)^2 / (6 (2^b - 1)^2): a /4 or /12 constant, or a deterministic rounding, would
    # be off by >= 30%; bf16 side information adds < 1%
    assert 0.97 < ratio < 1.03, ratio
    # exact conditional expectation given the sent (m, s): sum_k f_k (1 - f_k) / s^2
    s = qr.scale.float()[:, None]
    f = torch.frac((x - qr.mn.float()[:, None]) * s)
    exact = float((f * (1 - f) / s ** 2).sum())
    assert abs(float(err.sum()) / exact - 1) < 0.02


def test_mixed_width_payload_roundtrip():
    x = torch.randn(40, 20)
    x[7] = 0.0
    widths = torch.tensor([2, 4, 8, 32] * 10)
    payload, ranges = encode_rows(x, widths, _gen())
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == payload_bytes(widths, 20) == 10 * sum(row_bytes(b, 20)
                                                                    for b in (2, 4, 8, 32))
    y, ranges_rx = decode_rows(payload, widths, 20)
    assert torch.equal(ranges, ranges_rx)          # the receiver sees what the sender traced
    assert torch.equal(y[widths == 32], x[widths == 32]) and torch.equal(y[7], x[7])
    for b in (2, 4, 8):
        sel = widths == b
        step = (x[sel].amax(1) - x[sel].amin(1)) / (2 ** b - 1)
        assert ((y[sel] - x[sel]).abs() <= step[:, None] * 1.01).all()


def test_errors_are_clear():
    with pytest.raises(ValueError, match="bits"):
        quantize(torch.randn(2, 3), 3)
    with pytest.raises(ValueError, match="NaN"):
        quantize(torch.tensor([[1.0, float("nan")]]), 4)
    with pytest.raises(ValueError, match="disagree"):
        decode_rows(torch.zeros(5, dtype=torch.uint8), torch.tensor([8]), 4)


@pytest.mark.parametrize("d", [5, 7, 3703])
def test_single_row_of_odd_byte_length_decodes(d):
    # one row from a peer, ceil(b D / 8) + 4 odd: the side information must still be readable
    x = torch.randn(3, d)
    for b in (2, 4, 8):
        w = torch.full((1,), b)
        payload, _ = encode_rows(x[:1], w, _gen())
        y, _ = decode_rows(payload, w, d)
        assert y.shape == (1, d) and torch.isfinite(y).all()
    # and inside a mixed payload, at an odd offset
    w = torch.tensor([8, 32, 4])
    payload, _ = encode_rows(x, w, _gen())
    y, _ = decode_rows(payload, w, d)
    assert torch.equal(y[1], x[1])
