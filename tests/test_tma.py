"""``tma`` (RandomTMA / SuperTMA / PSGD-PA): traffic is model averaging only (analytic bytes),
averaging is the exact mean over the trainers that trained, and the run survives the death of
one of 4 trainers when started through the real launcher."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from helpers import small_graph
from quietgnn.comm.qreduce import encoded_len
from quietgnn.comm.store import HEADER_BYTES
from quietgnn.nn import ModelConfig
from quietgnn.partition import build_partitions, make_book, partition_nodes
from quietgnn.runtime.books import dataset_identity_of
from quietgnn.serial import dumps
from quietgnn.runtime.launcher import launch
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.plan import RunPlan
from quietgnn.strategies.base import TrainConfig, WorkerContext
from quietgnn.strategies.tma import TMA, LocalSampler, TMAOptions, assemble_graph

EPOCHS = 3


class _Spy(TMA):
    """TMA that remembers the model each rank contributed to the last average."""

    def _flat_state(self):
        flat = super()._flat_state()
        self.pre = flat.clone()
        return flat


def _run(comm, graph, parts, configs):
    """Run each ``(options, rank without training nodes)`` config in turn on this rank."""
    return [_run_one(comm, graph, parts, opts, no_train) for opts, no_train in configs]


def _run_one(comm, graph, parts, opts, no_train_rank):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    if comm.rank == no_train_rank:
        part.train_mask[:] = False   # this trainer has nothing to learn from: weight 0
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                        model_cfg=ModelConfig(arch="sage", hidden=16, layers=2, dropout=0.0),
                        # a budget of passes beyond the averages driven here: no period cut short
                        train_cfg=TrainConfig(epochs=1000, lr=0.01, seed=0))
    s = _Spy(ctx, TMAOptions(**opts))
    with comm.phase("setup"):
        s.setup()
    setup = comm.take_records()
    out = {"train": [], "eval": [], "pre": [], "post": [], "steps": [], "work": [], "accs": [],
           "init": s._flat_state()}
    for e in range(EPOCHS):
        comm.epoch = e
        with comm.phase("train"):
            res = s.train_epoch(e)
        out["train"].append([r.as_dict() for r in comm.take_records()])
        out["pre"].append(s.pre)
        out["post"].append(s._flat_state())
        out["steps"].append(res.steps)
        out["work"].append(res.work)
        with comm.phase("eval"):
            out["accs"].append(s.evaluate())
        out["eval"].append([r.as_dict() for r in comm.take_records()])
    s.chan.close()
    out["setup"] = [r.as_dict() for r in setup]
    out["lr"] = [g["lr"] for g in s.opt.param_groups]
    out["numel"] = s.model_numel()
    return out


P = 4
# exact averages (avg_bits 32) where a test checks fp32 sizes or the exact mean; the last
# config is the defaults' quantized average and the paper's local lr
CONFIGS = [({"mode": "full", "period_steps": 2, "avg_bits": 32}, -1),
           ({"mode": "minibatch", "period_steps": 2, "fanouts": "4,4", "batch_size": 16,
             "avg_bits": 32}, -1),
           ({"mode": "full", "period_steps": 3, "avg_bits": 32, "lr": 0}, 2),
           ({"mode": "minibatch", "period_s": 0.2, "fanouts": 3, "batch_size": 8}, -1),
           ({"mode": "minibatch", "period_epochs": 1.5, "fanouts": 3, "batch_size": 8}, -1),
           ({"mode": "full", "period_steps": 2, "avg_bits": 8}, -1),
           ({"mode": "full", "period_steps": 2}, -1)]


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=160, avg_deg=6, features=8, classes=3, seed=1)


@pytest.fixture(scope="module")
def parts(graph):
    return partition_nodes(graph, "random", P, seed=0)


@pytest.fixture(scope="module")
def runs(graph, parts):
    """All multi-process runs of this module in one spawn (process start-up dominates)."""
    res = spawn_function(_run, P, args=(graph, parts, CONFIGS))
    return [[res[r][c] for r in range(P)] for c in range(len(CONFIGS))]


@pytest.mark.parametrize("config", [0, 1], ids=["full", "minibatch"])
def test_training_traffic_is_model_averaging_only(runs, config):
    res = runs[config]
    M = res[0]["numel"]
    up = HEADER_BYTES + 4 * (M + 3)          # [theta*w | loss*w | steps | w] + header
    down = up + P                            # the sum + one "contributed" byte per rank
    for rank, r in enumerate(res):
        for e in range(EPOCHS):
            recs = r["train"][e]
            assert {x["kind"] for x in recs} == {"model_avg"}, recs
            assert len(recs) == 1 and recs[0]["phase"] == "train"
            sent, recv = recs[0]["bytes_sent"], recs[0]["bytes_recv"]
            if rank == 0:
                assert (sent, recv) == ((P - 1) * down, (P - 1) * up)
            else:
                assert (sent, recv) == (up, down)
            assert {x["kind"] for x in r["eval"][e]} == {"eval_metrics"}
            # the same bytes every epoch, whatever the accuracies: three IEEE doubles in hex
            ev = r["eval"][e][0]
            size = HEADER_BYTES + len(dumps("0" * 48))
            assert (ev["bytes_sent"], ev["bytes_recv"]) == \
                (((P - 1) * size, 0) if rank == 0 else (0, size))
            assert r["steps"][e] == 2
        # evaluation graph gathered to rank 0 once, at setup
        assert "eval_graph" in {x["kind"] for x in r["setup"]}
    # every rank reports rank 0's accuracies of the averaged model
    assert res[1]["accs"] == res[0]["accs"]
    assert all(0.0 <= a <= 1.0 for a in res[0]["accs"][-1].values())


def test_average_is_the_mean_of_the_trained_models(runs):
    res = runs[2]
    for e in range(EPOCHS):
        post = [r["post"][e] for r in res]
        for p in post[1:]:
            assert torch.equal(p, post[0])                 # everyone continues from one model
        pre = torch.stack([r["pre"][e] for r in res])
        trained = [0, 1, 3]                                # rank 2 has no training nodes
        assert not torch.allclose(pre[0], pre[1])          # trainers really diverged
        assert torch.allclose(post[0], pre[trained].mean(0), atol=1e-6)
        assert not torch.allclose(post[0], pre.mean(0), atol=1e-6)
    assert res[2]["steps"] == [0] * EPOCHS


@pytest.mark.parametrize("config,bits,tol", [(5, 8, 0.05), (6, 4, 0.3)],
                         ids=["8bit", "default-4bit"])
def test_quantized_average(runs, config, bits, tol):
    """avg_bits 8 and the default 4: each trainer sends its progress since the last average
    quantized; every rank continues from the same model, the mean of the trained ones up to
    rounding (a coordinate is off by at most its row's range over 2^b - 1 levels), and the
    messages have the analytic size."""
    res = runs[config]
    M = res[0]["numel"]
    up = HEADER_BYTES + encoded_len(M + 3, bits, exact_tail=3)
    down = up + P
    # well under the fp32 message (on this tiny model the row padding is most of it)
    assert up < (HEADER_BYTES + 4 * (M + 3)) / 2
    anchor = res[0]["init"]
    for e in range(EPOCHS):
        post = [r["post"][e] for r in res]
        for p in post[1:]:
            assert torch.equal(p, post[0])
        pre = torch.stack([r["pre"][e] for r in res])
        step = (pre - anchor).abs().max()
        err = (post[0] - pre.mean(0)).abs().max()
        assert 0 < err <= tol * step, (err, step)
        anchor = post[0]
        for rank, r in enumerate(res):
            (rec,) = r["train"][e]
            want = ((P - 1) * down, (P - 1) * up) if rank == 0 else (up, down)
            assert (rec["bytes_sent"], rec["bytes_recv"]) == want


def test_time_based_period(runs):
    """period_s: every trainer takes at least one step per period (as many as fit), and the
    period still ends in exactly one average."""
    for r in runs[3]:
        assert all(st >= 1 for st in r["steps"])
        assert all([x["kind"] for x in recs] == ["model_avg"] for recs in r["train"])
    post = [r["post"][-1] for r in runs[3]]
    assert all(torch.equal(p, post[0]) for p in post)


def test_period_in_epoch_equivalents(graph, parts, runs):
    """period_epochs (the default kind of period): each trainer makes that many passes over its
    own training nodes per average, ceil(n_train / batch_size) steps a pass."""
    passes = set()
    for rank, r in enumerate(runs[4]):
        part = build_partitions(graph, parts, ranks=[rank])[0]
        per_pass = math.ceil(int(part.train_mask.sum()) / 8)
        passes.add(per_pass)
        assert r["steps"] == [math.ceil(1.5 * per_pass)] * EPOCHS
        # work reported to the trainer: the survivors' mean steps over the ranks' mean steps
        # a pass (from the global training-node count), the same number on every rank: the
        # trainers decide from it when they all evaluate (with each trainer's own passes a
        # rank with a smaller part evaluated alone and waited out the hub's timeout)
        mean_steps = sum(x["steps"][0] for x in runs[4]) / P
        assert r["work"] == [pytest.approx(
            mean_steps / (part.num_train_global / (8 * P)))] * EPOCHS
        assert r["work"] == runs[4][0]["work"]
        assert 1.0 <= r["work"][0] <= 2.5
    assert len(passes) > 1    # the parts' passes differ in length, so the test can fail
    # full mode: one step is one pass over the trainer's share
    assert all(r["work"] == [2.0] * EPOCHS for r in runs[0])


def test_one_average_costs_no_more_than_one_gradient_allreduce(runs):
    """What the default period rests on: one average moves (almost) exactly the bytes of one
    gradient all-reduce of the same model, which ``halo`` pays every epoch; so averaging every
    k epoch-equivalents is <= ~1/k of halo's training bytes on any graph."""
    res = runs[0]
    M = res[0]["numel"]                           # no buffers: |theta| = parameter count
    allreduce = P * 2 * (P - 1) * 4 * (M + 1 + P) // P      # sync_gradients, all ranks
    average = sum(r["train"][0][0]["bytes_sent"] for r in res)
    assert allreduce <= average <= allreduce + (P - 1) * 64


def test_default_period_is_25_epoch_equivalents_at_4_bits():
    o = TMAOptions()
    assert (o.period_s, o.period_steps, o.period_epochs, o.avg_bits) == (0.0, 0, 25.0, 4)
    with pytest.raises(ValueError, match="period_epochs"):
        TMAOptions(period_epochs=0)


@pytest.mark.parametrize("M", [10_000, 92_000, 5_000_000])
def test_default_average_is_under_1_over_185_of_an_allreduce_per_epoch(M):
    """What the defaults rest on: ``halo`` pays at least one fp32 gradient all-reduce per
    epoch on any graph; a default average (4 bits, every 25 epoch-equivalents) costs at most
    1/185 of that per epoch-equivalent (b/32 plus 4 bytes per 256 values of side information
    and the headers: 1/188 at 10k values, 1/194 from ~100k on), so tma stays near or under
    1/200 of halo's bytes wherever halo sends any rows."""
    o = TMAOptions()
    for P in (2, 4, 8, 32):
        up = HEADER_BYTES + encoded_len(M + 3, o.avg_bits, exact_tail=3)
        average = (P - 1) * (2 * up + P)           # every spoke: up + down (+1 byte per rank)
        allreduce = 2 * (P - 1) * 4 * M           # ring all-reduce, all ranks together
        assert average / o.period_epochs <= allreduce / (185 if M < 50_000 else 193)


def test_local_lr_is_the_papers_unless_zero(runs):
    """options.lr (1e-3, the paper's) sets the trainers' Adam step; 0 falls back to train.lr."""
    assert TMAOptions().lr == 1e-3
    assert all(r["lr"] == [1e-3] for r in runs[6])
    assert all(r["lr"] == [0.01] for r in runs[2])            # lr 0 = train.lr (0.01 here)
    with pytest.raises(ValueError, match="options.lr"):
        TMAOptions(lr=-1)


def test_assemble_graph_rebuilds_the_whole_graph(graph):
    from quietgnn.strategies.tma.data import _part_pieces
    parts = partition_nodes(graph, "random", 3, seed=0)
    full = assemble_graph([_part_pieces(p) for p in build_partitions(graph, parts)],
                          graph.num_nodes)
    assert torch.equal(full["indptr"], graph.indptr)
    for v in range(graph.num_nodes):
        a, b = int(graph.indptr[v]), int(graph.indptr[v + 1])
        assert sorted(full["indices"][a:b].tolist()) == sorted(graph.indices[a:b].tolist())
    assert torch.equal(full["x"], graph.x) and torch.equal(full["y"], graph.y)
    assert torch.equal(full["test"], graph.test_mask)


def test_assemble_graph_keeps_sparse_features_sparse(graph):
    """Mostly-zero features are gathered as CSR and rebuilt sparse on rank 0, row for row the
    dense matrix; a mix of sparse and dense parts is rebuilt dense."""
    from quietgnn.nn import SparseFeatures
    from quietgnn.strategies.tma.data import _part_pieces
    x = graph.x * (torch.rand(graph.x.shape, generator=torch.Generator().manual_seed(0)) < 0.1)
    g = replace(graph, x=x)
    lps = build_partitions(g, partition_nodes(g, "random", 3, seed=0))
    pieces = [_part_pieces(p) for p in lps]
    assert all(isinstance(p["x"], dict) for p in pieces)
    full = assemble_graph(pieces, g.num_nodes)
    assert isinstance(full["x"], SparseFeatures) and torch.equal(full["x"].to_dense(), x)
    pieces[1]["x"] = lps[1].x                      # one part sent dense
    assert torch.equal(assemble_graph(pieces, g.num_nodes)["x"], x)


def test_sampler_blocks_are_consistent(graph):
    indptr, indices = graph.indptr, graph.indices
    s = LocalSampler(indptr, indices, [3, 5], seed=0)
    seeds = torch.tensor([0, 5, 9, 17])
    nodes, blocks = s.sample(seeds)
    assert len(blocks) == 2
    assert torch.unique(nodes).numel() == nodes.numel()     # every input node once
    assert blocks[1].n_dst == 4 and blocks[0].n_dst == blocks[1].n_src
    assert blocks[0].n_src == nodes.numel() and torch.equal(nodes[:4], seeds)
    # every sampled edge exists in the graph and rows respect the fanout
    for blk, fan, dst in ((blocks[1], 5, nodes[: blocks[1].n_dst]),):
        assert int(blk.row_count.max()) <= fan
        for i in range(blk.n_dst):
            v = int(dst[i])
            nb = set(indices[indptr[v]:indptr[v + 1]].tolist())
            got = nodes[blk.indices[blk.indptr[i]:blk.indptr[i + 1]]].tolist()
            assert set(got) <= nb and len(set(got)) == len(got)
            assert len(got) == min(len(nb), fan) or len(nb) > fan


def test_options_are_checked():
    with pytest.raises(ValueError, match="mode"):
        TMAOptions(mode="async")
    with pytest.raises(ValueError, match="fanouts"):
        TMAOptions(fanouts="10,x")
    with pytest.raises(ValueError, match="variant"):
        TMAOptions(variant="fastest")
    # a variant's partitioner is checked with the configuration, before any process starts
    from quietgnn.config import load_config
    with pytest.raises(ValueError, match="needs partition method 'random', but the "
                                         "partitioner is 'supernode'"):
        load_config(None, {"strategy": "tma", "options": {"variant": "random"}})
    load_config(None, {"strategy": "tma", "options": {"variant": "random"},
                       "partition": {"method": "random"}})
    with pytest.raises(ValueError, match="avg_bits = 3"):
        TMAOptions(avg_bits=3)
    # torch takes the hub's timeout in milliseconds, as runtime.timeout_s (1e300 overflowed)
    with pytest.raises(ValueError, match=r"fail_timeout_s = 1e\+300; expected seconds >= 0 "
                                         r"\(0: runtime.timeout_s\), at most 10000000"):
        TMAOptions(fail_timeout_s=1e300)
    assert TMAOptions(fanouts="[10, 25]").fanouts == [10, 25]


def test_run_survives_losing_one_of_four_trainers(tmp_path):
    """Rank 2 exits at its first operation of epoch 3 (before averaging): the launcher keeps
    the others, they average over 3 from then on, the run ends normally with an accuracy."""
    from quietgnn.config import load_config
    g = small_graph(n=200, avg_deg=6, features=8, classes=3, seed=2)
    g.x.add_(2 * torch.nn.functional.one_hot(g.y, 8).float())   # clearly learnable from features
    book = tmp_path / "book"
    make_book(book, g, "random", 4, seed=0)
    averages = 7                     # of 4 passes each (full mode: a pass is one step)
    cfg = load_config(None, {
        "strategy": "tma", "partition": {"parts": 4, "book": str(book)},
        "model": {"arch": "sage", "hidden": 16, "layers": 2},
        # evaluated after every average (4 epoch-equivalents), also after the loss
        "train": {"epochs": 4 * averages, "lr": 0.01, "eval_every": 1},
        "runtime": {"progress": False, "timeout_s": 60},
        "options": {"mode": "full", "period_steps": 4, "variant": "random", "lr": 0.01}})
    # the book is handed to the launcher as is (it is not the configured dataset's graph)
    plan = RunPlan(cfg=cfg, run_dir=tmp_path / "run", dataset=dataset_identity_of(cfg),
                   book=book, book_checked=True)
    summary = launch(plan, env_extra={"QUIETGNN_FAULT": "rank=2,epoch=3,action=exit"})
    assert summary is not None
    rep = summary["strategy_report"]
    assert rep["variant"] == "RandomTMA"                   # the book's method names it
    assert rep["trainers"] == 4 and rep["survivors"] == 3
    assert rep["averaged_ranks_last"] == [0, 1, 3]
    assert [x["rank"] for x in rep["lost"]] == [2] and rep["lost"][0]["epoch"] == 3
    assert rep["survivors_per_average"] == [4, 4, 4] + [3] * (averages - 3)
    assert summary["epochs"] == averages and math.isfinite(summary["test_acc"])
    # per-epoch figures are per epoch-equivalent: 4 full-graph steps per average
    assert summary["epoch_equivalents"] == 4.0 * averages
    assert summary["train_bytes_per_epoch"] == pytest.approx(summary["train_bytes"] /
                                                             (4 * averages))
    assert summary["test_acc"] > 0.7                       # 3 classes: chance is ~0.33
    # rank 2's metrics stop before epoch 3; the others have every epoch
    lines = (tmp_path / "run" / "metrics" / "rank-1.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if json.loads(x)["epoch"] >= 0]
    assert [r["extra"]["survivors"] for r in recs] == rep["survivors_per_average"]
    assert all(set(r["bytes_by_kind"]) == {"train/model_avg", "eval/eval_metrics"} for r in recs)


def test_supertma_is_the_default_variant():
    """Without --partition.method a tma run deals METIS super-nodes (SuperTMA); a method given
    on the command line still wins."""
    from quietgnn.config import load_config
    assert load_config(None, {"strategy": "tma"}).partition_method == "supernode"
    assert load_config(None, {"strategy": "tma", "partition": {"method": "random"}}
                       ).partition_method == "random"

