"""Data residency (``runtime.residency``): what each op declares it carries, refusals at setup,
forbidden traffic stopped before the send on every rank, and a run's per-class byte records.
Real gloo processes on 127.0.0.1 and one real ``quietgnn train`` run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from quietgnn.comm import ResidencyError, Traffic
from quietgnn.comm.traffic import allowed, forbidden
from quietgnn.config import load_config
from quietgnn.nn import ModelConfig
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.base import (EpochResult, Strategy, TrainConfig, WorkerContext,
                                      available_strategies)
from quietgnn.strategies.retexo import Retexo, RetexoOptions

from helpers import small_graph


def test_levels_forbid_what_they_promise():
    assert set(forbidden("none")) == set()
    assert {"features", "labels", "undeclared"} == set(forbidden("features"))
    assert set(allowed("strict")) == {"embeddings", "gradients", "parameters", "control"}
    with pytest.raises(ValueError, match="runtime.residency = 'open'.*none"):
        allowed("open")


# ---------------------------------------------------------------------- refusals at setup
def _cfg(strategy, level="features", method="given", **extra):
    return load_config(None, {"strategy": strategy, "runtime": {"residency": level},
                              "partition": {"method": method, "parts": 2, **extra}})


@pytest.mark.parametrize("strategy", ["halo", "minibatch", "adaqp", "grappa", "tma",
                                      "centralized"])
@pytest.mark.parametrize("level", ["features", "strict"])
def test_strategy_needing_forbidden_traffic_is_refused_in_one_line(strategy, level):
    with pytest.raises(ValueError) as err:
        _cfg(strategy, level)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"runtime.residency = {level}: strategy {strategy!r} ")
    assert msg.endswith(f"strategies allowed under {level}: retexo")
    cls = available_strategies()[strategy]
    assert cls.residency_traffic in msg and level not in cls.residency_levels
    if strategy in ("halo", "minibatch"):
        assert "input features" in msg


@pytest.mark.parametrize("method", ["metis", "random", "supernode", "hash", "ldg"])
def test_placing_partitioner_is_refused(method):
    with pytest.raises(ValueError) as err:
        _cfg("retexo", "features", method)
    msg = str(err.value)
    assert "\n" not in msg and f"partitioner {method!r} would place nodes" in msg
    assert "--partitioner given" in msg
    # the strategy's default partitioner (metis) is refused alike
    with pytest.raises(ValueError, match="'metis' would place nodes"):
        load_config(None, {"strategy": "retexo", "runtime": {"residency": "strict"}})


def test_allowed_combinations_and_none_change_nothing():
    assert _cfg("retexo", "strict").runtime.residency == "strict"
    assert _cfg("halo", "none", "metis").runtime.residency == "none"
    assert load_config(None, {}).runtime.residency == "none"


# ---------------------------------------------------------------------- the communicator
class _LeakyStrategy(Strategy):
    """Test double: claims every level, then, after a legal op, sends its boundary nodes' raw
    input features straight through the communicator."""

    name = "leaky"
    residency_levels = ("none", "features", "strict")

    def setup(self) -> None:
        c = self.ctx.comm
        c.all_reduce(torch.ones(1), "warmup", carries=Traffic.CONTROL)

    def train_epoch(self, epoch: int) -> EpochResult:
        p = self.ctx.part
        self.ctx.comm.all_to_all([p.x[i] for i in p.send_idx], "leak", carries=Traffic.FEATURES)
        return EpochResult(loss=0.0)

    def evaluate(self) -> dict[str, float]:
        return {"train": 0.0, "val": 0.0, "test": 0.0}


def _parts(P, n=90):
    g = small_graph(n=n, seed=3)
    return g, build_partitions(g, partition_nodes(g, "random", P, seed=0))


def _ctx(comm, part, epochs=4):
    return WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                         model_cfg=ModelConfig(arch="gcn", hidden=8, layers=2, dropout=0.0),
                         train_cfg=TrainConfig(epochs=epochs, seed=1), log=lambda m: None)


def _leak(comm, parts, level, run_dir):
    from quietgnn.runtime.trainer import Trainer
    comm.residency = level
    cfg = load_config(None, {"strategy": "retexo", "runtime": {"residency": level},
                             "partition": {"method": "given"}, "train": {"epochs": 2}})
    ctx = _ctx(comm, parts[comm.rank])
    error = None
    try:
        Trainer(ctx, _LeakyStrategy(ctx), cfg, f"{run_dir}/rank{comm.rank}").run()
    except ResidencyError as exc:
        error = str(exc)
    round_after_error = comm.round
    sent = dict(comm.sent_by_class)
    # nothing half-sent: the ranks are still in step, a legal op goes through on all of them
    t = comm.all_reduce(torch.ones(1), "after", carries=Traffic.CONTROL)
    return {"error": error, "round": round_after_error, "sent": sent,
            "after": float(t[0])}


@pytest.mark.parametrize("level", ["features", "strict"])
def test_forbidden_send_is_stopped_on_every_rank_before_anything_is_sent(level, tmp_path):
    P = 3
    _, parts = _parts(P)
    out = spawn_function(_leak, P, args=(parts, level, str(tmp_path)), timeout_s=90,
                         comm_timeout_s=20)
    for r, res in enumerate(out):
        assert res["error"] is not None, f"rank {r} was not stopped"
        assert res["error"].startswith(f"rank {r}: all_to_all (leak) carries features")
        assert f"runtime.residency = {level} forbids" in res["error"]
        assert "stopped before sending anything" in res["error"]
        # the trainer's check that the parts agree (an all-to-all and a gather: control),
        # the warm-up and the start barrier only: the exchange never began
        assert res["round"] == 4
        assert list(res["sent"]) == ["control"]
        assert res["after"] == P


def _ops(comm):
    """Each kind of op with each class under each level: which went through, and the tallies
    of bytes by class against the records."""
    calls = {
        "all_reduce": lambda c: comm.all_reduce(torch.ones(4), "k", carries=c),
        "broadcast": lambda c: comm.broadcast(torch.ones(4), 0, "k", carries=c),
        "all_to_all": lambda c: comm.all_to_all([torch.ones(2, 3)] * comm.world_size, "k",
                                                carries=c),
        "all_gather_object": lambda c: comm.all_gather_object({"n": 1}, "k", carries=c),
    }
    out = {}
    for level in ("none", "features", "strict"):
        comm.residency, comm.sent_by_class = level, {}
        ok = []
        for op, call in calls.items():
            for c in list(Traffic):
                try:
                    call(None if c is Traffic.UNDECLARED else c)
                    ok.append([op, c.value, True])
                except ResidencyError:
                    ok.append([op, c.value, False])
        recs = comm.take_records()
        out[level] = {"ok": ok, "tally": dict(comm.sent_by_class),
                      "record_sum": {c: sum(r.bytes_sent for r in recs if r.carries == c)
                                     for c in {r.carries for r in recs}},
                      "total": sum(r.bytes_sent for r in recs)}
    return out


def test_every_op_checks_its_class_and_tallies_bytes_by_class():
    out = spawn_function(_ops, 2, timeout_s=90, comm_timeout_s=20)
    for by_level in out:
        for level, res in by_level.items():
            for op, c, went in res["ok"]:
                assert went == (c in allowed(level)), (op, c, level)
            assert res["tally"] == res["record_sum"]
            assert sum(res["tally"].values()) == res["total"] > 0
            assert set(res["tally"]) == set(allowed(level))


# ---------------------------------------------------------------------- retexo under residency
def _retexo(comm, parts, level):
    comm.residency = level
    ctx = _ctx(comm, parts[comm.rank], epochs=4)
    s = Retexo(ctx, RetexoOptions())
    with comm.phase("setup"):
        s.setup()
    for e in range(4):
        comm.epoch = e
        with comm.phase("train"):
            s.train_epoch(e)
    with comm.phase("eval"):
        acc = s.evaluate()
    return {"tally": dict(comm.sent_by_class), "acc": acc["test"]}


def test_retexo_keeps_raw_features_home_under_residency():
    _, parts = _parts(2, n=120)
    free = spawn_function(_retexo, 2, args=(parts, "none"), timeout_s=120, comm_timeout_s=30)
    kept = spawn_function(_retexo, 2, args=(parts, "strict"), timeout_s=120, comm_timeout_s=30)
    for a, b in zip(free, kept):
        assert a["tally"]["features"] > 0            # without residency layer 0's rows cross
        assert set(b["tally"]) <= {"embeddings", "gradients", "control"}
        assert b["tally"]["embeddings"] > 0 and b["tally"]["gradients"] > 0
        assert b["tally"]["gradients"] == a["tally"]["gradients"]


def test_cli_retexo_features_run_records_no_features_or_labels(tmp_path):
    """A real run under `features` on a given partition: zero bytes of raw features or labels
    left any rank, per the communicator's records, and the per-class totals are all the bytes
    the run's metrics recorded."""
    nodes, P = 400, 2
    assign = tmp_path / "sites.npy"
    np.save(assign, np.arange(nodes) % P)
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "quietgnn", "train", "--strategy", "retexo",
                        "--runtime.residency", "features", "--partitioner", "given",
                        "--partition.file", str(assign), "--parts", str(P), "--epochs", "6",
                        "--synthetic.nodes", str(nodes), "--synthetic.feature_dim", "8",
                        "--hidden", "16", "--runtime.progress", "false",
                        "--out", str(tmp_path / "runs"), "--summary-json", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert s["residency"] == "features"
    by_rank = s["bytes_sent_by_class_per_rank"]
    assert sorted(by_rank) == [str(k) for k in range(P)]
    for rank, classes in by_rank.items():
        assert classes.get("features", 0) == classes.get("labels", 0) == 0
        assert "undeclared" not in classes
        assert classes["embeddings"] > 0 and classes["gradients"] > 0
        recs = [json.loads(line) for line in
                next((tmp_path / "runs").glob(f"*/metrics/rank-{rank}.jsonl")).read_text()
                .splitlines()]
        sent = sum(v["sent"] for rec in recs for v in rec["bytes"].values())
        assert sum(classes.values()) == sent
    assert s["bytes_sent_by_class"] == {c: sum(d.get(c, 0) for d in by_rank.values())
                                        for c in s["bytes_sent_by_class"]}


