"""The run directory and the processes around it (issue: safety): no run overwritten, no old
numbers reported as new, outputs checked before the run, a full disk reported as such, SIGTERM
and a dead torchrun agent stop every worker, per-rank logs and attempts under torchrun, and a
two-host torchrun restart that comes back. Real `quietgnn train` / torchrun subprocesses on a
tiny graph."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_failures import TINY, _alive, _assert_no_orphans, _cli, _start_training, _survivors

from quietgnn.runtime.metrics import MetricsWriter
from quietgnn.runtime.records import SetupRecord
from quietgnn.runtime.spawn import spawn_function


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("quietgnn: error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


# ---------------------------------------------------------------------- overwrite / resume
@pytest.mark.slow   # four CLI runs: the slow tier (pytest -m slow)
def test_a_named_run_is_not_overwritten_unless_asked(tmp_path):
    first = _cli(["--epochs", "2", "--runtime.checkpoint_every", "1"], tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "r"
    before = (run_dir / "summary.json").read_text()
    again = _cli(["--epochs", "3"], tmp_path)
    assert again.returncode == 2
    line = _one_error_line(again.stderr)
    assert "already holds a run" in line and "--resume" in line and "--runtime.overwrite" in line
    assert (run_dir / "summary.json").read_text() == before       # untouched
    # asked explicitly: replaced, and the old run's checkpoints do not stay mixed in
    new = _cli(["--epochs", "3", "--runtime.overwrite", "true"], tmp_path)
    assert new.returncode == 0, new.stderr
    assert _summary(run_dir)["epochs"] == 3
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.slow   # four CLI runs: the slow tier (pytest -m slow)
def test_resume_of_a_finished_run_or_with_other_training_settings_is_refused(tmp_path):
    ck = ["--runtime.checkpoint_every", "1"]
    assert _cli(["--epochs", "3", *ck], tmp_path).returncode == 0
    run_dir = tmp_path / "r"
    before = (run_dir / "summary.json").read_text()
    # the same command again with --resume: nothing to train, must not report old numbers
    r = _cli(["--epochs", "3", *ck, "--resume"], tmp_path)
    assert r.returncode == 2
    assert "already finished 3 epoch(s)" in _one_error_line(r.stderr)
    # more epochs but another learning rate: the curve would belong to no single setting
    r = _cli(["--epochs", "5", *ck, "--resume", "--lr", "0.05"], tmp_path)
    assert r.returncode == 2
    assert "train.lr: checkpoint 0.01, this run 0.05" in _one_error_line(r.stderr)
    assert (run_dir / "summary.json").read_text() == before
    # more epochs, same settings: continues, and the summary counts both attempts
    r = _cli(["--epochs", "5", *ck, "--resume"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "resumed from checkpoint of epoch 2" in r.stderr
    s = _summary(run_dir)
    assert s["epochs"] == 5 and s["attempts"] == 2
    assert s["wall_seconds_total"] > s["wall_seconds"]


def test_resume_of_a_finished_run_without_a_checkpoint_is_refused_not_restarted(tmp_path):
    """Starting over would replace the finished run's results under its name, and count an
    attempt it did not make."""
    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir
    run_dir = tmp_path / "r"
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"epochs": 4, "test_acc": 0.5}))
    cfg = load_config(None, {"train": {"epochs": 8}, "runtime": {"resume": True}})
    with pytest.raises(ValueError, match="ended after 4 epoch.* without a checkpoint .* nothing "
                                         "to continue"):
        claim_run_dir(cfg, run_dir)
    # not "raise --epochs" first, which would only meet this refusal
    cfg = load_config(None, {"train": {"epochs": 4}, "runtime": {"resume": True}})
    with pytest.raises(ValueError, match="without a checkpoint"):
        claim_run_dir(cfg, run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 4


def test_an_attempt_that_trained_no_epoch_does_not_hold_its_name(tmp_path, capsys):
    """A run that failed at set-up (config.json, logs, set-up metrics) was refused as
    'already holds a run' when the same command was rerun once fixed; it is replaced (by the
    claiming process alone), while one epoch record, a checkpoint or a model still holds it."""
    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir, release_run_dir
    run_dir = tmp_path / "r"
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    (run_dir / "config.json").write_text(load_config(None, {}).to_json())
    (run_dir / "logs" / "rank-1.error").write_text("Traceback ...")
    (run_dir / "logs" / "rank-0.log").write_text("rank 0's log")
    setup = (run_dir / "metrics" / "rank-0.jsonl")
    setup.write_text('{"epoch": -1, "phase": "setup"}\n{"epoch": 0, "ph')     # torn: no epoch
    cfg = load_config(None, {"train": {"epochs": 3}})
    claim_run_dir(cfg, run_dir, lock=False)     # another rank under torchrun: checks only
    assert (run_dir / "config.json").is_file()
    try:
        claim_run_dir(cfg, run_dir)
    finally:
        release_run_dir(run_dir)
    assert "held an earlier attempt that trained no epoch" in capsys.readouterr().err
    assert not (run_dir / "config.json").exists() and not (run_dir / "metrics").exists()
    assert not (run_dir / "logs" / "rank-1.error").exists()
    assert (run_dir / "logs" / "rank-0.log").is_file()      # logs are the user's to read
    for held in ("metrics/rank-1.jsonl", "model.pt", "summary.json"):
        (run_dir / "metrics").mkdir(exist_ok=True)
        (run_dir / "config.json").write_text(load_config(None, {}).to_json())
        (run_dir / held).write_text('{"epoch": 0, "phase": "train"}\n')
        with pytest.raises(ValueError, match="already holds a run") as ei:
            claim_run_dir(cfg, run_dir, lock=False)
        # no checkpoint: --resume is not offered (it would only meet "nothing to continue")
        assert "--resume" not in str(ei.value) and "--runtime.overwrite true" in str(ei.value)
        (run_dir / held).unlink()
    # a folder of the user's named as the run directory (another tool's config.json and
    # checkpoints, or a file of theirs beside a quietgnn attempt) is never cleared
    for planted in ({"config.json": '{"lr": 1}', "checkpoints/model-epoch=9.ckpt": "w"},
                    {"config.json": load_config(None, {}).to_json(), "notes.txt": "mine"}):
        for name, text in planted.items():
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / name).write_text(text)
        with pytest.raises(ValueError, match="already holds a run"):
            claim_run_dir(cfg, run_dir, lock=False)
        assert all((run_dir / n).read_text() == t for n, t in planted.items())
        for name in planted:
            (run_dir / name).unlink()


def test_resume_of_a_finished_run_whose_commit_markers_are_gone_says_what_is_there(tmp_path):
    """Shards left but every COMMIT.json removed: the refusal said checkpointing had been off.
    It names the checkpoint files found without a marker, and what to do."""
    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir
    run_dir = tmp_path / "r"
    for e in (1, 2):
        (run_dir / "checkpoints" / f"epoch-00000{e}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"epoch-00000{e}" / "rank-0.pt").write_bytes(b"x")
    (run_dir / "summary.json").write_text(json.dumps({"epochs": 3, "test_acc": 0.5}))
    cfg = load_config(None, {"train": {"epochs": 5}, "runtime": {"resume": True}})
    with pytest.raises(ValueError) as ei:
        claim_run_dir(cfg, run_dir, lock=False)
    msg = str(ei.value)
    assert "checkpoint_every was off" not in msg, msg
    assert (f"ended after 3 epoch(s) with checkpoint files in "
            f"{str(run_dir / 'checkpoints')!r} but no complete checkpoint: no COMMIT.json in "
            f"epoch-000001, epoch-000002" in msg), msg
    assert "restore the COMMIT.json files if they were moved or edited, start a new run" in msg
    (run_dir / "checkpoints" / "epoch-000002" / "COMMIT.json").write_text('{"format": 1}')
    with pytest.raises(ValueError, match=r"no COMMIT.json in epoch-000001 and a damaged "
                                         r"COMMIT.json in epoch-000002 \(COMMIT.json is not a "
                                         r"quietgnn checkpoint marker\)"):
        claim_run_dir(cfg, run_dir, lock=False)


def test_a_run_directory_is_held_by_one_run_at_a_time(tmp_path):
    """Two ``--resume`` of one run trained from each other's checkpoints into one metrics
    file: the claim locks the directory for the claiming process, a second claim is refused."""
    import fcntl

    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir, release_run_dir
    cfg = load_config(None, {"train": {"epochs": 4}})
    run_dir = tmp_path / "r"
    other = None
    try:
        claim_run_dir(cfg, run_dir)
        claim_run_dir(cfg, run_dir)                     # this process again: allowed
        other = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)   # another claimant's view
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release_run_dir(run_dir)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)          # free once released
        with pytest.raises(ValueError, match="in use by another quietgnn run .*--run-name"):
            claim_run_dir(cfg, run_dir)
        # torchrun's ranks other than 0 share rank 0's directory without locking it
        claim_run_dir(cfg, run_dir, lock=False)
    finally:
        release_run_dir(run_dir)
        if other is not None:
            os.close(other)


def test_a_run_directory_that_cannot_be_locked_is_used_unlocked(tmp_path, monkeypatch, capsys):
    """A file system that cannot lock a directory (some network mounts) must not refuse every
    run: the claim goes on and says that concurrent runs would not be refused."""
    import errno
    import fcntl

    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir, release_run_dir

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(fcntl, "lockf", no_locks)
    run_dir = tmp_path / "r"
    try:
        claim_run_dir(load_config(None, {"train": {"epochs": 4}}), run_dir)
    finally:
        release_run_dir(run_dir)
    assert "cannot be locked (No locks available)" in capsys.readouterr().err


def test_where_a_directory_cannot_be_flocked_a_lock_file_holds_it(tmp_path, monkeypatch):
    """NFS emulates flock with POSIX locks, which want a file open for writing (EBADF on a
    directory): a lock file then holds the run directory, against another process too."""
    import errno
    import fcntl

    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import LOCK_FILE, claim_run_dir, release_run_dir

    def nfs_like(fd, op):
        raise OSError(errno.EBADF, "Bad file descriptor")
    monkeypatch.setattr(fcntl, "flock", nfs_like)
    cfg = load_config(None, {"train": {"epochs": 4}})
    run_dir = tmp_path / "r"
    try:
        claim_run_dir(cfg, run_dir)
        assert (run_dir / LOCK_FILE).is_file()
        pid = os.fork()          # POSIX locks are per process: ask from another one
        if pid == 0:
            import quietgnn.runtime.rundir as rundir
            rundir._LOCKS.clear()     # a new process (fork copies the table, not the lock)
            try:
                claim_run_dir(cfg, run_dir)
                code = 0
            except ValueError as exc:
                code = 3 if "in use by another quietgnn run" in str(exc) else 4
            os._exit(code)
        assert os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 3
    finally:
        release_run_dir(run_dir)


def test_a_refused_claim_leaves_the_holders_empty_directory(tmp_path):
    """Run A holds its named directory, still empty while it builds its book; run B with the
    same name is refused and must not remove A's directory (A would recreate it unlocked)."""
    import fcntl

    from quietgnn.config import load_config
    from quietgnn.runtime.plan import plan_local_run
    out = tmp_path / "out"
    run_dir = out / "same"
    run_dir.mkdir(parents=True)
    holder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)     # run A's lock
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        cfg = load_config(None, {"partition": {"parts": 2},
                                 "runtime": {"out_dir": str(out), "run_name": "same"}})
        with pytest.raises(ValueError, match="in use by another quietgnn run"):
            plan_local_run(cfg, lambda m: None)
        assert run_dir.is_dir()
    finally:
        os.close(holder)


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_link_in_the_run_directory_is_refused(tmp_path, link):
    """A link planted in place of a file quietgnn writes would make it write elsewhere (a
    log is opened with truncation): a symbolic one, or a hard one, its second name."""
    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import claim_run_dir, release_run_dir
    victim = tmp_path / "precious.txt"
    victim.write_text("keep")
    run_dir = tmp_path / "r"
    (run_dir / "logs").mkdir(parents=True)
    planted = run_dir / "logs" / "rank-1.log"
    planted.symlink_to(victim) if link == "symbolic" else os.link(victim, planted)
    said = "holds a symbolic link .*rank-1.log.*remove" if link == "symbolic" else \
        "rank-1.log', a file with 2 names"
    for resume in (True, False):
        cfg = load_config(None, {"train": {"epochs": 4}, "runtime": {"resume": resume}})
        try:
            with pytest.raises(ValueError, match=said):
                claim_run_dir(cfg, run_dir)
        finally:
            release_run_dir(run_dir)
    assert victim.read_text() == "keep"


