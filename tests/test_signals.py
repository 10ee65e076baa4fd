"""Signals and process limits at the command line: `quietgnn advise` and `bench` stopped by
SIGTERM or Ctrl-C stop their running run (its own process group) and say so in one line; a
low open-files limit is raised, or refused before anything starts. In process: the runs are
stand-ins (a process and its child, in their own session), and the signal is sent to this
process by a thread once they are up."""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from quietgnn.analysis.matrix import RunSpec
from quietgnn.cli import main
from quietgnn.runtime import launcher

#: a run that never ends: it starts a child (as the launcher starts its workers), writes both
#: PIDs, then waits
_SLEEPER = ("import os, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "p = sys.argv[1]\n"
            "open(p + '.tmp', 'w').write(f'{os.getpid()} {c.pid}')\n"
            "os.rename(p + '.tmp', p)\n"
            "time.sleep(120)\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stand_in_runs(monkeypatch, tmp_path: Path, quick: int = 0) -> Path:
    """Every run becomes the sleeper, except the first ``quick`` ones, which end at once
    (without a summary: recorded as failed, and kept). Returns where the sleeper writes."""
    pids = tmp_path / "pids"
    calls = []

    def command(self, run_dir, summary, python=sys.executable):
        calls.append(self.id)
        if len(calls) <= quick:
            return [python, "-c", "pass"]
        return [python, "-c", _SLEEPER, str(pids)]
    monkeypatch.setattr(RunSpec, "command", command)
    return pids


def _signal_when_up(pids: Path, signum: int) -> threading.Thread:
    def send():
        deadline = time.monotonic() + 60
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


@pytest.fixture
def handlers():
    """Ctrl-C as in a terminal (a test run started in the background by a non-interactive
    shell inherits SIGINT ignored); both handlers restored after."""
    old = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old[0])
    signal.signal(signal.SIGTERM, old[1])


SIGNALS = [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "SIGINT", 130)]


@pytest.mark.parametrize("signum,name,code", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_stopped_advise_stops_its_probe_and_removes_its_temporary_directory(
        tmp_path, monkeypatch, capsys, handlers, signum, name, code):
    pids = _stand_in_runs(monkeypatch, tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    _signal_when_up(pids, signum)
    rc = main(["advise", "--dataset", "synthetic", "--parts", "2", "--strategies", "halo",
               "--no-extend", "--set", "synthetic.nodes=200", "--set",
               "synthetic.feature_dim=4"])
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.strip().splitlines()[-1] == \
        f"quietgnn advise: interrupted ({name}); the probe was stopped"
    assert "Traceback" not in err
    probe, child = map(int, pids.read_text().split())
    assert not _alive(probe) and not _alive(child)      # the probe's whole group
    assert list(tmp.iterdir()) == []                     # quietgnn-advise-* removed


@pytest.mark.parametrize("signum,name,code", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_stopped_bench_stops_its_run_keeps_the_finished_ones_and_says_so(
        tmp_path, monkeypatch, capsys, handlers, signum, name, code):
    pids = _stand_in_runs(monkeypatch, tmp_path, quick=1)
    matrix = tmp_path / "m.yaml"
    matrix.write_text("datasets: [cora]\nstrategies: [halo, adaqp]\n")
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    _signal_when_up(pids, signum)
    rc = main(["bench", "--matrix", str(matrix), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.strip().splitlines()[-1] == (
        f"quietgnn bench: interrupted ({name}); the running run was stopped; finished runs "
        f"are kept, rerun the same command to continue (it skips them)")
    assert "Traceback" not in err
    run, child = map(int, pids.read_text().split())
    assert not _alive(run) and not _alive(child)
    assert len(list((out / "results").glob("*.json"))) == 1     # the first run's, kept
    assert signal.getsignal(signal.SIGTERM) == before     # this process's own again


class _Limits:
    """RLIMIT_NOFILE as the test sets it, and what the code asked to set it to."""

    def __init__(self, soft: int, hard: int) -> None:
        self.now, self.set_to = (soft, hard), []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.now

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        self.set_to.append(limits)
        self.now = limits


def _limits(monkeypatch, soft: int, hard: int) -> _Limits:
    lim = _Limits(soft, hard)
    monkeypatch.setattr(resource, "getrlimit", lim.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", lim.setrlimit)
    return lim


def test_a_low_soft_open_files_limit_is_raised_to_the_hard_one(monkeypatch):
    lim = _limits(monkeypatch, 16, 4096)
    launcher.ensure_open_files(2, "train")
    assert lim.set_to == [(4096, 4096)]
    lim = _limits(monkeypatch, 16, resource.RLIM_INFINITY)
    launcher.ensure_open_files(4, "train")     # no infinite soft limit: what the run needs
    assert lim.set_to == [(launcher.OPEN_FILES_FLOOR + 4 * launcher.OPEN_FILES_PER_PART,
                           resource.RLIM_INFINITY)]
    lim = _limits(monkeypatch, 65536, 65536)
    launcher.ensure_open_files(2, "train")
    assert lim.set_to == []
    lim = _limits(monkeypatch, 1024, 2**30)     # a container's: raised to 65536, not 1e9
    launcher.ensure_open_files(2, "train")
    assert lim.set_to == [(65536, 2**30)]


@pytest.mark.parametrize("argv,what", [
    (["train", "--synthetic.nodes", "200", "--parts", "2"], "quietgnn train of 2 part(s)"),
    (["prepare", "--dataset", "synthetic", "--synthetic.nodes", "200", "--parts", "2"],
     "quietgnn prepare of 2 part(s)"),
], ids=["train", "prepare"])
def test_a_hard_open_files_limit_too_low_is_refused_before_anything_starts(
        tmp_path, monkeypatch, capsys, argv, what):
    _limits(monkeypatch, 16, 16)
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    need = launcher.OPEN_FILES_FLOOR + 2 * launcher.OPEN_FILES_PER_PART
    assert err.startswith(f"quietgnn: error: open-files limit 16 (hard limit 16); {what} "
                          f"needs at least {need} open files: raise it (`ulimit -n {need}`")
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_each_rank_under_torchrun_counts_the_world_size(tmp_path, monkeypatch, capsys):
    _limits(monkeypatch, 300, 300)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert main(["train", "--synthetic.nodes", "200", "--out", str(tmp_path / "out")]) == 2
    need = launcher.OPEN_FILES_FLOOR + 64 * launcher.OPEN_FILES_PER_PART
    assert f"quietgnn train of 64 part(s) needs at least {need} open files" in \
        capsys.readouterr().err


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] <
                    launcher.OPEN_FILES_FLOOR + 2 * launcher.OPEN_FILES_PER_PART,
                    reason="this machine's hard open-files limit is below what a run needs")
def test_a_real_low_soft_limit_is_raised():
    """The limit as ``ulimit -Sn 16`` leaves it (with it rank 1's store failed and rank 0
    waited out the timeout): raised towards the hard limit, which the workers inherit. In
    this process (no interpreter started for it), the limit put back afterwards."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, before[1]))
        launcher.ensure_open_files(2, "train")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    assert hard == before[1] and soft == min(hard, 65536)


def test_the_python_api_checks_the_open_files_limit_too(tmp_path, monkeypatch):
    from quietgnn.api import train
    _limits(monkeypatch, 16, 16)
    with pytest.raises(ValueError, match=r"^open-files limit 16 \(hard limit 16\); quietgnn "
                                         r"train of 2 part\(s\) needs at least"):
        train("synthetic", parts=2, out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