def test_cli_refuses_halo_under_features_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quietgnn", "train", "--strategy", "halo",
                        "--runtime.residency", "features", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "strategies allowed under features: retexo" in lines[0]
    lst = subprocess.run([sys.executable, "-m", "quietgnn", "strategies"], capture_output=True,
                         text=True, timeout=120)
    row = [x for x in lst.stdout.splitlines() if x.startswith("retexo")][0]
    assert "residency: none, features, strict" in row
    assert "residency: none]" in [x for x in lst.stdout.splitlines()
                                  if x.startswith("halo")][0]


def test_a_book_is_checked_by_its_own_partitioner_not_the_command_lines(tmp_path):
    """--partitioner given --partition.file SITES beside a METIS --book passed the residency
    check (it read the command line) and trained on the METIS parts, the summary saying
    'given'; a --partition.file other than the book's was ignored. Both paths that open a
    configured book (the launcher's resolve_book, a torchrun rank) now check the book."""
    from quietgnn.datasets import load_dataset
    from quietgnn.partition import PartitionBook, make_book
    from quietgnn.runtime.books import check_book_partition
    graph = load_dataset("synthetic", synthetic={"nodes": 300, "feature_dim": 8})
    sites = np.arange(300) % 2
    np.save(tmp_path / "sites.npy", sites)
    np.save(tmp_path / "other.npy", 1 - sites)
    metis = make_book(tmp_path / "metis", graph, "metis", 2)
    given = make_book(tmp_path / "given", graph, "given", 2, file=str(tmp_path / "sites.npy"))
    cfg = _cfg("retexo", "features", file=str(tmp_path / "sites.npy"))
    with pytest.raises(ValueError, match=r"^--partitioner given does not match the partition "
                                         r"book '.*metis', which was partitioned with metis"):
        check_book_partition(metis, cfg)
    check_book_partition(given, cfg)        # its own sites: trains
    with pytest.raises(ValueError, match=r"^--partition.file '.*other.npy' is not the "
                                         r"assignment the partition book '.*given' was made"):
        check_book_partition(given, _cfg("retexo", "features", file=str(tmp_path / "other.npy")))
    # no partitioner on the command line: the book's is checked against the level
    def bare(book):    # (the config alone no longer refuses: retexo's default is metis)
        return load_config(None, {"strategy": "retexo", "runtime": {"residency": "features"},
                                  "partition": {"parts": 2, "book": str(book.path)}})
    with pytest.raises(ValueError, match=r"partitioner 'metis' would place nodes"):
        check_book_partition(PartitionBook.open(metis.path), bare(metis))
    check_book_partition(given, bare(given))


