"""The run directory: checked before anything is written, never silently overwritten, resumed
only when there is something to resume, and logged per rank.

A run directory (``<out>/<run name>``) holds ``config.json``, ``summary.json``,
``metrics/rank-<k>.jsonl``, ``checkpoints/`` and ``logs/`` (``rank-<k>.log``, and
``rank-<k>.error`` for a rank that failed). Rules, the same under the local launcher and
under ``torchrun``:

* a fresh run (no ``--resume``) into a directory that already holds a run's results is refused
  (``ValueError``: exit 2), unless ``--runtime.overwrite true`` asks to replace them; a restart
  of the same job by torchrun (``TORCHELASTIC_RESTART_COUNT`` > 0) is not a fresh run, and an
  earlier attempt that failed before its first epoch holds no results (it is replaced);
* ``--resume`` of a run that already finished the epochs asked for is refused (it would train
  nothing and report the old numbers as new); other training settings than the checkpoint's are
  refused by :func:`~quietgnn.runtime.checkpoint.check_resume_compatible` (``train.*`` is part
  of the run identity, ``train.epochs`` excepted);
* every output path is checked writable before the (possibly long) run starts
  (:mod:`quietgnn.runtime.outputs`);
* one run at a time: the process that claims a run directory (the launcher; rank 0 under
  torchrun) holds a lock on it until it exits, and a second claim is refused: two ``--resume``
  of one run would otherwise train from each other's checkpoints into one metrics file;
* the directory holds no symbolic link: quietgnn writes its files by name there, and a link
  planted in place of one (``config.json`` -> ``~/.bashrc``) would make it overwrite a file
  elsewhere.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TextIO

from ..safefiles import no_follow
from ..serial import loads_json
from .outputs import _oserr

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["claim_run_dir", "release_run_dir", "holds_run_dir", "remove_if_empty",
           "record_attempt", "attempts", "attempt_totals", "tee_stderr", "restart_count",
           "check_path_room"]

#: what makes a directory "hold a run" (log files alone do not: they are truncated on reuse)
_RESULTS = ("summary.json", "config.json", "metrics", "checkpoints", "model.json", "model.pt")


def restart_count() -> int:
    """torchrun's restart number of this worker group (0: the first attempt, or no torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def _results_in(run_dir: Path) -> list[str]:
    return [n for n in _RESULTS if (run_dir / n).exists()]


#: the longest path quietgnn writes below a run directory, in bytes, with a temporary name's
#: suffix: ``checkpoints/epoch-<n>/rank-<k>.pt``, ``report/<dataset>-<model>-<plot>.png``
DEEPEST_BELOW = 160
#: a file name's limit on Linux file systems (NAME_MAX)
NAME_MAX = 255


