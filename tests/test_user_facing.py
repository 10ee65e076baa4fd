"""What a user reads of a run: the progress line and the summary agree on bytes and on epoch
numbers; a run refused before it starts leaves no empty run directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--synthetic.nodes", "300", "--synthetic.feature_dim", "8", "--hidden", "16"]


def quietgnn(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quietgnn", *args], capture_output=True,
                          text=True, timeout=240)


def test_progress_and_summary_share_bytes_basis_and_epoch_numbers(tmp_path):
    r = quietgnn("train", "--parts", "2", "--epochs", "4", "--train.eval_every", "2", *TINY,
                 "--out", str(tmp_path), "--run-name", "r")
    assert r.returncode == 0, r.stderr
    progress = [x for x in r.stderr.splitlines() if x.startswith("[")]
    assert len(progress) == 4
    # epochs are numbered from 0 everywhere: progress, metrics.jsonl, the summary
    shown = [int(re.search(r"\] epoch (\d+) \((\d+)/4\)", x).group(1)) for x in progress]
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics" / "rank-0.jsonl").read_text()
            .splitlines()]
    assert shown == [x["epoch"] for x in recs if x["epoch"] >= 0] == [0, 1, 2, 3]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    evaluated = [e for e, x in zip(shown, progress) if " val " in x]
    assert evaluated == [1, 3] and summary["best_epoch"] in evaluated
    assert f"at epoch {summary['best_epoch']} of 0-3" in r.stdout
    best = max((x for x in recs if x.get("val_acc") is not None), key=lambda x: x["val_acc"])
    assert best["epoch"] == summary["best_epoch"]
    # bytes: the progress line's basis (rank 0, sent, training) is in the summary, same label
    per_epoch = [re.search(r"rank 0 sent (.+?)/epoch", x).group(1) for x in progress]
    rank0 = [x["bytes"]["train"]["sent"] for x in recs if x["epoch"] >= 0]
    assert summary["rank0_train_bytes_per_epoch"] == sum(rank0) / 4
    line = next(x for x in r.stdout.splitlines() if "training bytes" in x)
    assert f"rank 0 sent {per_epoch[-1]}/epoch" in line      # every epoch sends the same here
    assert "all ranks sent" in line and summary["train_bytes"] > sum(rank0)


def test_a_refused_run_leaves_no_empty_run_directory(tmp_path):
    out = tmp_path / "runs"
    r = quietgnn("train", "--dataset", str(tmp_path / "missing.npz"), "--out", str(out))
    assert r.returncode == 2 and "missing.npz" in r.stderr
    assert not out.exists()                     # nor the --out folder it had to create
    out.mkdir()
    bad = tmp_path / "bad.npz"                  # an edge to node 9 of a 3-node graph
    np.savez(bad, edge_index=np.array([[0, 1], [1, 9]]), y=np.array([0, 1, 0]))
    r = quietgnn("train", "--dataset", str(bad), "--parts", "2", "--out", str(out))
    assert r.returncode == 2 and "node id 9" in r.stderr
    assert out.is_dir() and not any(out.iterdir())


def test_readme_example_outputs_are_ignored_by_git(tmp_path):
    """Folders the README's and the user guide's commands write into the checkout are in
    .gitignore."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs/guide/running.md").read_text()
    # the first folder of every relative --out / --summary-json / --root; benchmarks/results
    # is where studies are committed on purpose, DIR / PATH are placeholders
    written = {m for m in re.findall(r"--(?:out|summary-json|root) ([\w-]+)[/\s`]", text)
               if m != "benchmarks" and not m.isupper()}
    written.add("runs")                          # the default --out
    assert {"out", "data", "bench-out", "runs"} <= written
    for folder in sorted(written):
        r = subprocess.run(["git", "check-ignore", "-q", f"{folder}/x"], cwd=ROOT)
        assert r.returncode == 0, f"{folder}/ (written by a README example) is not ignored"