def test_several_hosts_under_a_level_need_each_sites_own_part(tmp_path, monkeypatch):
    """Under torchrun on several hosts without --data, every rank loaded the whole graph (all
    sites' features and labels) to partition it in process; refused, before any load."""
    import quietgnn.datasets as datasets
    from quietgnn.runtime.plan import plan_worker
    from quietgnn.runtime.worker import load_local_partition
    np.save(tmp_path / "sites.npy", np.arange(300) % 2)
    cfg = load_config(None, {"strategy": "retexo", "runtime": {"residency": "features"},
                             "synthetic": {"nodes": 300},
                             "partition": {"method": "given", "parts": 2,
                                           "file": str(tmp_path / "sites.npy")}})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")

    def loaded(*a, **k):
        raise AssertionError("the whole graph was loaded")
    monkeypatch.setattr(datasets, "load_dataset", loaded)
    with pytest.raises(ValueError, match=r"^runtime.residency = features on several hosts "
                                         r"needs each site's own part: without --data"):
        load_local_partition(plan_worker(cfg, tmp_path / "run"), 1, 2)
    for env, value in (("QUIETGNN_EMULATED_HOSTS", "1"),      # emulated hosts: one machine
                       ("LOCAL_WORLD_SIZE", "2")):           # one host holds both sites
        monkeypatch.setenv(env, value)
        with pytest.raises(AssertionError, match="whole graph was loaded"):
            load_local_partition(plan_worker(cfg, tmp_path / "run"), 1, 2)


