"""``train_on``: the trainer's loop on an open communicator, as the benchmark studies use it
(several configurations in one process group). It must give what ``quietgnn train`` gives,
and a configuration trained after another must not see the first one's records, traffic
totals or sockets."""

from __future__ import annotations

import pytest

import quietgnn
from quietgnn.config import load_config
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.runtime.trainer import train_on

from helpers import small_graph

EPOCHS = 3


def _cfg(strategy: str, parts: int, **options):
    return load_config(None, {"strategy": strategy, "partition": {"parts": parts},
                              "model": {"hidden": 8}, "options": options,
                              "train": {"epochs": EPOCHS, "eval_every": 1, "eval_mode": "exact"},
                              "runtime": {"progress": False}})


def _twice(comm, graph, parts, strategy, options, tmp):
    """The same configuration trained twice in this process group; both runs' records."""
    import torch
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = []
    for i in range(2):
        t = train_on(comm, part, _cfg(strategy, comm.world_size, **options), f"{tmp}/{i}",
                     keep_records=True)
        out.append({"records": t.records, "sent": dict(comm.sent_by_class),
                    "summary": t.summary})
    return out


def _essence(records):
    return [(r["epoch"], r.get("loss"), r["bytes"], r.get("bytes_by_kind"), r.get("val_acc"),
             r.get("test_acc")) for r in records]


def _spawn_twice(strategy, options, tmp):
    graph = small_graph()
    cfg = _cfg(strategy, 2, **options)   # the partitioner quietgnn train would use
    parts = partition_nodes(graph, cfg.partition_method, 2, seed=cfg.partition.seed)
    return spawn_function(_twice, 2, args=(graph, parts, strategy, options, str(tmp)))


@pytest.fixture(scope="module")
def halo_twice(tmp_path_factory):
    return _spawn_twice("halo", {}, tmp_path_factory.mktemp("halo"))


@pytest.mark.parametrize("strategy", ["halo", "tma"])
def test_a_second_run_in_the_same_group_repeats_the_first(tmp_path, request, strategy):
    per_rank = request.getfixturevalue("halo_twice") if strategy == "halo" else \
        _spawn_twice("tma", {"period_epochs": 1.0}, tmp_path)
    for first, second in per_rank:
        assert len(first["records"]) == EPOCHS + 1 and first["records"][0]["epoch"] == -1
        assert first["records"][0]["bytes"]["setup"]["sent"] > 0
        assert _essence(second["records"]) == _essence(first["records"])
        # totals start from zero for each run (control: the summary's gather pickles a
        # dict of floats and counts, whose size moves by a byte or two)
        control = [r["sent"].pop("control") for r in (first, second)]
        assert second["sent"] == first["sent"] and abs(control[0] - control[1]) < 16
    assert per_rank[0][1]["summary"]["train_bytes"] == per_rank[0][0]["summary"]["train_bytes"]
    assert per_rank[1][0]["summary"] is None       # the summary is rank 0's


def test_it_trains_what_quietgnn_train_trains(tmp_path, halo_twice):
    run = quietgnn.train(small_graph(), strategy="halo", parts=2, epochs=EPOCHS, hidden=8,
                         train={"eval_every": 1, "eval_mode": "exact"},
                         out=str(tmp_path / "runs"), runtime={"progress": False})
    theirs = run.metrics
    ours = halo_twice[0][0]["records"][1:]
    assert [r["loss"] for r in ours] == pytest.approx([r.loss for r in theirs], rel=1e-6)
    assert [r["bytes"]["train"] for r in ours] == [r.bytes["train"] for r in theirs]
    assert [r["test_acc"] for r in ours] == [r.test_acc for r in theirs]


def test_a_failed_set_up_reports_its_own_error(tmp_path):
    """tma's set-up fails before it opens its hub: the run's error is that one, not one from
    releasing a hub that was never opened."""
    import numpy as np
    from quietgnn.comm import Communicator
    graph = small_graph()
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    cfg = _cfg("tma", 1, mode="minibatch", fanouts="5,5")
    cfg.options.fanouts = [5, 5, 5]     # 3 fanouts, 2 layers: past the config's own check
    with pytest.raises(ValueError, match="fanouts"):
        train_on(Communicator(0, 1), part, cfg, tmp_path)


@pytest.mark.parametrize("strategy", ["centralized", "halo", "adaqp", "grappa", "tma", "retexo",
                                      "minibatch", "bns", "pipegcn", "sancus"])
def test_epochs_buy_every_strategy_the_same_passes(strategy, tmp_path):
    """``--epochs N``: N passes over the training set for every strategy (tma: its averages
    fall every period_epochs = 25 passes, the last one cut short)."""
    import torch

    from quietgnn.comm import Communicator
    graph = small_graph()
    part = build_partitions(graph, partition_nodes(graph, "random", 1, seed=0), ranks=[0])[0]
    for epochs in (3, 30):
        cfg = load_config(None, {"strategy": strategy, "partition": {"parts": 1},
                                 "model": {"hidden": 8}, "train": {"epochs": epochs,
                                                                   "eval_every": 1000},
                                 "runtime": {"progress": False}})
        torch.manual_seed(0)
        t = train_on(Communicator(0, 1), part, cfg, tmp_path / f"{epochs}", keep_records=True)
        work = sum(r["work"] for r in t.records if r["epoch"] >= 0)
        assert work == pytest.approx(epochs, rel=0.05), (strategy, epochs, work)
        assert t.summary["epoch_equivalents"] == pytest.approx(epochs, rel=0.05)
        if strategy == "tma":   # averages: one after 3 passes; after 25 and after 30
            assert len([r for r in t.records if r["epoch"] >= 0]) == (1 if epochs == 3 else 2)
