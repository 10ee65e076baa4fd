"""When and how the trainer evaluates: the cadence in epoch-equivalents, local selection with
one exact evaluation of the selected state at the end, early stopping with patience."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quietgnn.config import load_config
from quietgnn.runtime.metrics import read_metrics


def _train(out: Path, name: str, *args: str) -> tuple[dict, dict[int, list[dict]]]:
    cmd = [sys.executable, "-m", "quietgnn", "train", "--dataset", "synthetic",
           "--synthetic.nodes", "400", "--parts", "2", "--out", str(out), "--run-name", name,
           "--runtime.progress", "false", "--summary-json", str(out / f"{name}.json"), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=180)
    metrics = read_metrics(out / name)
    return json.loads((out / f"{name}.json").read_text()), \
        {r: [x for x in recs if x["epoch"] >= 0] for r, recs in metrics.items()}


def _eval_kinds(rec: dict) -> set[str]:
    return {x[1] for x in rec["rounds"] if x[2] == "eval"}


def test_bad_eval_settings_are_refused_by_name():
    for key, value, words in (("eval_mode", "fast", "local"), ("patience", -1, ">= 0"),
                              ("eval_every", 0, ">= 1"), ("budget_s", -1.0, "seconds >= 0"),
                              ("budget_s", "1h", "a number")):
        with pytest.raises(ValueError, match=f"train.{key} = .*{words}"):
            load_config(None, {"train": {key: value}})


@pytest.mark.slow
def test_local_selection_then_one_exact_evaluation(tmp_path):
    """grappa at the defaults (local mode): while training, evaluations send only the summed
    counts; the last epoch evaluates the selected state exactly (halo rows: kind halo_fwd),
    and the summary reports that evaluation, which a run stopped at the selected epoch and
    evaluated exactly reproduces."""
    summ, metrics = _train(tmp_path, "local", "--strategy", "grappa", "--epochs", "8",
                           "--train.eval_every", "1")
    recs = metrics[0]
    assert len(recs) == 8 and all(r["eval_mode"] == "local" for r in recs)
    for rec in recs[:-1]:
        assert _eval_kinds(rec) == {"eval_metrics"}
        assert rec["bytes"]["eval"]["sent"] <= 64          # six float64 counts, nothing else
    assert "halo_fwd" in _eval_kinds(recs[-1])
    sel = recs[-1]["selected"]
    best = max(range(8), key=lambda e: (recs[e]["val_acc"], -e))   # first of the best
    assert sel["epoch"] == best == summ["best_epoch"]
    assert summ["selected_by"] == "local" and summ["local_val_acc"] == recs[best]["val_acc"]
    assert (summ["test_acc"], summ["val_acc"]) == (sel["test"], sel["val"])
    assert summ["eval_bytes"] == sum(r["bytes"]["eval"]["sent"] for m in metrics.values()
                                     for r in m)
    # the same training stopped after the selected epoch, evaluated exactly there
    ref, _ = _train(tmp_path, "ref", "--strategy", "grappa", "--epochs", str(best + 1),
                    "--train.eval_mode", "exact", "--train.eval_every", "1000")
    assert ref["selected_by"] == "exact" and ref["evaluations"] == 1
    assert ref["test_acc"] == pytest.approx(summ["test_acc"], abs=1e-9)
    assert ref["val_acc"] == pytest.approx(summ["val_acc"], abs=1e-9)


@pytest.mark.slow
def test_cadence_counts_epoch_equivalents_and_patience_stops_every_rank(tmp_path):
    """Exact mode every 3 epoch-equivalents: epochs 2, 5 and the last evaluated; a learning
    rate too small to change anything never improves validation after the first evaluation,
    so patience 2 stops both ranks together at the second one (no hang, same epochs)."""
    summ, metrics = _train(tmp_path, "cad", "--strategy", "halo", "--epochs", "7",
                           "--train.eval_mode", "exact", "--train.eval_every", "3")
    assert [r["epoch"] for r in metrics[0] if r["eval_mode"]] == [2, 5, 6]
    assert all(r["eval_mode"] == "exact" for r in metrics[1] if r["eval_mode"])
    assert summ["evaluations"] == 3 and summ["selected_by"] == "exact"
    assert all("selected" not in r for r in metrics[0])      # nothing to re-evaluate

    summ, metrics = _train(tmp_path, "pat", "--strategy", "halo", "--epochs", "50",
                           "--lr", "1e-12", "--train.eval_every", "2", "--train.patience", "2")
    assert summ["stopped_early"] is True and summ["epochs"] == 4
    assert [len(m) for m in metrics.values()] == [4, 4]
    assert summ["best_epoch"] == 1 and metrics[0][-1]["selected"]["epoch"] == 1
    assert summ["stopped_by"] == "patience"

    # a budget already spent at the first evaluation (epoch 2) stops both ranks there, each
    # having sent one flag at that evaluation (kind budget, phase control: not charged)
    summ, metrics = _train(tmp_path, "budget", "--strategy", "halo", "--epochs", "50",
                           "--train.eval_mode", "exact", "--train.eval_every", "3",
                           "--train.budget_s", "1e-6")
    assert summ["stopped_early"] is True and summ["stopped_by"] == "budget"
    assert summ["epochs"] == 3 and [len(m) for m in metrics.values()] == [3, 3]
    for m in metrics.values():
        flags = [x for x in m[-1]["rounds"] if x[1] == "budget"]
        assert len(flags) == 1 and flags[0][2] == "control"
        assert not any(x[1] == "budget" for r in m[:-1] for x in r["rounds"])
