"""quietgnn.comm.qreduce: the quantized sum all-reduce is unbiased, identical on every rank,
exact on its tail and at 32 bits, and sends the bytes its formula says (real gloo)."""

from __future__ import annotations

import pytest
import torch

from quietgnn.comm.qreduce import (decode_flat, encode_flat, encoded_len, quantized_all_reduce,
                                   quantized_all_reduce_bytes)
from quietgnn.runtime.spawn import spawn_function

N, TAIL, REPS = 1000, 3, 150


def _vector(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    v = torch.randn(N + TAIL, generator=g) * (1 + rank)
    v[:50] = 0.25 * rank          # constant rows are sent exactly
    return v


def _repeat(comm, bits):
    torch.manual_seed(7 + comm.rank)     # rounding noise differs between ranks
    x = _vector(comm.rank)
    outs = torch.stack([quantized_all_reduce(comm, x, bits, "grad_allreduce", exact_tail=TAIL)
                        for _ in range(REPS)])
    recs = [r.as_dict() for r in comm.take_records()]
    return {"outs": outs, "sent": [r["bytes_sent"] for r in recs],
            "kinds": {r["kind"] for r in recs}, "ops": {r["op"] for r in recs}}


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_sum_is_unbiased_identical_and_counted(bits):
    P = 4
    res = spawn_function(_repeat, P, (bits,))
    exact = sum(_vector(r) for r in range(P))
    outs = res[0]["outs"]
    for r in range(1, P):   # every rank holds the same values, every time
        assert torch.equal(res[r]["outs"], outs)
    assert torch.equal(outs[:, N:], exact[N:].expand(REPS, TAIL))       # the tail is exact
    mean, sd = outs[:, :N].mean(0), outs[:, :N].std(0)
    noisy = sd > 0
    assert int(noisy.sum()) > N // 2                 # it really is quantized...
    z = (mean[noisy] - exact[:N][noisy]) / (sd[noisy] / REPS ** 0.5)
    assert float(z.abs().max()) < 5.5                 # ...and unbiased coordinate by coordinate
    assert torch.allclose(mean[~noisy], exact[:N][~noisy], atol=1e-5)
    # error scale: rows of 256 values spread over ~8 sigma, 2^b - 1 levels, two roundings
    assert float(sd.max()) < 4 * 4 * P * 8 / (2 ** bits - 1)
    for r in range(P):
        assert res[r]["kinds"] == {"grad_allreduce"} and res[r]["ops"] == {"all_to_all"}
        per_call = sum(res[r]["sent"]) // REPS
        assert per_call == quantized_all_reduce_bytes(N, P, bits, r, exact_tail=TAIL)
    # 8 bits: about a quarter of the fp32 all-reduce's 2 (P-1)/P * 4 N bytes per rank
    fp32 = 2 * (P - 1) * 4 * (N + TAIL) / P
    ratio = quantized_all_reduce_bytes(N, P, bits, 0, exact_tail=TAIL) / fp32
    assert bits / 32 < ratio < bits / 32 + 0.35


def _exact(comm):
    x = _vector(comm.rank)
    return quantized_all_reduce(comm, x, 32, "grad_allreduce")


def test_32_bits_is_the_exact_all_reduce():
    res = spawn_function(_exact, 2)
    assert torch.equal(res[0], _vector(0) + _vector(1)) and torch.equal(res[1], res[0])


def test_bad_input_names_the_problem():
    from quietgnn.comm import Communicator
    comm = Communicator(0, 1)
    with pytest.raises(ValueError, match="1-D"):
        quantized_all_reduce(comm, torch.zeros(2, 2), 8, "g")
    with pytest.raises(ValueError, match="exact_tail = 5"):
        quantized_all_reduce(comm, torch.zeros(3), 8, "g", exact_tail=5)
    with pytest.raises(ValueError, match="bits = 3"):
        quantized_all_reduce(comm, torch.ones(10), 3, "g")


def _sync(comm, poison):
    from quietgnn.strategies.common import NonFiniteError, sync_gradients
    torch.manual_seed(comm.rank)
    lin = torch.nn.Linear(300, 4)
    loss = lin(torch.randn(8, 300)).square().mean()
    loss.backward()
    exact = lin.weight.grad.clone()
    if poison and comm.rank == 1:
        lin.weight.grad[0, 0] = float("nan")
    try:
        total = sync_gradients(comm, list(lin.parameters()), loss, bits=8)
    except NonFiniteError as exc:
        return {"error": str(exc)}
    return {"loss": total, "grad": lin.weight.grad.clone(), "exact": exact, "mine": float(loss)}


def test_sync_gradients_quantized_keeps_ranks_equal_and_stops_on_nan():
    res = spawn_function(_sync, 2, (False,))
    assert torch.equal(res[0]["grad"], res[1]["grad"])
    exact = res[0]["exact"] + res[1]["exact"]
    assert not torch.equal(res[0]["grad"], exact)                    # quantized...
    assert torch.allclose(res[0]["grad"], exact, atol=0.05 * float(exact.abs().max()))
    assert res[0]["loss"] == res[1]["loss"] == pytest.approx(res[0]["mine"] + res[1]["mine"])
    res = spawn_function(_sync, 2, (True,))
    for r in res:    # the flag survives quantization: every rank stops, naming rank 1
        assert "error" in r and "rank(s) [1]" in r["error"]


@pytest.mark.parametrize("bits", [2, 8])
def test_encode_flat_is_unbiased_with_an_exact_tail(bits):
    """The single-message form (tma's star channel): decode(encode(x)) averages to x, the
    tail comes back bit for bit, and the length is encoded_len."""
    x = _vector(1)
    g = torch.Generator().manual_seed(3)
    outs = []
    for _ in range(400):
        buf = encode_flat(x, bits, exact_tail=TAIL, generator=g)
        assert len(buf) == encoded_len(x.numel(), bits, exact_tail=TAIL)
        outs.append(decode_flat(buf, x.numel(), bits, exact_tail=TAIL))
    outs = torch.stack(outs)
    assert torch.equal(outs[:, N:], x[N:].expand(400, TAIL))
    spread = outs[:, :N].std(0).max()
    assert spread > 0                                       # it really rounds
    assert (outs[:, :N].mean(0) - x[:N]).abs().max() < 5 * spread / 400 ** 0.5


def test_encode_flat_32_bits_is_exact_and_lengths_are_checked():
    x = _vector(2)
    assert torch.equal(decode_flat(encode_flat(x, 32), x.numel(), 32), x)
    buf = encode_flat(x, 4, exact_tail=TAIL)
    with pytest.raises(ValueError, match="expected"):
        decode_flat(buf[:-1], x.numel(), 4, exact_tail=TAIL)
