"""The regime study's arithmetic (``benchmarks/bench_regimes.py``): what "seconds to a
target" charges, and the record interface of ``regimes.json``. No processes: a made-up curve."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_regimes as br  # noqa: E402
from quietgnn.comm.network import Tier  # noqa: E402


def _curve() -> dict:
    """Three epochs of 1 s compute and 1 MB on the slowest rank (1 hop each); evaluated at
    epochs 1 and 2, each evaluation 0.5 s of compute and 2 MB; 10 MB of set-up."""
    rows = []
    for ep, acc in enumerate((None, 0.5, 0.8)):
        rows.append({"epoch": ep, "work": 1.0, "compute_s": 1.0, "compute_sum_s": 4.0,
                     "cpu_sum_s": None, "hops": 1, "crit_bytes": 1e6, "train_bytes": 4e6,
                     "data_bytes": 0, "eval_hops": 0 if acc is None else 2,
                     "eval_crit_bytes": 0 if acc is None else 2e6,
                     "eval_compute_s": 0.0 if acc is None else 0.5, "test_acc": acc})
    return {"setup": {"hops": 3, "crit_bytes": 1e7, "bytes": 4e7}, "epochs": rows}


def test_seconds_to_target_charge_setup_training_and_the_one_evaluation_that_saw_it():
    tier = Tier("t", 8e6, 0.1)          # 1 MB/s, 0.1 s a hop
    hit = br._reach(_curve(), tier, 0.7)
    # set-up 3 hops + 10 MB; three epochs of 1 s + 1 hop + 1 MB; epoch 2's evaluation only
    # (epoch 1's, which did not reach the target, is the study's instrument, not a cost)
    setup, epoch, evaluation = 0.3 + 10.0, 1.0 + 0.1 + 1.0, 0.5 + 0.2 + 2.0
    assert hit == {"seconds": pytest.approx(setup + 3 * epoch + evaluation), "epoch": 2}
    assert br._reach(_curve(), tier, 0.9) is None


def test_records_carry_the_interface_per_link():
    base = {"strategy": "halo", "edges": 1e6, "partition": "hash", "layers": 2}
    recs = br._records(base, _curve(), central=0.8)
    assert [r["link"] for r in recs] == list(br.LINKS)
    for r in recs:
        for k in ("strategy", "edges", "partition", "bandwidth_bps", "layers", "best_test_acc",
                  "centralized_test_acc", "bytes_per_epoch", "measured_seconds_to_98",
                  "projected_seconds_to_98"):
            assert k in r, k
        assert r["best_test_acc"] == 0.8 and r["bytes_per_epoch"] == 4e6
        assert r["measured_seconds_to_98"] is None and r["how"] == "projected"
        hit = br._reach(_curve(), br.LINKS[r["link"]], 0.98 * 0.8)
        assert r["projected_seconds_to_98"] == hit["seconds"] and r["epoch_to_98"] == 2
    assert recs[-1]["projected_seconds_to_98"] > recs[0]["projected_seconds_to_98"]


def test_a_changed_option_sits_beside_the_defaults_not_in_the_map():
    base = {"strategy": "grappa", "edges": 1e6, "partition": "hash", "layers": 2,
            "status": "ok"}
    plain = br._records(dict(base), _curve(), central=0.8)
    slow = _curve()
    for row in slow["epochs"]:
        row["compute_s"] = 3.0       # the variant: three times the compute per epoch
    var = br._records(dict(base, variant="v", options={"repart_every": "10"}), slow, 0.8)
    lines = br.render({"runs": plain + var})
    table = lines[lines.index("## Options changed (item 3)"):]
    rows = [x for x in table if x.startswith("| 1e+06 hash L2 | grappa")]
    assert len(rows) == 2 and "defaults" in rows[0] and "repart_every=10" in rows[1]
    # the map's own tables hold the default run only
    at_glance = lines[:lines.index("## Options changed (item 3)")]
    assert sum(x.startswith("| grappa |") for x in at_glance) == 1
    assert br._fmt(var[0]["projected_seconds_to_98"]) in rows[1]
    assert br._fmt(plain[0]["projected_seconds_to_98"]) in rows[0]


def test_a_kept_run_reads_back_as_its_run_directory(tmp_path, monkeypatch):
    """What the study keeps of a run in git (``keep``) gives the advisor's validation the same
    result as the run directory, which a fresh clone does not have; neither: None."""
    import json

    import bench_advise_regimes as bar
    from helpers import run_cfg, small_graph, train_run
    from quietgnn.comm import Communicator
    from quietgnn.partition import build_partitions, partition_nodes

    graph = small_graph(n=60)
    part = build_partitions(graph, partition_nodes(graph, "metis", 1, seed=0), ranks=[0])[0]
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    train_run(Communicator(0, 1), part, run_cfg("halo", 1, 3), runs / "r")
    (runs / "r" / "config.json").write_text(json.dumps({
        "strategy": "halo", "model": {"arch": "gcn"}, "partition": {"method": "metis"},
        "options": {}, "dataset": {"prepared": None}}))
    for mod in (br, bar):
        monkeypatch.setattr(mod, "RUNS", runs)
        monkeypatch.setattr(mod, "KEPT", kept)
    (runs / "r" / "summary.json").unlink(missing_ok=True)   # as a run the budget stopped
    br.keep("r")
    from_dir = bar._result("r", best=0.5)
    assert len(from_dir["curve"]["epochs"]) == 3
    assert from_dir["summary"]["test_acc"] == 0.5       # no summary: the best stands in
    monkeypatch.setattr(bar, "RUNS", tmp_path / "elsewhere")
    assert bar._result("r", best=0.5) == from_dir
    monkeypatch.setattr(bar, "KEPT", tmp_path / "elsewhere")
    assert bar._result("r", best=0.5) is None