def test_run_name_must_be_a_plain_name(tmp_path):
    r = _cli(["--run-name", "../elsewhere"], tmp_path)
    assert r.returncode == 2 and "expected a plain directory name" in _one_error_line(r.stderr)


# ---------------------------------------------------------------------- outputs writable
@pytest.mark.parametrize("flag,value,message", [
    ("--summary-json", "/dev/full", "is not a regular file"),
    ("--out", "/dev/full", "is not a writable directory"),
    ("--out", "/dev/null/runs", "is not a writable directory"),
])
def test_unwritable_outputs_are_refused_before_training(tmp_path, flag, value, message):
    args = [flag, value] if flag == "--summary-json" else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "quietgnn", "train", *TINY, "--epochs", "2",
           "--out", value if flag == "--out" else str(tmp_path), *args]
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in _one_error_line(r.stderr) and value in r.stderr
    assert "partitioned" not in r.stderr          # found before any work
    assert not list(tmp_path.glob("*/metrics"))
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------------- full disk
def _rec(epoch: int, pad: str = "") -> SetupRecord:
    return SetupRecord(epoch=epoch, rank=0, phase="setup", bytes={}, rounds=[[pad]],
                       peak_rss_mb=0.0, setup_s=0.0)


def test_metrics_record_is_whole_or_absent(tmp_path, monkeypatch):
    w = MetricsWriter(tmp_path, 0)
    w.write(_rec(0))
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError) as info:
        w.write(_rec(1, "x" * 200))
    monkeypatch.setattr(os, "write", real_write)
    assert info.value.errno == errno.ENOSPC and str(w.path) in str(info.value)
    w.write(_rec(2))
    w.close()
    lines = w.path.read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [0, 2]


