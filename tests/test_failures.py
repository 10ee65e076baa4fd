"""Failures without torchrun: a killed, crashed or stuck rank, Ctrl-C, and a NaN on one rank
end the run on every rank in bounded time with a message naming the rank, the epoch and the
operation, and leave no process behind (real `quietgnn train` subprocesses, tiny graph)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from quietgnn.runtime.spawn import spawn_function

TINY = ["--strategy", "halo", "--dataset", "synthetic", "--synthetic.nodes", "300",
        "--synthetic.feature_dim", "8", "--parts", "2", "--hidden", "16"]


def _cli(args, tmp, fault=None, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("QUIETGNN_FAULT", None)
    if fault:
        env["QUIETGNN_FAULT"] = fault
    cmd = [sys.executable, "-m", "quietgnn", "train", *TINY, "--out", str(tmp), "--run-name",
           "r", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _survivors(run_dir: Path) -> list[int]:
    """PIDs of processes still running for this run (workers carry --run-dir in argv)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if str(run_dir) in " ".join(p.info["cmdline"] or []):
                out.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _assert_no_orphans(run_dir: Path) -> None:
    deadline = time.monotonic() + 10      # exiting processes may take a moment to vanish
    while _survivors(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _survivors(run_dir) == [], "worker processes survived the run"


def test_killed_rank_ends_every_rank(tmp_path):
    r = _cli(["--epochs", "200", "--runtime.timeout_s", "20"], tmp_path,
             fault="rank=1,epoch=2,action=kill")
    err = r.stderr
    assert r.returncode == 1, err
    assert "rank 1 was killed by signal SIGKILL (last finished epoch 1)" in err
    # the survivor names the operation and the epoch it was in when its peer vanished
    assert "rank 0: all_to_all" in err and "epoch 2) failed" in err
    _assert_no_orphans(tmp_path / "r")


def test_crashing_rank_shows_its_traceback(tmp_path):
    r = _cli(["--epochs", "200", "--runtime.timeout_s", "20"], tmp_path,
             fault="rank=0,epoch=1,action=raise")
    assert r.returncode == 1, r.stderr
    assert "rank 0 exited with code 1 (last finished epoch 0): RuntimeError: injected fault " \
           "on rank 0" in r.stderr
    assert "Traceback" in r.stderr            # a crash (not bad input): the evidence is shown
    _assert_no_orphans(tmp_path / "r")


@pytest.mark.slow   # waits out a 10 s timeout: the slow tier (pytest -m slow)
def test_stuck_rank_times_out_and_is_named(tmp_path):
    r = _cli(["--epochs", "200", "--runtime.timeout_s", "8"], tmp_path,
             fault="rank=1,epoch=2,action=hang")
    err = r.stderr
    assert r.returncode == 1, err
    assert "rank(s) [1] stopped responding" in err
    assert "rank 1 was stuck after epoch 1" in err
    assert "rank 0 exited with code 1" in err and "epoch 2) failed" in err and "timeout 8s" in err
    _assert_no_orphans(tmp_path / "r")


def test_nan_on_one_rank_stops_all_before_the_step(tmp_path):
    r = _cli(["--epochs", "200", "--runtime.timeout_s", "20"], tmp_path,
             fault="rank=1,epoch=2,action=nan")
    err = r.stderr
    assert r.returncode == 1, err
    msg = "non-finite loss or gradient on rank(s) [1] in epoch 2; all ranks stopped before " \
          "the optimizer step"
    assert msg in err
    # every rank raised it itself (they stopped together, not because a peer vanished)
    for k in (0, 1):
        assert msg in (tmp_path / "r" / "logs" / f"rank-{k}.error").read_text()
    _assert_no_orphans(tmp_path / "r")


def _default_sigint() -> None:
    # As in a terminal's foreground job. A test run started in the background by a
    # non-interactive shell (`pytest &`) inherits SIGINT ignored, and so would the run.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_training(tmp_path):
    """A long run in its own process group (like a terminal's), returned once both workers
    have finished an epoch, with the workers' PIDs."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("QUIETGNN_FAULT", None)
    run_dir = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "quietgnn", "train", *TINY, "--epochs", "100000",
                          "--out", str(tmp_path), "--run-name", "r"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_default_sigint)
    metrics = run_dir / "metrics" / "rank-1.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and p.poll() is None:
        if metrics.is_file() and '"epoch":0' in metrics.read_text():
            break
        time.sleep(0.2)
    if p.poll() is not None:
        pytest.fail(f"training ended early: {p.communicate()[1]}")
    workers = _survivors(run_dir)
    return p, run_dir, workers


def _alive(pids):
    out = []
    for w in pids:
        try:
            if psutil.Process(w).status() != psutil.STATUS_ZOMBIE:
                out.append(w)
        except psutil.NoSuchProcess:
            continue
    return out


def test_ctrl_c_stops_every_worker(tmp_path):
    p, run_dir, workers = _start_training(tmp_path)
    try:
        assert len(workers) == 2, workers           # the two workers (argv has --run-dir)
        os.killpg(p.pid, signal.SIGINT)             # what Ctrl-C in a terminal does
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert "interrupted; all workers stopped" in err
    _assert_no_orphans(run_dir)
    assert _alive(workers) == []


def test_killed_launcher_takes_its_workers_along(tmp_path):
    """Even SIGKILL of the launcher (no chance to clean up) leaves no worker behind."""
    p, run_dir, workers = _start_training(tmp_path)
    try:
        os.kill(p.pid, signal.SIGKILL)              # the launcher only, not its group
        p.communicate(timeout=60)
        _assert_no_orphans(run_dir)
    finally:
        for w in _alive(workers):
            os.kill(w, signal.SIGKILL)


# ---------------------------------------------------------------------- API level
def _poisoned_feature(comm):
    """Rank 1 gets a NaN input feature: every rank raises before the optimizer step and no
    parameter changes anywhere."""
    from helpers import small_graph
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions, partition_nodes
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    from quietgnn.strategies.common import NonFiniteError
    from quietgnn.strategies.halo import Halo
    g = small_graph(n=120, seed=2)
    part = build_partitions(g, partition_nodes(g, "metis", 2, seed=0), ranks=[comm.rank])[0]
    if comm.rank == 1:
        part.x[0, 0] = float("nan")
    ctx = WorkerContext(rank=comm.rank, world_size=2, comm=comm, part=part,
                        model_cfg=ModelConfig(hidden=8, dropout=0.0), train_cfg=TrainConfig())
    s = Halo(ctx)
    s.setup()
    before = [p.detach().clone() for p in s.params]
    comm.epoch = 0
    try:
        s.train_epoch(0)
        msg = "no error"
    except NonFiniteError as exc:
        msg = str(exc)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, s.params))
    return {"msg": msg, "unchanged": unchanged}


def test_poisoned_feature_stops_all_ranks_together():
    res = spawn_function(_poisoned_feature, 2, comm_timeout_s=30)
    for out in res:
        assert "non-finite loss or gradient on rank(s)" in out["msg"]
        assert "1]" in out["msg"] and "in epoch 0" in out["msg"]
        assert out["unchanged"], "an optimizer step ran despite the NaN"
    assert res[0]["msg"] == res[1]["msg"]


def test_one_classification_for_exceptions_and_tracebacks():
    """quietgnn/errors.py: the worker (an exception) and the supervisor (a rank's traceback
    text) classify alike."""
    from quietgnn.comm import CommError
    from quietgnn.errors import is_consequence, is_explained, is_input_error
    from quietgnn.comm.traffic import ResidencyError
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
          "quietgnn.comm.communicator.CommError: rank 1: all_to_all failed: a: b\n")
    assert is_consequence(tb) and is_consequence(CommError("x")) and is_explained(tb)
    assert not is_input_error(tb)
    assert is_input_error("...\nValueError: options.fanouts = 0; expected ...\n")
    assert is_input_error(ValueError("x")) and not is_consequence(ValueError("x"))
    assert is_explained(ResidencyError("x")) and not is_input_error(ResidencyError("x"))
    assert not is_explained(KeyError("x")) and not is_explained("...\nKeyError: 'a'\n")
    assert not is_consequence("")


def test_ranks_that_failed_because_a_peer_did_are_one_line_beside_the_cause(tmp_path):
    """One rank refused its input (a damaged part); the others lost their peer in a
    collective: the cause is named in full, the rest in one line, no transport text."""
    from quietgnn.runtime.supervise import describe_failures
    logs = tmp_path / "logs"
    logs.mkdir()
    gone = ("Traceback (most recent call last):\nquietgnn.comm.communicator.CommError: rank {r}: "
            "all_to_all.wait (data, round 0, epoch -1) failed: RuntimeError: Connection reset "
            "by peer. GLHF!\n")
    for r in (0, 2):
        (logs / f"rank-{r}.error").write_text(gone.format(r=r))
    (logs / "rank-1.error").write_text("Traceback (most recent call last):\nValueError: "
                                       "partition file 'p/y.npy' does not match the checksum\n")
    text = describe_failures(tmp_path, [(0, 1, 0.0), (1, 1, 0.0), (2, 1, 0.0)], [], 5.0)
    assert "rank 1 exited with code 1: ValueError: partition file" in text
    assert "rank(s) [0, 2] stopped because rank(s) [1] did" in text
    assert "Connection reset" not in text
    # with no cause that said why (every rank lost a peer), each is still described
    (logs / "rank-1.error").write_text(gone.format(r=1))
    text = describe_failures(tmp_path, [(0, 1, 0.0), (1, 1, 0.0), (2, 1, 0.0)], [], 5.0)
    assert text.count("Connection reset") == 3
    # a rank killed without a word is the headline, though a survivor's error was seen first
    (logs / "rank-1.error").unlink()
    text = describe_failures(tmp_path, [(0, 1, 0.0), (2, 1, 0.0), (1, -9, 0.0)], [], 5.0)
    assert text.splitlines()[0].startswith("rank 1 was killed by signal SIGKILL"), text


def test_ranks_that_stopped_together_on_one_error_are_one_line(tmp_path):
    """A checkpoint that could not be written is raised on every rank together: its line came
    once per rank, each led by the module path of the error's class."""
    from quietgnn.runtime.supervise import describe_failures
    logs = tmp_path / "logs"
    logs.mkdir()
    full = ("Traceback (most recent call last):\nquietgnn.runtime.checkpoint.CheckpointError: "
            "could not write checkpoint 3 on rank(s) [0, 1]: No space left on device\n")
    for r in (0, 1):
        (logs / f"rank-{r}.error").write_text(full)
    text = describe_failures(tmp_path, [(0, 1, 0.0), (1, 1, 0.0)], [], 5.0)
    assert text.splitlines()[0] == (
        "ranks [0, 1] exited with code 1: CheckpointError: could not write checkpoint 3 on "
        "rank(s) [0, 1]: No space left on device"), text
    assert "quietgnn.runtime" not in text and len(text.splitlines()) == 2
