"""Network-tier projection: tier parsing, and the arithmetic against hand-computed values on a
hand-written metrics directory and on a real tiny ``halo`` run."""

from __future__ import annotations

import json
import dataclasses
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from quietgnn.comm import Traffic
from quietgnn.analysis.projection import Curve, epoch_curve, project, time_to_accuracy
from quietgnn.comm.network import TIERS, Tier, parse_tier, resolve_tiers
from quietgnn.runtime.metrics import read_metrics
from quietgnn.strategies.base import EpochResult, Strategy

LAN, WAN = TIERS["lan"], TIERS["wan"]


def write_fake_run(run_dir: Path) -> Path:
    """Two ranks, setup + two epochs. Rounds: [round, kind, phase, sent, recv, hops, seconds].

    epoch 0: round 0 (1 hop): slowest rank moves max(1000, 2000, 3000, 500) = 3000 B;
             round 1 (2 hops): 500 B; round 2 is eval (charged as eval). compute max(1.0, 1.5).
    epoch 1: round 3 (1 hop): 2000 B; round 4 is data phase (1 hop): 100000 B. compute 0.8.
    """
    m = run_dir / "metrics"
    m.mkdir(parents=True)
    base = {"loss": 1.0, "steps": 1, "wall_s": 2.0, "comm_s": 0.1, "eval_s": 0.2,
            "peak_rss_mb": 100.0, "extra": {}, "train_acc": None, "val_acc": None}
    ranks = {
        0: [{"epoch": -1, "rank": 0, "phase": "setup", "bytes": {"setup": {"sent": 64, "recv": 64}},
             "rounds": [[0, "meta", "setup", 64, 64, 1, 0.0]]},
            {**base, "epoch": 0, "rank": 0, "compute_s": 1.0, "test_acc": 0.5,
             "eval_compute_s": 0.25,
             "bytes": {"train": {"sent": 1500, "recv": 2500}, "eval": {"sent": 9, "recv": 9}},
             "rounds": [[1, "halo", "train", 1000, 2000, 1, 0.0],
                        [2, "grad_allreduce", "train", 500, 500, 2, 0.0],
                        [3, "eval", "eval", 9, 9, 1, 0.0]]},
            {**base, "epoch": 1, "rank": 0, "compute_s": 0.8, "test_acc": 0.9,
             "bytes": {"train": {"sent": 1000, "recv": 1000}, "data": {"sent": 0, "recv": 100000}},
             "rounds": [[4, "halo", "train", 1000, 1000, 1, 0.0],
                        [5, "chunk", "data", 0, 100000, 1, 0.0]]}],
        1: [{"epoch": -1, "rank": 1, "phase": "setup", "bytes": {"setup": {"sent": 64, "recv": 64}},
             "rounds": [[0, "meta", "setup", 64, 64, 1, 0.0]]},
            {**base, "epoch": 0, "rank": 1, "compute_s": 1.5, "test_acc": 0.5,
             "eval_compute_s": 0.3,
             "bytes": {"train": {"sent": 3500, "recv": 1000}},
             "rounds": [[1, "halo", "train", 3000, 500, 1, 0.0],
                        [2, "grad_allreduce", "train", 500, 500, 2, 0.0],
                        [3, "eval", "eval", 9, 9, 1, 0.0]]},
            {**base, "epoch": 1, "rank": 1, "compute_s": 0.7, "test_acc": 0.9,
             "bytes": {"train": {"sent": 2000, "recv": 0}, "data": {"sent": 100000, "recv": 0}},
             "rounds": [[4, "halo", "train", 2000, 0, 1, 0.0],
                        [5, "chunk", "data", 100000, 0, 1, 0.0]]}],
    }
    for r, recs in ranks.items():
        (m / f"rank-{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    return run_dir


def test_builtin_tiers_and_parsing():
    assert [(t.bandwidth, t.latency) for t in TIERS.values()] == [
        (100e9, 5e-6), (10e9, 50e-6), (1e9, 0.5e-3), (100e6, 20e-3), (10e6, 50e-3)]
    t = parse_tier("metro:10G:2ms")
    assert (t.name, t.bandwidth, t.latency) == ("metro", 10e9, 2e-3)
    t = parse_tier("sat:2e7:0.6")
    assert (t.bandwidth, t.latency) == (2e7, 0.6)
    assert parse_tier("WAN") is TIERS["wan"]
    assert "metro" in resolve_tiers(["metro:10G:2ms"]) and "lan" in resolve_tiers([])
    for bad in ("metro", "m:fast:1", "m:1G", "m:0:1ms", "m:1G:-1"):
        with pytest.raises(ValueError, match="tier"):
            parse_tier(bad)


def test_projection_matches_hand_computed(tmp_path):
    curve = epoch_curve(read_metrics(write_fake_run(tmp_path / "run")))
    e0, e1 = curve.epochs
    assert (e0.hops, e0.crit_bytes, e0.compute_s, e0.rounds) == (3, 3500, 1.5, 2)
    assert (e1.hops, e1.crit_bytes, e1.compute_s) == (2, 102000, 0.8)
    assert (e0.train_bytes, e1.data_bytes, e0.eval_bytes) == (5000, 100000, 9)
    assert curve.setup.to_json() == {"hops": 1, "crit_bytes": 64, "rounds": 1, "bytes": 128}
    # LAN: 3 hops x 0.5 ms + 3500 B x 8 / 1e9; WAN: 3 x 20 ms + 3500 x 8 / 1e8
    # the evaluation epoch 0 did is charged too: slowest eval compute 0.3 s + its round
    # (1 hop, 9 B); epoch 1 did none
    assert (e0.eval_hops, e0.eval_crit_bytes, e0.eval_compute_s) == (1, 9, 0.3)
    assert (e1.eval_hops, e1.eval_crit_bytes, e1.eval_compute_s) == (0, 0, 0.0)
    lan = project(curve, LAN)
    ev0 = 0.3 + 0.5e-3 + 72 / 1e9
    assert lan[0].comm_s == pytest.approx(1.5e-3 + 2.8e-5)
    assert lan[0].eval_s == pytest.approx(ev0) and lan[1].eval_s == 0
    assert lan[0].time_s == pytest.approx(1.501528 + ev0)
    assert lan[1].time_s == pytest.approx(0.8 + 1e-3 + 8.16e-4)
    assert lan[1].cum_s == pytest.approx(1.501528 + ev0 + 0.801816)
    wan = project(curve, WAN)
    assert wan[0].time_s == pytest.approx(1.5 + 0.06 + 2.8e-4 + 0.3 + 0.02 + 72 / 1e8)
    assert wan[1].comm_s == pytest.approx(0.04 + 102000 * 8 / 1e8)
    # what if compute were 10x faster: training and evaluation compute / 10, links as counted
    fast = project(curve, WAN, compute_speedup=10)
    assert fast[0].time_s == pytest.approx(0.15 + 0.06 + 2.8e-4 + 0.03 + 0.02 + 72 / 1e8)
    assert fast[1].comm_s == wan[1].comm_s
    with pytest.raises(ValueError, match="compute_speedup = 0"):
        project(curve, WAN, compute_speedup=0)
    # time to accuracy: first epoch whose test accuracy reaches the target, cumulative time
    hit = time_to_accuracy(curve, LAN, 0.5)
    assert (hit.cum_s, hit.epoch) == (pytest.approx(1.501528 + ev0), 0)
    assert time_to_accuracy(curve, LAN, 0.8).cum_s == pytest.approx(2.303344 + ev0)
    assert time_to_accuracy(curve, LAN, 0.95) is None
    # only the train phase when asked: epoch 1 loses its data round
    only_train = epoch_curve(read_metrics(tmp_path / "run"), phases=("train",))
    assert only_train.epochs[1].crit_bytes == 2000


def test_an_exchange_waited_for_later_costs_what_its_compute_window_does_not_hide(tmp_path):
    """Epoch 1's halo round becomes an exchange waited for after 0.3 s of compute on rank 0
    and 0.2 s on rank 1 (the window is the smaller): on WAN its 2000 B cost 1 hop x 20 ms +
    0.16 ms, all hidden; the data round still counts. Compute 10x faster leaves a 20 ms window:
    the exchange then shows its excess over it. Curves without the field project as before."""
    run = write_fake_run(tmp_path / "run")
    before = project(epoch_curve(read_metrics(run)), WAN)
    for r, window in ((0, 0.3), (1, 0.2)):
        f = run / "metrics" / f"rank-{r}.jsonl"
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        recs[2]["rounds"][0].append(window)      # [.., seconds, overlap]
        f.write_text("".join(json.dumps(x) + "\n" for x in recs))
    curve = epoch_curve(read_metrics(run))
    e1 = curve.epochs[1]
    assert (e1.overlap_hops, e1.overlap_crit_bytes, e1.overlap_s) == (1, 2000, 0.2)
    assert curve.epochs[0].overlap_s is None
    halo = 0.02 + 2000 * 8 / 1e8
    wan = project(curve, WAN)
    assert wan[1].comm_s == pytest.approx(before[1].comm_s - halo)
    assert wan[0].time_s == pytest.approx(before[0].time_s)
    fast = project(curve, WAN, compute_speedup=10)   # window 0.2 s x 0.08 / 0.8
    assert fast[1].comm_s == pytest.approx(before[1].comm_s - 0.02)
    # stored and read back (the report's curves are JSON)
    again = Curve.from_json(curve.to_json())
    assert project(again, WAN)[1].comm_s == pytest.approx(wan[1].comm_s)


def test_torn_epoch_is_dropped(tmp_path):
    run = write_fake_run(tmp_path / "run")
    f = run / "metrics" / "rank-1.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])   # rank 1 crashed in epoch 1
    curve = epoch_curve(read_metrics(run))
    assert [e.epoch for e in curve.epochs] == [0]
    with pytest.raises(ValueError, match="no metrics"):
        epoch_curve({})


def test_projection_of_a_real_halo_run(tmp_path):
    """A real 2-rank halo run (GCN, 2 layers): per epoch 3 halo all-to-alls of one hop (layer 0
    and 1 forward, layer 1 backward) + one gradient all-reduce of 2 ceil(log2 2) = 2 hops."""
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "quietgnn", "train", "--strategy", "halo", "--dataset",
           "synthetic", "--synthetic.nodes", "300", "--parts", "2", "--epochs", "3",
           "--out", str(out), "--run-name", "r", "--runtime.progress", "false"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    metrics = read_metrics(out / "r")
    curve = epoch_curve(metrics)
    assert len(curve.epochs) == 3
    for row in curve.epochs:
        ep = row.epoch
        recs = [metrics[r][ep + 1] for r in (0, 1)]
        assert recs[0]["epoch"] == ep
        train = [[x for x in rec["rounds"] if x[2] == "train"] for rec in recs]
        # layer 0's inputs were fetched once at setup: one hidden-layer exchange each way
        assert sorted(x[1] for x in train[0]) == ["grad_allreduce", "halo_bwd", "halo_fwd"]
        assert row.hops == 2 * 1 + 2 and row.rounds == 3
        # slowest rank per round, summed
        want = sum(max(a[3], a[4], b[3], b[4]) for a, b in zip(*train))
        assert row.crit_bytes == want > 0
        assert row.compute_s == max(rec["compute_s"] for rec in recs)
        assert row.compute_sum_s == pytest.approx(sum(rec["compute_s"] for rec in recs))
        # every thread's CPU of the epoch's training, per rank: at least its compute
        assert all(rec["cpu_s"] >= rec["compute_s"] for rec in recs)
        assert row.cpu_sum_s == pytest.approx(sum(rec["cpu_s"] for rec in recs))
        # ranks sharing one core: a phase takes their total CPU seconds (all threads); with a
        # core each (or more cores than ranks) the slowest rank's compute
        one = project({"epochs": [row]}, Tier("free", 1e30, 0.0), cores=1)[0]
        assert one.compute_s == pytest.approx(row.cpu_sum_s)
        for cores in (None, 2, 8):
            p = project({"epochs": [row]}, Tier("free", 1e30, 0.0), cores=cores)[0]
            assert p.compute_s == pytest.approx(
                max(row.compute_s, row.cpu_sum_s / (cores or 1e9)))
        # records written before cpu_s was kept: the compute alone
        old = dataclasses.replace(row, cpu_sum_s=None)
        assert project([old], Tier("free", 1e30, 0.0), cores=1)[0].compute_s == \
            pytest.approx(row.compute_sum_s)
        # a tier with 1 byte/s and no latency projects exactly crit_bytes seconds of comm
        p = project({"epochs": [row]}, Tier("unit", 8.0, 0.0))[0]
        assert p.comm_s == pytest.approx(want)
        # evaluated epochs (the last here) add their evaluation's compute and rounds
        ev = row.eval_compute_s + LAN.seconds(row.eval_hops, row.eval_crit_bytes)
        assert (ev > 0) == (ep == 2)
        assert project({"epochs": [row]}, LAN)[0].time_s == pytest.approx(
            row.compute_s + 4 * 0.5e-3 + 8 * want / 1e9 + ev)
    assert math.isfinite(curve.epochs[-1].test_acc)


# ---------------------------------------------------------------------- the first epoch's clock
class _SlowStart(Strategy):
    """Rank 1's set-up takes 2.5 s (as a rank that loads or partitions slower would); an
    epoch is one tiny all-reduce."""
    name = "slow-start"

    def setup(self) -> None:
        if self.ctx.rank == 1:
            time.sleep(2.5)

    def train_epoch(self, epoch: int) -> EpochResult:
        self.ctx.comm.all_reduce(torch.ones(4), "grad_allreduce", carries=Traffic.GRADIENTS)
        return EpochResult(loss=0.0)

    def evaluate(self) -> dict[str, float]:
        return {"train": 0.0, "val": 0.0, "test": 0.0}


def _first_epoch(comm, parts, run_dir):
    from quietgnn.config import load_config
    from quietgnn.nn import ModelConfig
    from quietgnn.runtime.trainer import Trainer
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm,
                        part=parts[comm.rank],
                        model_cfg=ModelConfig(arch="gcn", hidden=8, layers=2),
                        train_cfg=TrainConfig(epochs=1, seed=1), log=lambda m: None)
    cfg = load_config(None, {"partition": {"method": "given"}, "train": {"epochs": 1}})
    t = Trainer(ctx, _SlowStart(ctx), cfg, Path(run_dir) / f"rank{comm.rank}",
                keep_records=True)
    t.run()
    return {r["epoch"]: r for r in t.records}


def test_a_slow_rank_set_up_is_not_charged_to_the_first_epoch(tmp_path):
    """Ranks meet once after set-up: a peer's slower set-up is set-up time, not part of epoch
    0's wall (which the projection and every time-to-accuracy figure start from)."""
    from quietgnn.partition import build_partitions, partition_nodes
    from quietgnn.runtime.spawn import spawn_function
    from helpers import small_graph
    g = small_graph(n=40, seed=1)
    parts = build_partitions(g, partition_nodes(g, "random", 2, seed=0))
    out = spawn_function(_first_epoch, 2, args=(parts, str(tmp_path)), timeout_s=90,
                         comm_timeout_s=20)
    # rank 0 waited for rank 1 in its set-up ...
    assert out[0][-1]["setup_s"] >= 2.0
    # ... and neither rank's first epoch (one 16-byte all-reduce) holds that wait
    assert max(o[0]["wall_s"] for o in out) < 1.0, [o[0]["wall_s"] for o in out]