def test_metrics_lines_of_another_shape_are_skipped_like_torn_ones(tmp_path):
    """An edited metrics line of valid JSON but another shape ([1, 2], "x", 3, an epoch that
    is no integer) or bytes that are not UTF-8 gave a traceback at --resume (when the trainer
    truncates the file) and in the launcher's failure report; each is dropped as a torn line
    is, by every reader."""
    from quietgnn.runtime.metrics import read_metrics, truncate_metrics
    from quietgnn.runtime.supervise import _last_epoch
    good = [json.dumps({"epoch": e, "rank": 0}).encode() for e in (-1, 0, 1, 2)]
    bad = [b"[1,2]", b'"x"', b"3", b"null", b'{"epoch":"x"}', b'{"epoch":true}', b"\xff\xfe",
           b'{"epoch":4', b"{}"]
    f = tmp_path / "metrics" / "rank-0.jsonl"
    f.parent.mkdir()
    f.write_bytes(b"\n".join(good[:2] + bad + good[2:] + bad) + b"\n")
    assert _last_epoch(tmp_path, 0) == 2
    assert [r["epoch"] for r in read_metrics(tmp_path)[0]] == [-1, 0, 1, 2]
    truncate_metrics(tmp_path, 0, 1)
    assert f.read_bytes().splitlines() == good[:3]


