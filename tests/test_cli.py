"""The command line end to end, as a user runs it (subprocesses, real workers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import SHARED_DATA

TINY = ["--synthetic.nodes", "300", "--synthetic.feature_dim", "8", "--hidden", "16",
        "--runtime.progress", "false"]


def quietgnn(*args: str, cwd=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quietgnn", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def test_train_prints_accuracy_and_bytes_and_writes_summary(tmp_path):
    out = tmp_path / "s.json"
    r = quietgnn("train", "--parts", "2", "--epochs", "5", *TINY, "--summary-json", str(out),
                 "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout and "training bytes" in r.stdout
    assert "quietgnn predict --run" in r.stdout   # every run's model, and how to use it
    s = json.loads(out.read_text())
    for key in ("strategy", "dataset", "parts", "model", "test_acc", "val_acc", "best_epoch",
                "train_bytes", "eval_bytes", "wall_seconds", "compute_seconds"):
        assert key in s, key
    assert s["strategy"] == "halo" and s["parts"] == 2 and s["epochs"] == 5
    assert s["train_bytes"] > 0 and 0.0 <= s["test_acc"] <= 1.0
    ranks = sorted((tmp_path / "runs").glob("*/metrics/rank-*.jsonl"))
    assert len(ranks) == 2
    assert (ranks[0].parents[1] / "model.pt").is_file()
    recs = [json.loads(line) for line in ranks[0].read_text().splitlines()]
    assert [r_["epoch"] for r_ in recs] == [-1, 0, 1, 2, 3, 4]
    # the summary's bytes are the sum over ranks and epochs of the per-rank records
    total = 0
    for f in ranks:
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["epoch"] >= 0:
                total += rec["bytes"].get("train", {}).get("sent", 0)
    assert total == s["train_bytes"]


@pytest.mark.slow
def test_partition_command_writes_a_book(tmp_path):
    r = quietgnn("partition", "--parts", "3", *TINY[:4], "--out", str(tmp_path / "book"))
    assert r.returncode == 0, r.stderr
    assert "edge cut" in r.stdout and (tmp_path / "book" / "part-2" / "x.npy").is_file()
    r = quietgnn("train", "--book", str(tmp_path / "book"), "--parts", "3", "--epochs", "2",
                 *TINY, "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    r = quietgnn("train", "--book", str(tmp_path / "book"), "--parts", "2", "--epochs", "2",
                 *TINY, "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "has 3 parts but the run asks for 2" in r.stderr


def test_listing_commands():
    r = quietgnn("strategies")
    assert r.returncode == 0 and "halo" in r.stdout and "centralized" in r.stdout
    r = quietgnn("datasets")
    assert r.returncode == 0 and "synthetic" in r.stdout and "cora" in r.stdout


def test_unknown_key_is_rejected_before_anything_starts(tmp_path):
    r = quietgnn("train", "--model.hiddn", "3", "--out", str(tmp_path))
    assert r.returncode == 2 and "unknown key(s) ['model.hiddn']" in r.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow   # 200 epochs on Cora through the CLI: the slow tier (pytest -m slow)
@pytest.mark.skipif(not (SHARED_DATA / "planetoid" / "Cora").is_dir(),
                    reason="../shared/data not found: real-dataset tests need the shared datasets")
@pytest.mark.parametrize("strategy, parts", [("centralized", 1), ("halo", 4)])
def test_cora_gcn_accuracy(tmp_path, strategy, parts):
    out = tmp_path / "s.json"
    r = quietgnn("train", "--strategy", strategy, "--dataset", "cora", "--root",
                 str(SHARED_DATA / "planetoid"), "--parts", str(parts), "--epochs", "200",
                 "--runtime.progress", "false", "--summary-json", str(out), "--out",
                 str(tmp_path / "runs"), timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["test_acc"] >= 0.80


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path):
    # a script launching several runs of one strategy/dataset/P at once used to get one
    # '<time>-<strategy>-<dataset>-p<P>' directory for all of them (metrics overwritten)
    from quietgnn.runtime.plan import _claim_dir
    base = tmp_path / "runs" / "20261124-120000-halo-cora-p4"
    dirs = [_claim_dir(base) for _ in range(3)]
    assert [d.name for d in dirs] == [base.name, base.name + "-2", base.name + "-3"]
    assert all(d.is_dir() for d in dirs)


def test_parts_a_single_process_strategy_does_not_use_are_named(capsys):
    from quietgnn.cli import main
    assert main(["config", "--strategy", "centralized", "--parts", "4"]) == 0
    assert "centralized runs in 1 process(es); --parts 4 is not used" in capsys.readouterr().err
    assert main(["config", "--strategy", "halo", "--parts", "4"]) == 0
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("code, rank", [(0, True), (2, True), (0, False), (None, False)])
def test_a_rank_leaves_through_os_exit_after_flushing(monkeypatch, code, rank):
    """A rank started with torchrun's variables ended 9 times in 80 with 'terminate called
    without an active exception' (exit 134) after a run that succeeded: gloo's threads
    outlived destroy_process_group and raced the interpreter's finalisation. `entry` leaves a
    rank through os._exit with main's code, as the launcher's workers do; other processes
    exit normally."""
    from quietgnn import cli
    for k in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    if rank:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    class Exited(Exception):
        pass

    def fake_exit(c):
        raise Exited(c)
    monkeypatch.setattr(cli, "main", lambda: code)
    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(cli.sys, "argv", ["quietgnn", "train", "--epochs", "2"])
    with pytest.raises(Exited if rank else SystemExit) as ei:
        cli.entry()
    got = ei.value.args[0] if rank else ei.value.code
    assert got == (code or 0)
    # a command that joins no process group exits as usual, wherever it runs
    monkeypatch.setattr(cli.sys, "argv", ["quietgnn", "report", "runs/x"])
    with pytest.raises(SystemExit):
        cli.entry()
