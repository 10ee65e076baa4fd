"""Watching the worker processes of a local run: wait for them, stop the rest after the first
failure, and say what happened to each rank.

Each worker gets the write end of a pipe (``QUIETGNN_ERROR_FD``) on which it sends its
traceback when it fails (:func:`~quietgnn.runtime.worker._report_failure`); the launcher keeps
what arrives in memory. ``logs/rank-<k>.error`` is the durable copy, but when the disk is full
it cannot be written, and the reason must not turn into "killed, out of memory".
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from ..errors import is_consequence, is_explained, is_input_error
from .metrics import metrics_lines

__all__ = ["ErrorPipes", "die_with_parent", "supervise", "terminate", "describe_failures",
           "error_text", "is_consequence", "is_input_error"]


def die_with_parent() -> None:
    """``preexec_fn`` of a child that must not outlive the process starting it, even when
    that one is killed outright (SIGKILL, the OOM killer): the kernel sends the child SIGKILL
    then (PR_SET_PDEATHSIG; kept across the child's exec)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ErrorPipes:
    """One pipe per rank; :meth:`drain` collects (the tail of) what each rank reported."""

    _KEEP = 64_000

    def __init__(self, world: int) -> None:
        self.read_fds: list[int] = []
        self.write_fds: list[int] = []
        self.text: dict[int, bytearray] = {r: bytearray() for r in range(world)}
        for _ in range(world):
            r, w = os.pipe()
            os.set_blocking(r, False)
            self.read_fds.append(r)
            self.write_fds.append(w)

    def child_started(self, rank: int) -> None:
        """Close the parent's copy of the write end (the child keeps its own)."""
        os.close(self.write_fds[rank])
        self.write_fds[rank] = -1

    def drain(self) -> None:
        for r, fd in enumerate(self.read_fds):
            if fd < 0:
                continue
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                buf = self.text[r]
                buf += chunk
                del buf[:-self._KEEP]

    def get(self, rank: int) -> str:
        return self.text[rank].decode("utf-8", "replace")

    def close(self) -> None:
        for fd in self.read_fds + self.write_fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fds, self.write_fds = [], []


def supervise(procs: list[subprocess.Popen], grace_s: float,
              stuck: Optional[list[int]] = None, tolerate: bool = False,
              pipes: Optional[ErrorPipes] = None) -> list[tuple[int, int, float]]:
    """Wait for all processes; after the first failure give the rest ``grace_s`` then kill.
    Returns ``[(rank, returncode, time_of_exit)]`` of failed ranks, in order of failure; the
    ranks that were still running when the grace ran out are appended to ``stuck``.
    ``tolerate``: the strategy survives dead ranks (``Strategy.tolerates_failures``): only a
    failure of rank 0 (the one that writes the summary) starts the grace period."""
    failed: list[tuple[int, int, float]] = []
    done: set[int] = set()
    first_fail: Optional[float] = None
    while len(done) < len(procs):
        if pipes is not None:
            pipes.drain()
        for r, p in enumerate(procs):
            if r in done:
                continue
            rc = p.poll()
            if rc is None:
                continue
            done.add(r)
            if rc != 0:
                failed.append((r, rc, time.monotonic()))
                if not tolerate or r == 0:
                    first_fail = first_fail or time.monotonic()
            elif tolerate and r == 0:
                # rank 0 finished the run: survivors end with it; a rank still running after
                # the grace (e.g. one the hub dropped as hung) is terminated
                first_fail = first_fail or time.monotonic()
        if first_fail is not None and time.monotonic() - first_fail > grace_s:
            if stuck is not None:
                stuck.extend(r for r, p in enumerate(procs) if r not in done and p.poll() is None)
            terminate(procs)
        time.sleep(0.05)
    if pipes is not None:
        pipes.drain()
    return failed


def terminate(procs: Sequence[subprocess.Popen], wait_s: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + wait_s
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if p.poll() is None:
            p.kill()
            p.wait()


def _last_line(text: str) -> str:
    """A traceback's last line, its class named without its module (``quietgnn.runtime.
    checkpoint.CheckpointError: …`` -> ``CheckpointError: …``)."""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Z]\w*:)", "", lines[-1].strip()) if lines else ""