def test_unwritable_error_file_still_reports_the_reason(tmp_path):
    # rank 1's .error cannot be written (a directory in its way, as a full disk would do):
    # the launcher must show the real reason, not guess "killed, out of memory"
    (tmp_path / "r" / "logs" / "rank-1.error").mkdir(parents=True)
    r = _cli(["--epochs", "50", "--runtime.timeout_s", "20"], tmp_path,
             fault="rank=1,epoch=1,action=raise")
    assert r.returncode == 1, r.stderr
    assert "rank 1 exited with code 1 (last finished epoch 0): RuntimeError: injected fault " \
           "on rank 1" in r.stderr
    assert "without a traceback" not in r.stderr


@pytest.fixture
def tiny_fs(tmp_path):
    """A small tmpfs (root only; skipped elsewhere), unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_named_and_leaves_no_torn_files(tmp_path, tiny_fs):
    r = _cli(["--epochs", "400", "--runtime.checkpoint_every", "1", "--runtime.timeout_s", "20"],
             tiny_fs)
    assert r.returncode != 0
    assert "No space left on device" in r.stderr, r.stderr[-3000:]
    # what is left is said as it is: an earlier checkpoint named, or none
    assert ("is intact: --runtime.resume true continues from it" in r.stderr or
            "there is no earlier checkpoint" in r.stderr), r.stderr[-3000:]
    assert "without a traceback" not in r.stderr and "Traceback" not in r.stderr
    run_dir = tiny_fs / "r"
    for f in (run_dir / "metrics").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            json.loads(line)                        # every line a whole record
    leftovers = [p.name for p in run_dir.rglob("*") if ".tmp" in p.name]
    assert leftovers == [], leftovers
    _assert_no_orphans(run_dir)


def test_read_only_out_is_refused_before_training(tmp_path, tiny_fs):
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    r = _cli(["--epochs", "2"], tiny_fs)
    assert r.returncode == 2
    assert "Read-only file system" in _one_error_line(r.stderr)


# ---------------------------------------------------------------------- signals
def test_sigterm_stops_every_worker(tmp_path):
    p, run_dir, workers = _start_training(tmp_path)
    try:
        assert len(workers) == 2, workers
        p.send_signal(signal.SIGTERM)               # what a batch scheduler sends
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 143, err
    assert "terminated (SIGTERM); all workers stopped" in err
    _assert_no_orphans(run_dir)
    assert _alive(workers) == []


def _torchrun(args, tmp, nproc=2, extra=(), fault=None, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("QUIETGNN_FAULT", None)
    if fault:
        env["QUIETGNN_FAULT"] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", *extra, "--nproc-per-node",
           str(nproc), "-m", "quietgnn", "train", *TINY, "--out", str(tmp),
           "--runtime.progress", "false", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_workers_stop_when_the_torchrun_agent_is_killed(tmp_path):
    agent = _torchrun(["--epochs", "100000", "--run-name", "r"], tmp_path,
                      extra=["--standalone"], start_new_session=True)
    run_dir = tmp_path / "r"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and agent.poll() is None:
            f = run_dir / "metrics" / "rank-1.jsonl"
            if f.is_file() and '"epoch":0' in f.read_text():
                break
            time.sleep(0.2)
        workers = _survivors(tmp_path)              # workers carry --out tmp_path in argv
        assert len(workers) == 3, (workers, agent.poll())   # the agent and its 2 workers
        workers = [w for w in workers if w != agent.pid]
        os.kill(agent.pid, signal.SIGKILL)          # the agent only, not its workers
        agent.communicate(timeout=30)
        deadline = time.monotonic() + 20
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(workers) == [], "workers kept training after their agent died"
    finally:
        for w in _alive(_survivors(tmp_path)):
            os.kill(w, signal.SIGKILL)
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    # the first rank to notice says why; its peer may instead see the broken connection
    logs = "".join((run_dir / "logs" / f"rank-{r}.log").read_text() for r in (0, 1))
    assert "torchrun agent) is gone; stopping" in logs


@pytest.mark.slow   # two torchrun agents, a failure and a restart: the slow tier (pytest -m slow)
def test_two_host_torchrun_restart_resumes_with_logs_and_attempts(tmp_path):
    """Two torchrun agents on one machine emulate two hosts (c10d rendezvous, one worker
    each). Rank 1 raises in epoch 3 of the first attempt; both agents restart their workers,
    which must meet again (they used to read the dead attempt's gloo addresses: connection
    refused) and resume from the newest checkpoint. Each rank's log and the failed rank's
    .error land in the run directory; the summary counts the attempts."""
    import socket
    from test_determinism import GOLDEN, GOLDEN_ARGS, epoch_losses
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", QUIETGNN_FAULT="rank=1,epoch=3,action=raise")
    agents = []
    for _ in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", "--max-restarts", "2",
               "-m", "quietgnn", "train", *GOLDEN_ARGS, "--out", str(tmp_path), "--run-name",
               "r", "--runtime.checkpoint_every", "1", "--resume", "--runtime.timeout_s", "30"]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
    outs = [a.communicate(timeout=400) for a in agents]
    for a, (_, err) in zip(agents, outs):
        assert a.returncode == 0, err[-4000:]
    assert "connectFullMesh" not in outs[0][1] + outs[1][1]
    run_dir = tmp_path / "r"
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert epoch_losses(run_dir, 0) == pytest.approx(golden, rel=1e-5, abs=1e-7)
    assert "injected fault on rank 1" in (run_dir / "logs" / "rank-1.error").read_text()
    for rank in (0, 1):
        assert (run_dir / "logs" / f"rank-{rank}.log").stat().st_size > 0
    s = _summary(run_dir)
    # 2 unless ranks swapped agents on the restart and the fault fired once more
    assert s["attempts"] >= 2 and s["epochs"] == 6
    assert s["wall_seconds_total"] > s["wall_seconds"]


def _shared(comm, dirs):
    from pathlib import Path

    from quietgnn.runtime.rundir import check_shared
    d = Path(dirs[comm.rank])
    d.mkdir(parents=True, exist_ok=True)
    try:
        check_shared(comm, d)
        comm.barrier()                    # rank 0 has removed its token by now
        return "ok", sorted(p.name for p in d.iterdir())
    except ValueError as exc:
        return str(exc), None


def test_ranks_that_do_not_share_the_run_directory_are_refused_together(tmp_path):
    """Under torchrun each host names its own --out: one run directory per host would lose
    every checkpoint as torn. Every rank refuses alike, naming the ranks that see another
    (on one host: another --out; the advice to mount a shared file system was odd there)."""
    from quietgnn.runtime.rundir import check_shared
    same = spawn_function(_shared, 2, args=([str(tmp_path / "run")] * 2,))
    assert same == [("ok", []), ("ok", [])]          # the token is removed again
    apart = spawn_function(_shared, 2, args=([str(tmp_path / "a"), str(tmp_path / "b")],))
    for msg, _ in apart:      # one host: not an unshared file system, another --out
        assert "rank(s) [1], on rank 0's host, do not see the run directory" in msg, msg
        assert "another --out or --run-name" in msg

    class OtherHost:          # rank 0's view when rank 1 runs on another host
        rank = 0

        def all_gather_object(self, obj, kind, carries):
            return [obj, None] if isinstance(obj, str) else [obj, (False, "other-host")]
    with pytest.raises(ValueError, match=r"is not shared: rank\(s\) \[1\] \(host\(s\) "
                                         r"\['other-host'\]\) .* the same --out on a filesystem"):
        check_shared(OtherHost(), tmp_path / "run")


def test_more_workers_than_the_host_can_start_are_refused_leaving_nothing(tmp_path):
    """--parts 1000 started a thousand processes until the OOM killer stopped the launcher."""
    from quietgnn.config import load_config
    from quietgnn.heap import mem_available_mb
    from quietgnn.runtime.launcher import WORKER_BASE_MB
    from quietgnn.runtime.plan import plan_local_run
    parts = int(mem_available_mb() / WORKER_BASE_MB) + 1
    out = tmp_path / "out"
    cfg = load_config(None, {"partition": {"parts": parts}, "runtime": {"out_dir": str(out)}})
    out.mkdir()
    with pytest.raises(ValueError, match=rf"--parts {parts} starts {parts} worker processes .* "
                                         rf"use fewer parts"):
        plan_local_run(cfg, lambda m: None, made=((out, out),))
    assert not out.exists()             # nothing left: not the out directory either


def test_a_refused_run_takes_away_every_directory_its_checks_made(tmp_path):
    """``--out runs/typo/x`` refused before launch left ``runs/typo`` (and a summary's new
    directories) behind; a directory someone else put a file in meanwhile is kept."""
    from quietgnn.config import load_config
    from quietgnn.heap import mem_available_mb
    from quietgnn.runtime.launcher import WORKER_BASE_MB
    from quietgnn.runtime.plan import plan_local_run
    from quietgnn.runtime.outputs import check_outputs
    parts = int(mem_available_mb() / WORKER_BASE_MB) + 1         # refused by the plan
    (tmp_path / "runs").mkdir()
    for kept in (False, True):
        cfg = load_config(None, {"partition": {"parts": parts}, "runtime": {
            "out_dir": str(tmp_path / "runs/typo/x/y"),
            "summary_json": str(tmp_path / "s/t/summary.json")}})
        made = check_outputs(cfg, "--out", "--summary-json")
        assert (tmp_path / "runs/typo/x/y").is_dir() and (tmp_path / "s/t").is_dir()
        if kept:
            (tmp_path / "runs/typo/theirs.txt").write_text("x")
        with pytest.raises(ValueError, match="worker processes"):
            plan_local_run(cfg, lambda m: None, made=made)
        assert (tmp_path / "runs").is_dir() and not (tmp_path / "s").exists()
        assert sorted(p.name for p in (tmp_path / "runs").rglob("*")) == \
            (["theirs.txt", "typo"] if kept else [])


def test_a_model_too_large_to_train_is_refused_before_the_run_directory_is_written(
        tmp_path, monkeypatch):
    """Refused in the workers, the model left the launcher's config.json behind, and a rerun
    with the same --run-name found a run there. The launcher checks the book's widths first:
    the same refusal twice, and no run directory."""
    from quietgnn.config import load_config
    from quietgnn.runtime.plan import plan_local_run
    monkeypatch.setattr("quietgnn.heap.mem_available_mb", lambda: 1000.0)
    out = tmp_path / "out"
    # one copy (64 x 10**6 floats, 0.25 GiB) fits; four copies on each of 2 ranks do not
    cfg = {"partition": {"parts": 2}, "model": {"hidden": 10**6},
           "synthetic": {"nodes": 300, "feature_dim": 64},
           "runtime": {"out_dir": str(out), "run_name": "big"}}
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^model.hidden = 1000000: .* on each of the 2 "
                                             r"ranks of this host, needs"):
            plan_local_run(load_config(None, cfg), lambda m: None, made=((out, out),))
        assert not out.exists()


def test_a_link_planted_after_the_claim_is_not_followed(tmp_path):
    """The claim's check runs once; a link (or a hard link) planted later where quietgnn
    writes never leads the write to its target: a file is written under a fresh,
    unpredictable temporary name (O_EXCL) and renamed over its own."""
    from quietgnn.errors import is_explained
    from quietgnn.safefiles import WriteError, atomic_write
    victim = tmp_path / "precious.txt"
    victim.write_text("keep")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    # the temporary name is unpredictable and made anew (O_EXCL): a link or a hard link at
    # the name it once had (the pid alone) is neither written through nor in the way
    (run_dir / f".summary.json.tmp-{os.getpid()}").symlink_to(victim)
    os.link(victim, run_dir / f".config.json.tmp-{os.getpid()}")
    for name in ("summary.json", "config.json"):
        atomic_write(run_dir / name, b"{}")
        assert (run_dir / name).read_text() == "{}"
    assert victim.read_text() == "keep"
    with pytest.raises(WriteError, match="could not write .*gone/summary.json") as ei:
        atomic_write(run_dir / "gone" / "summary.json", b"{}")
    assert is_explained(ei.value)
    # --resume's truncation of a rank's metrics wrote to the fixed name rank-0.jsonl.tmp
    from quietgnn.runtime.metrics import truncate_metrics
    (run_dir / "metrics").mkdir()
    (run_dir / "metrics" / "rank-0.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n')
    (run_dir / "metrics" / "rank-0.jsonl.tmp").symlink_to(victim)
    truncate_metrics(run_dir, 0, 0)
    assert (run_dir / "metrics" / "rank-0.jsonl").read_text() == '{"epoch": 0}\n'
    assert victim.read_text() == "keep"
    # the metrics writer and the attempts log open their files without following a link
    from quietgnn.runtime.metrics import MetricsWriter
    from quietgnn.runtime.rundir import record_attempt
    (run_dir / "metrics" / "rank-1.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        MetricsWriter(run_dir, 1, append=True)
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "attempts.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        record_attempt(run_dir)
    assert victim.read_text() == "keep"


def test_ranks_started_with_different_settings_are_refused_by_name():
    """Under torchrun each rank builds its config from its own command line: another --lr on
    one rank trained silently, another --epochs or checkpoint_every hung in a collective, and
    another --model.hidden aborted gloo. Every rank now compares a digest at set-up."""
    from quietgnn.config import load_config
    from quietgnn.runtime.identity import check_ranks_agree, rank_settings, settings_digest

    class Comm:     # all_gather_object as every rank sees it, each rank with its own config
        def __init__(self, *cfgs):
            self.settings, self.ops = [rank_settings(c) for c in cfgs], []

        def all_gather_object(self, obj, kind, carries):
            self.ops.append((kind, carries))
            return [settings_digest(s) for s in self.settings] if isinstance(obj, str) \
                else self.settings

    base = {"train": {"epochs": 3}}
    same = load_config(None, base)
    comm = Comm(same, load_config(None, base))
    check_ranks_agree(comm, same)               # agreeing ranks: one 16-byte digest gathered
    assert comm.ops == [("config_check", "control")]
    for other, said in ((dict(base, train={"epochs": 3, "lr": 0.05}),
                         "train.lr: rank 0 0.01, rank 1 0.05"),
                        (dict(base, train={"epochs": 5}), "train.epochs: rank 0 3, rank 1 5"),
                        (dict(base, runtime={"checkpoint_every": 1}),
                         "runtime.checkpoint_every: rank 0 0, rank 1 1"),
                        (dict(base, model={"hidden": 32}), "model.hidden: rank 0 64, rank 1 32")):
        with pytest.raises(ValueError) as ei:
            check_ranks_agree(Comm(same, load_config(None, other)), same)
        msg = str(ei.value)
        assert msg.startswith("the ranks were started with different settings (") and \
            said in msg and msg.endswith("start every rank with the same command line and "
                                         "recipe"), msg
    # paths and threads may differ per host (a graph file too, where its name is the same)
    check_ranks_agree(Comm(same, load_config(None, dict(base, runtime={"threads": 3},
                                                        dataset={"root": "/elsewhere"}))), same)
    here, there = ({"dataset": {"name": f"{d}/g.npz"}, **base} for d in ("/a", "/b/c"))
    check_ranks_agree(Comm(load_config(None, here), load_config(None, there)),
                      load_config(None, here))
    # a host whose checkout was not updated: other code under the same version number
    comm = Comm(same, same)
    comm.settings[1] = dict(comm.settings[1], **{"software.quietgnn": "0123456789ab"})
    with pytest.raises(ValueError, match=r'different settings \(software.quietgnn: rank 0 '
                                         r'"[0-9a-f]{12}", rank 1 "0123456789ab"\): install '
                                         r'the same quietgnn code, torch and Python'):
        check_ranks_agree(comm, same)


def test_two_hand_started_ranks_with_another_lr_stop_at_set_up(tmp_path):
    """The comparison is wired in where torchrun's ranks meet, before the first collective
    that differing settings break (split_duplex): both ranks exit 2 with the keys named."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, extra in ((0, []), (1, ["--lr", "0.05"])):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   QUIETGNN_SECRET="0123456789abcdef0123456789abcdef")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "quietgnn", "train", "--synthetic.nodes", "300", "--parts",
             "2", "--epochs", "2", "--out", str(tmp_path), "--run-name", "r",
             "--runtime.duplex", "on", "--runtime.timeout_s", "30", *extra],
            env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        err = p.communicate(timeout=60)[1]
        assert p.returncode == 2, err
        assert "different settings (train.lr: rank 0 0.01, rank 1 0.05)" in _one_error_line(err)


def test_a_run_directory_too_long_for_the_file_system_is_refused_up_front(tmp_path):
    """A --out near PATH_MAX passed the checks, then failed writing config.json (a 4 KB
    message) and left an empty run directory; a --run-name over 255 bytes was a raw
    ENAMETOOLONG."""
    from quietgnn.config import load_config
    from quietgnn.runtime.rundir import DEEPEST_BELOW, claim_run_dir
    cfg = load_config(None, {})
    with pytest.raises(ValueError, match=r"^the run directory's name is 300 bytes .* file names "
                                         r"are limited to 255: pass a shorter --run-name$"):
        claim_run_dir(cfg, tmp_path / ("a" * 300), lock=False)
    deep = tmp_path / ("b" * (4096 - len(str(tmp_path)) - DEEPEST_BELOW + 10))
    with pytest.raises(ValueError, match=r"paths are limited to 4096 bytes here: choose a "
                                         r"shorter --out$"):
        claim_run_dir(cfg, deep / "run", lock=False)
    assert not list(tmp_path.iterdir())
