"""Local launcher: partition once, spawn P worker processes on 127.0.0.1, watch them.

``quietgnn train --parts 4`` (this module) and ``torchrun --nproc-per-node 4 -m quietgnn
train`` run the same worker code: the launcher only sets the variables torchrun would set
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) plus one compute thread per worker.

Failure policy: when a worker exits non-zero, the others get ``grace`` seconds to fail on
their own (they see the broken connection), then are terminated; the launcher raises
:class:`LaunchError` with the failing rank's traceback. Strategies with
``tolerates_failures`` (``tma``) are the exception: when a rank other than 0 dies the others
go on, and the launcher returns rank 0's summary (which reports the loss) with a note on
stderr. Ctrl-C and SIGTERM stop every worker.
Workers die with the launcher even if it is killed outright (PR_SET_PDEATHSIG), so nothing is
orphaned.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Optional

from ..comm.rendezvous import SECRET_ENV
from ..safefiles import atomic_write, no_follow
from ..serial import loads_json
# the book cache lived here; its names stay importable from the launcher
from .books import cache_dir, check_book_dataset, prepare_book  # noqa: F401
from .rundir import release_run_dir
from .supervise import (ErrorPipes, describe_failures, die_with_parent, error_text,
                        is_consequence, is_input_error, supervise, terminate)

if TYPE_CHECKING:
    from .plan import RunPlan

__all__ = ["LaunchError", "launch", "free_port", "cache_dir", "prepare_book",
           "check_book_dataset", "ensure_open_files"]


class LaunchError(RuntimeError):
    """A worker failed; the message names the rank and carries its traceback."""

    #: the run failed on bad input (a worker raised ValueError: a damaged file, a config the
    #: data contradicts); the CLI exits with 2 as for input errors found before the launch
    input_error: bool = False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: a worker's memory before it holds any data: Python, torch and quietgnn imported. Measured
#: (Linux x86-64, Python 3.11, torch 2.13.0 CPU build) as /proc/<pid>/smaps_rollup's Pss of one
#: python process that imported torch, quietgnn, its worker, trainer, comm and strategies, and
#: nothing else ran: 224 MiB (Rss 226 MiB, 149 MiB of it private and dirty); a training worker
#: of a 300-node graph, one of two: Pss 258 MiB, 221 MiB private. Rounded down to stay a lower
#: bound, so that a refusal is sure
WORKER_BASE_MB = 216.0


def check_workers_fit(world: int) -> None:
    """Refuse (``ValueError``) more local workers than this host's available memory can start:
    a thousand ``--parts`` would otherwise start a thousand processes until the kernel's OOM
    killer stops the launcher."""
    from ..heap import mem_available_mb
    need, avail = world * WORKER_BASE_MB, mem_available_mb()
    if need > avail:
        raise ValueError(f"--parts {world} starts {world} worker processes on this host; each "
                         f"needs at least {WORKER_BASE_MB / 1024:.2g} GiB before it holds any "
                         f"data (Python and torch), {need / 1024:.3g} GiB in all, more than the "
                         f"{avail / 1024:.3g} GiB available: use fewer parts, or spread them "
                         f"over hosts with torchrun")


#: open files a process of a run may hold: a floor, plus some per part or rank. Measured as the
#: lowest ``ulimit -n`` under which a run succeeds: ``train`` (halo, synthetic graph; rank 0
#: holds the rendezvous store's connection to every rank and gloo's pairs) 39-40 at 2 ranks,
#: 43-44 at 4, 49-52 at 8; the out-of-core ``prepare synthetic`` 17-20 at 4 parts, 49-64 at
#: 16; the in-memory prepare 12 or fewer. Below it, rank 1's store failed in C++ and rank 0
#: waited out runtime.timeout_s to blame MASTER_ADDR. The floor is several times what was
#: measured (room for other datasets, DuckDB, torch's own files, a user's hooks), and the slope
#: above the 1-3 files per part measured
OPEN_FILES_FLOOR = 256
OPEN_FILES_PER_PART = 4


def ensure_open_files(parts: int, command: str) -> None:
    """Raise this process's soft open-files limit to its hard one (a process may; the workers
    inherit it), or refuse (``ValueError``) a run of ``parts`` parts or ranks that the hard
    limit leaves short of files."""
    import resource
    need = OPEN_FILES_FLOOR + OPEN_FILES_PER_PART * max(1, parts)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    fix = (f"raise it (`ulimit -n {need}` in the shell that starts quietgnn; above the hard "
           f"limit, `ulimit -Hn`, only an administrator can, e.g. in "
           f"/etc/security/limits.conf)")
    if hard != inf and hard < need:
        raise ValueError(f"open-files limit {soft} (hard limit {hard}); quietgnn {command} of "
                         f"{parts} part(s) needs at least {need} open files: {fix}")
    # the kernel takes no infinite soft limit for files (it caps them at fs.nr_open), and a
    # container's hard limit (~1e9) would slow down whatever loops up to the soft one
    want = min(hard if hard != inf else need, max(need, 65536))
    if soft != inf and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            if soft < need:
                raise ValueError(f"open-files limit {soft}; quietgnn {command} of {parts} "
                                 f"part(s) needs at least {need} open files, and raising it "
                                 f"to {want} failed ({exc}): {fix}") from None


def _worker_env(rank: int, world: int, port: int, threads: int, extra: dict[str, str]) -> dict:
    env = dict(os.environ)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def launch(plan: RunPlan,
           env_extra: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]:
    """Run ``plan`` on ``plan.cfg.num_parts`` local processes; returns the summary (rank
    0's). The workers rebuild the plan from ``config.json`` and :meth:`RunPlan.worker_env`.
    The run directory's lock (taken by claim_run_dir) is dropped however this ends."""
    try:
        return _launch(plan, env_extra)
    finally:
        release_run_dir(plan.run_dir)


def _launch(plan: RunPlan, env_extra: Optional[dict[str, str]]) -> Optional[dict[str, Any]]:
    cfg, run_dir = plan.cfg, plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    atomic_write(run_dir / "config.json", cfg.to_json().encode())
    world = cfg.num_parts
    port = free_port()
    extra = dict(env_extra or {})
    extra.update(plan.worker_env())
    # the run's secret: every worker proves it to the others at the join (prove_peers), so a
    # process that is not this run's cannot take a rank's place on 127.0.0.1
    extra[SECRET_ENV] = secrets.token_hex(32)
    procs: list[subprocess.Popen] = []
    logs = []
    pipes = ErrorPipes(world)
    try:
        for r in range(world):
            out = None
            env = _worker_env(r, world, port, cfg.runtime.threads, extra)
            env["QUIETGNN_ERROR_FD"] = str(pipes.write_fds[r])
            if r != 0:
                f = open(run_dir / "logs" / f"rank-{r}.log", "w", opener=no_follow)
                logs.append(f)
                out = f
            else:
                env["QUIETGNN_TEE_LOG"] = "1"   # rank 0 talks to the terminal and to its log
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "quietgnn.runtime.worker", "--run-dir", str(run_dir)],
                env=env, stdout=out, stderr=out, preexec_fn=die_with_parent,
                pass_fds=(pipes.write_fds[r],)))
            pipes.child_started(r)
        grace = min(float(cfg.runtime.timeout_s), 10.0)
        stuck: list[int] = []
        # Strategies that tolerate failures keep running when a rank other than 0 dies.
        tolerate = bool(getattr(cfg.strategy_cls, "tolerates_failures", False))
        failed = supervise(procs, grace_s=grace, stuck=stuck, tolerate=tolerate, pipes=pipes)
    except KeyboardInterrupt:   # Ctrl-C, and SIGTERM (the CLI turns it into one)
        terminate(procs)
        raise
    finally:
        for f in logs:
            f.close()
        pipes.close()
    summary_path = run_dir / "summary.json"
    if failed and tolerate and all(r != 0 for r, _, _ in failed) and summary_path.is_file():
        sys.stderr.write(f"note: rank(s) {[r for r, _, _ in failed]} failed during the run; "
                         f"strategy {cfg.strategy!r} tolerates failures and finished on the "
                         f"survivors (see summary.json). Run directory: {run_dir}\n")
        return loads_json(summary_path.read_text())
    if failed:
        exc = LaunchError(describe_failures(run_dir, failed, stuck, grace, pipes))
        # the cause decides the exit code, not the first rank to fall: a peer that saw the
        # broken connection (a CommError) may exit before the rank whose input was bad
        texts = [error_text(run_dir, r, pipes) for r, _, _ in failed if r not in stuck]
        cause = next((t for t in texts if not is_consequence(t)), texts[0] if texts else "")
        exc.input_error = is_input_error(cause)
        raise exc
    return loads_json(summary_path.read_text()) if summary_path.is_file() else None