def _last_epoch(run_dir: Path, rank: int) -> Optional[int]:
    """The last epoch this rank finished (from its metrics file), None if none."""
    last = None
    try:
        for _, rec in metrics_lines(run_dir / "metrics" / f"rank-{rank}.jsonl"):
            last = rec["epoch"]
    except OSError:
        return None
    return last if last is not None and last >= 0 else None


def error_text(run_dir: Path, rank: int, pipes: Optional[ErrorPipes] = None) -> str:
    """What rank ``rank`` reported when it failed: from its pipe, else its ``.error`` file."""
    text = pipes.get(rank) if pipes is not None else ""
    if text:
        return text
    err = run_dir / "logs" / f"rank-{rank}.error"
    try:
        return err.read_text() if err.is_file() else ""
    except OSError:
        return ""


def describe_failures(run_dir: Path, failed: list[tuple[int, int, float]],
                      stuck: Sequence[int], grace_s: float,
                      pipes: Optional[ErrorPipes] = None) -> str:
    """One line per rank (how it ended, its error's last line: the rank, operation and epoch
    for a CommError), then the first traceback. Stuck ranks are named first: a rank that
    hangs is the cause, the timeouts of its peers are the symptom."""
    lines = []
    if stuck:
        lines.append(f"rank(s) {sorted(stuck)} stopped responding: still running {grace_s:g}s "
                     f"after the first failure, so they were terminated (stuck in a computation "
                     f"or a collective)")
    first_tb = ""
    texts = {r: error_text(run_dir, r, pipes) for r, _, _ in failed if r not in stuck}
    # where some rank failed of its own and said why (an input error, a crash), the ranks that
    # failed only because it did (a CommError: their peer gone) are one line, not a wall of
    # gloo text; the peers of a rank that was killed or stuck keep theirs: which operation, in
    # which epoch, lost it is all that is known of where it stopped
    causes = sorted(r for r, t in texts.items() if t and not is_consequence(t))
    caused = [r for r, t in texts.items() if t and is_consequence(t)] if causes else []
    # the first line is the run's headline: a rank that lost its peer (CommError) comes after
    # the ranks that failed of their own, or were killed without a word, whatever the order
    # the launcher saw them end in (a survivor's error can land before the kill is reaped)
    said: dict[str, list[int]] = {}      # what a rank's line says -> the ranks that said it
    for r, rc, _ in sorted(failed, key=lambda f: is_consequence(texts.get(f[0]) or "")):
        if r in stuck or r in caused:
            continue
        text = texts[r]
        if not is_consequence(text):   # a CommError is the symptom; show the cause's trace
            first_tb = first_tb or text
        how = f"was killed by signal {signal.Signals(-rc).name}" if rc < 0 else \
            f"exited with code {rc}"
        ep = _last_epoch(run_dir, r)
        where = f" (last finished epoch {ep})" if ep is not None else ""
        said.setdefault(f"{how}{where}: {_last_line(text)}" if text else
                        f"{how}{where} without a traceback (killed, out of memory, or "
                        f"os._exit)", []).append(r)
    # ranks that stopped together on one error (a checkpoint that could not be written is
    # raised on every rank) are one line, not the same line once per rank
    lines += [f"rank {rs[0]} {what}" if len(rs) == 1 else f"ranks {sorted(rs)} {what}"
              for what, rs in said.items()]
    for r in sorted(stuck):
        ep = _last_epoch(run_dir, r)
        lines.append(f"rank {r} was stuck" + (f" after epoch {ep}" if ep is not None else
                                              " before finishing an epoch"))
    if caused:
        lines.append(f"rank(s) {sorted(caused)} stopped because rank(s) {causes} did (a "
                     f"collective's peer was gone; each one's error in logs/rank-<k>.error)")
    lines.append(f"Run directory: {run_dir}")
    if first_tb and not is_explained(first_tb):
        lines.append(first_tb.rstrip())   # a bug or a crash: the traceback is the evidence
    return "\n".join(lines)
