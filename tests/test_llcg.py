"""``llcg``: the correction step is ``halo``'s step on the whole graph (frozen local trainers
and a period of 1 give ``halo``'s run), between corrections nothing crosses, and an average is
one parameter all-reduce of its analytic size."""

from __future__ import annotations

import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function

from helpers import run_cfg, small_graph, train_run

HIDDEN = 8


def _pair(comm, graph, parts, tmp):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    halo = train_run(comm, part, run_cfg("halo", comm.world_size, 3, HIDDEN), f"{tmp}/h")
    # every call: a frozen local epoch (work 1), the average, one correction (work 1)
    llcg = train_run(comm, part, run_cfg("llcg", comm.world_size, 6, HIDDEN, period=1,
                                         local_lr=0.0), f"{tmp}/l")
    return halo[1], llcg[1], [r.get("loss") for r in halo[2] if r["epoch"] >= 0], \
        [r.get("loss") for r in llcg[2] if r["epoch"] >= 0]


@pytest.mark.parametrize("P", [1, 2, 4])
def test_frozen_trainers_and_period_1_are_halo(P, tmp_path):
    graph = small_graph(n=160)
    parts = partition_nodes(graph, "metis", P, seed=0)
    res = [_pair(Communicator(0, 1), graph, parts, tmp_path)] if P == 1 else \
        spawn_function(_pair, P, args=(graph, parts, str(tmp_path)))
    for h_par, l_par, h_loss, l_loss in res:
        assert len(l_loss) == len(h_loss) == 3
        assert l_loss == pytest.approx(h_loss, rel=1e-6)
        assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(h_par, l_par))


def _traffic(comm, graph, parts, tmp):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    cfg = run_cfg("llcg", comm.world_size, 8, HIDDEN, period=3)
    cfg.train.eval_every = 100          # the last epoch's evaluation only
    _, params, records = train_run(comm, part, cfg, f"{tmp}/t")
    return [r for r in records if r["epoch"] >= 0], sum(q.numel() for q in params)


def test_only_averages_and_corrections_cross(tmp_path):
    P = 3
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", P, seed=0)
    for records, n in spawn_function(_traffic, P, args=(graph, parts, str(tmp_path))):
        # 8 passes: local epochs 0, 1, then 2 + its correction (2 passes), 3, 4, 5 + correction
        assert [r["work"] for r in records] == [1, 1, 2, 1, 1, 2]
        avg = 2 * (P - 1) * 4 * n // P        # one all-reduce of the parameters
        for r in records:
            kinds = r.get("bytes_by_kind", {})
            train = {k: v for k, v in kinds.items() if k.startswith("train/")}
            if r["work"] == 1:
                assert train == {}            # a local epoch: nothing crosses
            else:
                assert train["train/llcg_avg"] == avg
                assert train["train/llcg_fwd"] > 0 and train["train/grad_allreduce"] > 0
        # the run ends on a correction: the evaluation needs no average of its own
        assert "eval/llcg_eval_avg" not in records[-1].get("bytes_by_kind", {})


@pytest.mark.parametrize("bad, message", [({"period": 0}, r"options.period = 0"),
                                          ({"correction_steps": -1}, r"correction_steps = -1"),
                                          ({"local_lr": -1.0}, r"local_lr = -1.0")])
def test_bad_options_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        run_cfg("llcg", 2, 2, HIDDEN, **bad)


def test_a_diverged_trainer_stops_the_average_with_a_clear_error():
    from quietgnn.partition import build_partitions as build
    from quietgnn.strategies.base import WorkerContext
    from quietgnn.strategies.common import NonFiniteError
    from quietgnn.strategies.llcg import LLCG
    cfg = run_cfg("llcg", 1, 2, HIDDEN)
    graph = small_graph(n=60)
    comm = Communicator(0, 1)
    part = build(graph, partition_nodes(graph, "metis", 1, seed=0), ranks=[0])[0]
    s = LLCG(WorkerContext(rank=0, world_size=1, comm=comm, part=part, model_cfg=cfg.model,
                           train_cfg=cfg.train), cfg.options)
    s.setup()
    with torch.no_grad():
        next(s.local.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"non-finite model parameters .*options\.local_lr"):
        s._average("llcg_avg")