def test_prepare_under_a_level_keeps_sites_and_is_judged_by_its_own_rule(tmp_path, capsys):
    """`prepare --runtime.residency features` was refused because the default *training*
    strategy (halo) needs raw features; a prepare trains nothing. In one process it now
    prepares a `given` graph, and refuses a partitioner that would place nodes."""
    from quietgnn.cli import main
    from quietgnn.partition import PartitionBook
    np.save(tmp_path / "sites.npy", np.arange(300) % 2)
    base = ["prepare", "--dataset", "synthetic", "--synthetic.nodes", "300", "--parts", "2",
            "--runtime.residency", "features"]
    assert main(base + ["--out", str(tmp_path / "metis")]) == 2
    err = capsys.readouterr().err
    assert "partitioner 'metis' would place nodes; prepare with --partitioner given" in err
    assert "strategy 'halo'" not in err and not (tmp_path / "metis").exists()
    assert main(base + ["--partitioner", "given", "--partition.file",
                        str(tmp_path / "sites.npy"), "--out", str(tmp_path / "given")]) == 0
    assert PartitionBook.open(tmp_path / "given").method == "given"
    assert main(base[:-1] + ["maybe", "--out", str(tmp_path / "x")]) == 2
    assert "runtime.residency = 'maybe'; expected one of" in capsys.readouterr().err
    recipe = tmp_path / "r.yaml"          # the level from a recipe: the same rule
    recipe.write_text("runtime:\n  residency: features\n")
    assert main(base[:-2] + ["--config", str(recipe), "--out", str(tmp_path / "r")]) == 2
    assert "partitioner 'metis' would place nodes" in capsys.readouterr().err


def test_a_site_with_few_training_nodes_is_told_its_gradients_reveal_them(capsys):
    """With one training node, a site's shared gradient gives away its label and feature row
    (the level keeps only raw rows off the wire): said in that rank's own log."""
    from quietgnn.runtime.worker import FEW_TRAINING_NODES, note_few_training_nodes
    part = _parts(2)[1][1]
    part.train_mask[:] = False
    part.train_mask[:1] = True
    note_few_training_nodes(part, "features", 1)
    err = capsys.readouterr().err
    assert err.startswith("note: rank 1 holds 1 training node(s): under runtime.residency "
                          "features") and "reveal their labels and features" in err
    note_few_training_nodes(part, "none", 1)                    # no level: nothing promised
    part.train_mask[:FEW_TRAINING_NODES] = True
    note_few_training_nodes(part, "strict", 1)
    assert capsys.readouterr().err == ""
