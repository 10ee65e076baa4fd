"""Signals at the command line: `quietgnn advise` and `bench` stopped by SIGTERM or Ctrl-C
stop their running run (its own process group) and say so in one line. In process: the runs
are stand-ins (a process and its child, in their own session), and the signal is sent to this
process by a thread once they are up."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from quietgnn.analysis.matrix import RunSpec
from quietgnn.cli import main

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
