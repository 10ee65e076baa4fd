"""quietgnn.comm.lowrank: the rank-r (PowerSGD) gradient all-reduce is exact on sums of rank
<= r, keeps every replica identical, loses nothing over time (error feedback telescopes), sends
the analytic number of bytes, and stops every rank together on a non-finite gradient (real
gloo processes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quietgnn.comm import Communicator
from quietgnn.comm.lowrank import LowRankReducer, lowrank_floats
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.common import NonFiniteError, sync_gradients

SHAPES = [(16, 40), (16,), (3, 16), (40, 24)]   # (3, 16) is too small to be worth factoring
RANK = 2


def _low_rank_grads(rank: int) -> list[torch.Tensor]:
    """Gradients whose sum over ranks has rank <= RANK in every compressed matrix: shared
    column/row spaces, a different core per rank."""
    g = torch.Generator().manual_seed(11)
    bases = [(torch.randn(n, RANK, generator=g), torch.randn(m, RANK, generator=g))
             for n, m in ((16, 40), (40, 24))]
    mine = torch.Generator().manual_seed(200 + rank)
    out = []
    for s in SHAPES:
        if len(s) == 2 and s[0] != 3:
            u, v = bases[0] if s == (16, 40) else bases[1]
            out.append(u @ torch.randn(RANK, RANK, generator=mine) @ v.t())
        else:
            out.append(torch.randn(s, generator=mine))
    return out


def _full_rank_grads(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _run(comm, steps, low):
    red = LowRankReducer(SHAPES, RANK, seed=3)
    outs, tails = [], []
    for t in range(steps):
        grads = _low_rank_grads(comm.rank) if low else _full_rank_grads(comm.rank, t % 2)
        tail = torch.tensor([float(comm.rank), 1.0])
        summed, tail_sum = red.reduce(comm, grads, tail, "grad_allreduce")
        outs.append(summed)
        tails.append(tail_sum)
    recs = [r.as_dict() for r in comm.take_records()]
    return {"outs": outs, "tails": tails, "err": red.err, "q": red.q,
            "sent": [(r["op"], r["kind"], r["bytes_sent"]) for r in recs]}


def test_sum_of_low_rank_matrices_is_exact_and_identical_everywhere():
    P = 3
    res = spawn_function(_run, P, (2, True))
    exact = [sum(_low_rank_grads(r)[i] for r in range(P)) for i in range(len(SHAPES))]
    for r in range(P):
        for t in range(2):
            for got, ref, ref0 in zip(res[r]["outs"][t], exact, res[0]["outs"][t]):
                assert torch.allclose(got, ref, atol=1e-4), "rank <= r: one power step is exact"
                assert torch.equal(got, ref0)             # replicas are bit-identical
            assert torch.equal(res[r]["tails"][t], torch.tensor([3.0, 3.0]))   # exact tail
        for e in res[r]["err"]:
            assert e is None or float(e.abs().max()) < 1e-4   # nothing left behind


def test_error_feedback_telescopes_and_stays_bounded():
    P, T = 2, 12
    res = spawn_function(_run, P, (T, False))
    # sum over steps of what was applied = sum of what was fed in - what is still held back
    fed = [sum(_full_rank_grads(r, t % 2)[i] for r in range(P) for t in range(T))
           for i in range(len(SHAPES))]
    applied = [sum(res[0]["outs"][t][i] for t in range(T)) for i in range(len(SHAPES))]
    for i, s in enumerate(SHAPES):
        held = sum(res[r]["err"][i] for r in range(P)) if res[0]["err"][i] is not None else 0
        assert torch.allclose(applied[i] + held, fed[i], atol=1e-3)
        if res[0]["err"][i] is not None:
            # a rank-2 approximation of a full-rank 16 x 40 matrix drops most of it each step,
            # yet the memory does not grow with T: bounded by a few steps' worth
            assert float(held.norm()) < 4 * float(fed[i].norm()) / T * 2
            assert not torch.allclose(res[0]["outs"][0][i],
                                      sum(_full_rank_grads(r, 0)[i] for r in range(P)),
                                      atol=1e-2)   # it really is compressed
        else:   # sent exactly
            assert torch.allclose(applied[i], fed[i], atol=1e-4)


def test_bytes_are_the_analytic_message_sizes():
    P, T = 4, 3
    res = spawn_function(_run, P, (T, True))
    p_f, exact, q_f = lowrank_floats(SHAPES, RANK)
    assert (p_f, exact, q_f) == (16 * 2 + 40 * 2, 16 + 48, 40 * 2 + 24 * 2)
    for r in range(P):
        sent = res[r]["sent"]
        assert [(op, kind) for op, kind, _ in sent] == [("all_reduce", "grad_allreduce")] * 2 * T
        first = 2 * (P - 1) * 4 * (p_f + exact + 2) // P
        second = 2 * (P - 1) * 4 * q_f // P
        assert [b for _, _, b in sent] == [first, second] * T
    full = sum(torch.Size(s).numel() for s in SHAPES)
    assert p_f + exact + q_f < full / 3


def _nan_step(comm):
    torch.manual_seed(0)
    model = nn.Linear(40, 16)
    red = LowRankReducer([p.shape for p in model.parameters()], 1, seed=0)
    loss = model(torch.randn(5, 40)).pow(2).mean()
    loss.backward()
    if comm.rank == 1:
        model.weight.grad[0, 0] = float("nan")
    try:
        sync_gradients(comm, list(model.parameters()), loss, lowrank=red)
    except NonFiniteError as e:
        return str(e), comm.take_records()
    return "no error", comm.take_records()


def test_a_nan_on_one_rank_stops_every_rank_before_the_second_all_reduce():
    for msg, recs in spawn_function(_nan_step, 2):
        assert "rank(s) [1]" in msg
        assert len(recs) == 1          # the flags rode in the first all-reduce


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="rank = 0"):
        LowRankReducer(SHAPES, 0)
    red = LowRankReducer(SHAPES, RANK)
    with pytest.raises(ValueError, match="gradient shapes"):
        red.reduce(Communicator(0, 1), [torch.zeros(2, 2)], torch.zeros(1), "g")
    other = LowRankReducer(SHAPES, RANK + 1)
    with pytest.raises(ValueError, match="same grad_rank"):
        red.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="exact gradients"):
        red.load_state_dict(None)       # a checkpoint of a run without grad_rank


# ---------------------------------------------------------------------- in retexo
def _retexo(comm, graph, parts, resume_at):
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    from quietgnn.strategies.retexo import Retexo, RetexoOptions
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]

    def fresh():
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                            model_cfg=ModelConfig(arch="gcn", hidden=16, layers=2, dropout=0.0),
                            train_cfg=TrainConfig(seed=3, lr=0.01, epochs=6),
                            log=lambda m: None)
        s = Retexo(ctx, RetexoOptions(rounds_per_layer=4, grad_rank=1))
        s.setup()
        return s

    def drive(s, start, stop):
        out, losses = [], []
        for e in range(start, stop):
            comm.epoch = e
            with comm.phase("train"):
                losses.append(s.train_epoch(e).loss)
            out.append([(r.kind, r.op, r.bytes_sent) for r in comm.take_records()])
        return out, losses

    s = fresh()
    log, losses = drive(s, 0, 8)
    shapes = [[tuple(p.shape) for p in m.parameters()] for m in s.layers]
    final = [p.detach().clone() for p in s.layers.parameters()]
    half = fresh()
    drive(half, 0, resume_at)
    state = half.state_dict()
    again = fresh()
    again.load_state_dict(state)
    _, losses2 = drive(again, resume_at, 8)
    resumed = [p.detach().clone() for p in again.layers.parameters()]
    return {"log": log, "shapes": shapes, "final": final, "resumed": resumed,
            "losses": losses[resume_at:], "resumed_losses": losses2}


def test_retexo_rounds_send_the_low_rank_factors_and_resume_exactly():
    from quietgnn.partition import partition_nodes
    from helpers import small_graph
    graph = small_graph(n=120, avg_deg=4, features=40, seed=1)
    P = 2
    parts = partition_nodes(graph, "random", P, seed=0)
    for res in spawn_function(_retexo, P, (graph, parts, 1)):   # resumes inside layer 0
        for e, recs in enumerate(res["log"]):
            p_f, exact, q_f = lowrank_floats(res["shapes"][e // 4], 1)
            grads = [b for kind, op, b in recs if kind == "grad_allreduce"]
            assert p_f > 0    # the 16 x 40 input weight (layer 0) and 3 x 16 (layer 1)
            want = [2 * (P - 1) * 4 * (p_f + exact + 1 + P + 1) // P]
            if q_f:
                want.append(2 * (P - 1) * 4 * q_f // P)
            assert grads == want, e
        # the error memory and Q are restored: every later round's loss is the unbroken one's
        assert res["resumed_losses"] == res["losses"]
        for a, b in zip(res["final"], res["resumed"]):
            assert torch.equal(a, b)