def check_path_room(run_dir: Path) -> None:
    """Refuse (``ValueError``) a run directory whose name, or whose path with the files below
    it, exceeds what the file system takes: a --out near PATH_MAX passed every check, then
    failed writing ``config.json`` with a 4 KB message and left an empty run directory."""
    name = len(os.fsencode(run_dir.name))
    if name > NAME_MAX:
        raise ValueError(f"the run directory's name is {name} bytes ({run_dir.name[:40]}…), and "
                         f"file names are limited to {NAME_MAX}: pass a shorter --run-name")
    full = len(os.fsencode(os.path.abspath(run_dir)))
    try:
        limit = os.pathconf(_existing(run_dir), "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    if full + DEEPEST_BELOW > limit:
        raise ValueError(f"the run directory's path is {full} bytes ({str(run_dir)[:40]}…); "
                         f"quietgnn writes files up to {DEEPEST_BELOW} bytes below it, and "
                         f"paths are limited to {limit} bytes here: choose a shorter --out")


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _trained_nothing(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a quietgnn attempt that ended before it trained an epoch,
    and nothing else: a ``config.json`` quietgnn wrote, only quietgnn's own names beside it
    (a project folder named as the run directory keeps its files: refused, not cleared),
    no summary, model or checkpoint, and no metrics record past set-up (epoch -1)."""
    from .metrics import metrics_lines
    try:
        written = loads_json((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(written, dict) or not {"strategy", "runtime", "train"} <= set(written):
        return False
    # what each of quietgnn's names may hold ("": a file; "-": an empty folder, checkpoints/
    # as set-up leaves it); anything else (summary.json, model.*, a checkpoint, a file of the
    # user's) is a result, or not quietgnn's
    own = {"config.json": "", LOCK_FILE: "", "metrics": "rank-*.jsonl", "checkpoints": "-",
           "logs": "rank-*"}
    for p in run_dir.iterdir():
        inside = own.get(p.name)
        if inside is None or (inside and not (p.is_dir() and all(
                f.match(inside) or f.name == "attempts.jsonl" for f in p.iterdir()))):
            return False
    return not any(rec["epoch"] >= 0 for f in (run_dir / "metrics").glob("rank-*.jsonl")
                   if f.is_file() for _, rec in metrics_lines(f))


def _clear(run_dir: Path) -> None:
    """Remove an earlier run's results (``--runtime.overwrite``), nothing else of the user's."""
    for n in _RESULTS:
        p = run_dir / n
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink(missing_ok=True)
    for p in list(run_dir.glob("checkpoints.stale-*")) + list(run_dir.glob("logs/*.error")) + \
            [run_dir / "logs" / "attempts.jsonl"]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


#: run directories this process claimed (path -> (descriptor holding the lock, the lock file
#: where one was needed); (None, None): claimed on a file system that cannot lock)
_LOCKS: dict[str, tuple[Optional[int], Optional[Path]]] = {}
#: the lock file, where the directory itself cannot be locked (NFS: see _lock)
LOCK_FILE = ".quietgnn-lock"
#: a restarted rank 0 may find its dead predecessor's lock still held by a network file
#: system's server until that host's lease runs out (NFSv4: 90 s by default)
RESTART_LOCK_WAIT_S = 120.0


def _in_use(run_dir: Path) -> ValueError:
    return ValueError(f"run directory {str(run_dir)!r} is in use by another quietgnn run (a "
                      f"process holds its lock); wait for that run to end, or give this one "
                      f"another --run-name")


def _try_lock(run_dir: Path) -> Optional[tuple[Optional[int], Optional[Path]]]:
    """One attempt: the lock's (descriptor, lock file), or None while another process holds
    it. An ``flock`` on the directory itself leaves nothing behind; where that cannot be had
    (NFS emulates ``flock`` with POSIX locks, which want a file open for writing: EBADF on a
    directory) a POSIX lock on ``LOCK_FILE``, which stays. Where neither works, unlocked,
    said once."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, None
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, path
        except OSError:
            os.close(fd)
            raise
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        sys.stderr.write(f"note: run directory {str(run_dir)!r} cannot be locked "
                         f"({exc.strerror or exc}); two runs into it at once would not be "
                         f"refused\n")
        return None, None


def _lock(run_dir: Path) -> None:
    """Hold the run directory for the rest of this process's life (:func:`_try_lock`); the
    kernel drops the lock when the process ends, however it ends. A second process's claim is
    refused; this process may claim again (the API runs one run after another in one
    process). A torchrun restart retries for a while (a dead host's lease)."""
    key = os.path.realpath(run_dir)
    if key in _LOCKS:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (RESTART_LOCK_WAIT_S if restart_count() > 0 else 0.0)
    while (got := _try_lock(run_dir)) is None:
        if time.monotonic() >= deadline:
            raise _in_use(run_dir)
        time.sleep(2.0)
    _LOCKS[key] = got


def holds_run_dir(run_dir: Path) -> bool:
    """Whether this process claimed ``run_dir`` (and may remove it when refused empty)."""
    return os.path.realpath(run_dir) in _LOCKS


def release_run_dir(run_dir: Path) -> None:
    """Drop this process's lock on ``run_dir`` (a run ended or was refused: a notebook that
    ran it must not keep the run from being resumed elsewhere)."""
    fd, _ = _LOCKS.pop(os.path.realpath(run_dir), (None, None))
    if fd is not None:
        os.close(fd)


def _refuse_links(run_dir: Path) -> None:
    """No symbolic link anywhere inside ``run_dir`` (see the module docstring)."""
    for root, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            p = Path(root) / name
            if p.is_symlink():
                raise ValueError(f"run directory {str(run_dir)!r} holds a symbolic link "
                                 f"{str(p)!r} -> {os.readlink(p)!r}; quietgnn writes only "
                                 f"regular files there (a link would make it write "
                                 f"elsewhere): remove the link, or use another --run-name")
            if name in files and p.stat().st_nlink > 1:   # a hard link: the same, for logs
                raise ValueError(f"run directory {str(run_dir)!r} holds {str(p)!r}, a file "
                                 f"with {p.stat().st_nlink} names (a hard link: a write there "
                                 f"reaches a file elsewhere); remove it, or use another "
                                 f"--run-name")


def claim_run_dir(cfg: RunConfig, run_dir: Path, lock: bool = True) -> None:
    """Refuse (``ValueError``) what would overwrite a run or report old numbers as new, a run
    directory another run holds, or one holding a symbolic link; call it before anything of
    this run is written (see the module docstring). ``lock``: hold the directory for this
    process (the launcher's; rank 0's alone under torchrun, whose ranks share it)."""
    from .checkpoint import check_resume_compatible, committed_checkpoints
    rt = cfg.runtime
    run_dir = Path(run_dir)
    check_path_room(run_dir)
    if lock:
        _lock(run_dir)
    if run_dir.is_dir():
        _refuse_links(run_dir)
    if rt.resume:
        summary = run_dir / "summary.json"
        if summary.is_file():
            from .records import RunSummary
            try:
                s = RunSummary.from_json(loads_json(summary.read_text()))
            except (OSError, ValueError, TypeError, AttributeError):   # unreadable: resume
                s = None
            done = s.epochs if s is not None else None
            if not committed_checkpoints(run_dir / "checkpoints") and restart_count() == 0:
                # starting over would replace a finished run's results under its name
                why, fix = _no_checkpoint(run_dir / "checkpoints")
                raise ValueError(
                    f"--resume: the run in {str(run_dir)!r} ended "
                    + (f"after {done} epoch(s) " if isinstance(done, int) else "")
                    + f"{why}, so there is nothing to continue from; {fix}start a new run "
                    f"with another --run-name, or pass --runtime.overwrite true (without "
                    f"--resume) to replace it")
            if isinstance(done, int) and done >= cfg.train.epochs:
                raise ValueError(
                    f"--resume: the run in {str(run_dir)!r} already finished {done} "
                    f"epoch(s) (test accuracy {s.test_acc}; --epochs {cfg.train.epochs} asks "
                    f"for no more); there is nothing to resume. Raise --epochs to train it "
                    f"further, or start a new run with another --run-name")
        check_resume_compatible(cfg, run_dir / "checkpoints")
        return
    found = _results_in(run_dir)
    if not found or restart_count() > 0:
        return
    if _trained_nothing(run_dir):
        # an attempt that failed before its first epoch (set-up, a bad input only the workers
        # saw) left nothing to protect: the same command, once fixed, reuses its name
        if lock:     # the claiming process alone clears (torchrun's other ranks check only)
            print(f"note: {str(run_dir)!r} held an earlier attempt that trained no epoch "
                  f"({', '.join(found)}); replacing it", file=sys.stderr, flush=True)
            _clear(run_dir)
        return
    if rt.overwrite:
        _clear(run_dir)
        return
    # --resume is offered only where it would find something to continue from
    if not committed_checkpoints(run_dir / "checkpoints"):
        resume = ""
    elif (run_dir / "summary.json").is_file():
        resume = "--resume with more --epochs to train it further, "
    else:
        resume = "--resume to continue it, "
    raise ValueError(
        f"run directory {str(run_dir)!r} already holds a run ({', '.join(found)}); pass "
        f"{resume}another --run-name (or --out) for a new run, or --runtime.overwrite true to "
        f"replace it")


def _no_checkpoint(ckpt_dir: Path) -> tuple[str, str]:
    """Why a finished run has no checkpoint to resume, and a first fix: none was written, or
    what is there is not a whole one (its ``COMMIT.json``, which rank 0 writes once every
    rank's shard has landed, missing or damaged). The first three of each kind are named."""
    from .checkpoint import MARKER, _epoch_of, _read_marker
    found = sorted(d for d in (ckpt_dir.iterdir() if ckpt_dir.is_dir() else [])
                   if _epoch_of(d) is not None)
    if not found:
        return "without a checkpoint (--runtime.checkpoint_every was off)", ""
    missing = [d.name for d in found if not (d / MARKER).is_file()]
    damaged = [f"{d.name} ({_read_marker(d)[1]})" for d in found if (d / MARKER).is_file()]
    said = ([f"no {MARKER} in {', '.join(missing[-3:])}"] if missing else []) + \
        ([f"a damaged {MARKER} in {'; '.join(damaged[-3:])}"] if damaged else [])
    return (f"with checkpoint files in {str(ckpt_dir)!r} but no complete checkpoint: "
            f"{' and '.join(said)} (rank 0 writes it once every rank's shard has landed; "
            f"without a valid one a checkpoint does not count)",
            f"restore the {MARKER} files if they were moved or edited, ")


def remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` if it is empty: a run refused before it wrote anything (a dataset
    that does not load, a graph that fails validation) leaves no empty run directory behind.
    Never touches a directory holding anything but the lock file this process made."""
    _, lock_file = _LOCKS.get(os.path.realpath(run_dir), (None, None))
    release_run_dir(run_dir)
    if lock_file is not None and [p.name for p in Path(run_dir).iterdir()] == [LOCK_FILE]:
        lock_file.unlink(missing_ok=True)
    try:
        Path(run_dir).rmdir()      # fails on a non-empty (or missing) directory, as intended
    except OSError:
        pass


# ---------------------------------------------------------------------- attempts
def record_attempt(run_dir: Path) -> None:
    """Rank 0 notes the start of an attempt (a torchrun restart, a --resume) in
    ``logs/attempts.jsonl``; the summary reports their number and the time since the first."""
    f = Path(run_dir) / "logs" / "attempts.jsonl"
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f, "a", opener=no_follow) as fh:
        fh.write(json.dumps({"start": time.time(), "restart": restart_count()}) + "\n")


def attempts(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    try:
        for line in (Path(run_dir) / "logs" / "attempts.jsonl").read_text().splitlines():
            try:
                rec = loads_json(line)
            except ValueError:
                continue
            if isinstance(rec, dict):        # an edited line of another shape is skipped
                out.append(rec)
    except OSError:
        pass
    return out


def attempt_totals(run_dir: Path, wall: float) -> dict[str, Any]:
    """How many attempts the run took (torchrun restarts, ``--resume`` invocations) and the
    wall seconds since the first one started (restarts, and any pause between a crash and the
    resume, included); ``wall`` (the summary's ``wall_seconds``) is the last attempt's alone."""
    found = attempts(run_dir)
    starts = [a["start"] for a in found if isinstance(a.get("start"), (int, float))]
    total = max(wall, time.time() - min(starts)) if starts else wall
    return {"attempts": max(1, len(found)), "wall_seconds_total": total}


# ---------------------------------------------------------------------- per-rank logs
class _Tee:
    """stderr that is also written to the rank's log file (best effort: a full disk must not
    turn a message into a second failure)."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self._stream, self._log = stream, log

    def write(self, s: str) -> int:
        try:
            self._log.write(s)
            self._log.flush()
        except (OSError, ValueError):
            pass
        return self._stream.write(s)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tee_stderr(run_dir: Path, rank: int) -> Optional[Path]:
    """Copy this process's stderr (progress, messages, tracebacks) into
    ``logs/rank-<rank>.log``; used where stderr is not already redirected there (rank 0 of the
    local launcher, every rank under torchrun)."""
    path = Path(run_dir) / "logs" / f"rank-{rank}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "a" if restart_count() > 0 else "w", buffering=1, opener=no_follow)
    except OSError:
        return None
    sys.stderr = _Tee(sys.stderr, log)   # type: ignore[assignment]
    return path


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON at ``path``, atomically (temp file, fsync, rename): a reader that polls
    for the file (a script waiting on ``--summary-json``) never reads half of it."""
    from ..safefiles import atomic_write
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(obj, indent=1).encode())


def check_shared(comm: Any, run_dir: Path) -> None:
    """Refuse, on every rank alike (``ValueError``: exit 2), a run whose ranks do not see one
    run directory: rank 0 commits a checkpoint once every rank's shard is in it, and a restart
    looks for them there, so a directory per host would skip every checkpoint as torn and keep
    shards nobody commits. Rank 0 leaves a token file; every rank says whether it sees it.
    Collective (two small gathers, at start-up under torchrun)."""
    import secrets
    import socket
    token = None
    if comm.rank == 0:
        token = f".shared-check-{secrets.token_hex(8)}"
        try:
            (run_dir / token).write_text(socket.gethostname())
        except OSError as exc:   # said on every rank below, not left to a peer's timeout
            token = f"!{_oserr(exc)}"
    token = comm.all_gather_object(token, "control", carries="control")[0]
    if token.startswith("!"):
        raise ValueError(f"rank 0 cannot write the run directory {str(run_dir)!r}: {token[1:]}")
    seen = comm.all_gather_object(((run_dir / token).is_file(), socket.gethostname()),
                                  "control", carries="control")
    if comm.rank == 0:
        (run_dir / token).unlink(missing_ok=True)
    blind = [(r, host) for r, (ok, host) in enumerate(seen) if not ok]
    if blind and all(host == seen[0][1] for _, host in blind):
        # rank 0's own host: not a file system that is not shared, another --out or run name
        raise ValueError(
            f"rank(s) {[r for r, _ in blind]}, on rank 0's host, do not see the run directory "
            f"{str(run_dir)!r} that rank 0 writes: they were given another --out or "
            f"--run-name (start every rank with the same ones), or they run in containers "
            f"that share a host name but not rank 0's file system")
    if blind:
        raise ValueError(
            f"the run directory {str(run_dir)!r} is not shared: rank(s) {[r for r, _ in blind]} "
            f"(host(s) {sorted({h for _, h in blind})}) do not see the file rank 0 wrote there. "
            f"Every host must use one run directory (checkpoints are committed across ranks): "
            f"pass the same --out on a filesystem every host mounts (NFS, a shared volume)")
