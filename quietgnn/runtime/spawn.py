"""Run a function on P local processes joined in a gloo group (tests and benchmarks).

A process that imports torch costs seconds of CPU before it does anything; a suite that starts
four of them for each of a few hundred checks spends most of its time starting processes. So
:func:`spawn_function` can keep its processes (``reuse``, on where ``QUIETGNN_REUSE_WORKERS``
is set, as the tests do): each call is then handed to the same workers, made to look like a
fresh start — the caller's environment, torch's initial seed, one thread, deterministic
algorithms off, and every ``quietgnn`` module's globals as they were before the call (a
function that sets ``lean._SLICE`` leaves no trace). Anything that goes wrong — a rank that
raises, dies or runs past the timeout — retires every kept worker, so no call inherits a
half-closed process group. Mutations inside objects (not rebinding) are not undone; a test
that needs a virgin process asks for ``reuse=False``.
"""

from __future__ import annotations

import importlib
import io
import multiprocessing as mp
import os
import pkgutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["spawn_function", "retire_workers"]

_ENV = "QUIETGNN_REUSE_WORKERS"


def _fn_entry(fn: Callable, rank: int, world: int, port: int, timeout_s: float,
              args: tuple, queue: Any, device: str = "cpu") -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    import torch
    torch.set_num_threads(1)
    from ..comm import Communicator
    from .devices import place
    try:
        where = place(device, "auto", rank, world)   # as the launcher places a local run
        if where.device.type == "cuda":
            torch.cuda.set_device(where.device)
        comm = Communicator.init(rank, world, timeout_s=timeout_s, backend=where.backend,
                                 device=where.device)
        result = fn(comm, *args)
        # Plain bytes through the queue: torch's shared-memory tensor pickling would need this
        # process alive until the parent has read the result.
        buf = io.BytesIO()
        torch.save(result, buf)
        comm.close()
        queue.put((rank, True, buf.getvalue()))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))


# ---------------------------------------------------------------- kept workers
def _package_modules() -> list[str]:
    """Import every quietgnn module up front, so that the globals a call rebinds are known
    before the call (a module first imported inside a call has no earlier state to restore)."""
    names = []
    # by path and name, not an import of the package: this layer may not import the ones
    # above it, and a worker that imports them all is not a dependency on any
    root = Path(__file__).resolve().parents[1]
    for info in pkgutil.walk_packages([str(root)], "quietgnn."):
        if info.name.endswith("__main__"):   # importing it runs the command line
            continue
        try:
            importlib.import_module(info.name)
            names.append(info.name)
        except Exception:  # noqa: BLE001 - an optional module that cannot load is never used
            pass
    return names


def _snapshot() -> dict[str, dict[str, Any]]:
    return {name: dict(vars(mod)) for name, mod in list(sys.modules.items())
            if name.startswith("quietgnn") or name.startswith("test_") or name == "helpers"}


def _restore(snap: dict[str, dict[str, Any]]) -> None:
    for name, before in snap.items():
        mod = sys.modules.get(name)
        if mod is None:
            continue
        now = vars(mod)
        for key in [k for k in now if k not in before]:
            del now[key]
        for key, value in before.items():
            if now.get(key, _MISSING) is not value:
                now[key] = value


_MISSING = object()


def _serve(conn: Any, queue: Any) -> None:
    """A kept worker: run each task it is handed as a fresh process would, until told to stop."""
    import torch
    seed = torch.initial_seed()
    _package_modules()
    while True:
        try:
            task = conn.recv()   # unpickling imports the caller's module: part of the snapshot
        except EOFError:
            return
        if task is None:
            return
        fn, rank, world, port, timeout_s, args, env, device = task
        snap = _snapshot()
        os.environ.clear()
        os.environ.update(env)
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(False)
        try:
            _fn_entry(fn, rank, world, port, timeout_s, args, queue, device)
        finally:
            _restore(snap)


class _Pool:
    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.queue = self.ctx.Queue()
        self.workers: list[tuple[Any, Any]] = []   # (process, connection)

    def ensure(self, n: int) -> None:
        self.workers = [(p, c) for p, c in self.workers if p.is_alive()]
        while len(self.workers) < n:
            parent, child = self.ctx.Pipe()
            p = self.ctx.Process(target=_serve, args=(child, self.queue), daemon=True)
            p.start()
            child.close()
            self.workers.append((p, parent))

    def close(self) -> None:
        for p, conn in self.workers:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p, conn in self.workers:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
            conn.close()
        self.workers = []


_pool: Optional[_Pool] = None


def retire_workers() -> None:
    """Stop the kept workers (the next reusing call starts new ones)."""
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


def spawn_function(fn: Callable, world_size: int, args: tuple = (), timeout_s: float = 300.0,
                   comm_timeout_s: float = 60.0, reuse: Optional[bool] = None,
                   device: str = "cpu") -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` processes joined in a process group on
    127.0.0.1 and return the results by rank. Raises ``LaunchError`` with the traceback if any
    rank fails or the whole call exceeds ``timeout_s``. ``reuse`` (default:
    ``QUIETGNN_REUSE_WORKERS`` is set) hands the call to kept workers instead of fresh processes
    (module docstring). ``device``: ``cpu`` (gloo) or ``cuda`` (placed as ``quietgnn train``
    places its ranks: :mod:`.devices`); ``comm.device`` is the rank's device."""
    global _pool
    from .launcher import free_port
    if reuse is None:
        reuse = os.environ.get(_ENV, "") not in ("", "0")
    port = free_port()
    if reuse:
        if _pool is None:
            _pool = _Pool()
        _pool.ensure(world_size)
        procs = [p for p, _ in _pool.workers[:world_size]]
        queue = _pool.queue
        env = {k: v for k, v in os.environ.items() if k != _ENV}
        for r, (_, conn) in enumerate(_pool.workers[:world_size]):
            conn.send((fn, r, world_size, port, comm_timeout_s, args, env, device))
    else:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_fn_entry, args=(fn, r, world_size, port, comm_timeout_s,
                                                     args, queue, device), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
    ok = False
    try:
        results = _collect(procs, queue, world_size, timeout_s)
        ok = True
    finally:
        if not reuse:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
        elif not ok:
            retire_workers()   # a rank may sit in a collective or hold a process group
    return results


def _collect(procs: list[Any], queue: Any, world_size: int, timeout_s: float) -> list[Any]:
    from .launcher import LaunchError
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchError(f"spawn_function timed out after {timeout_s}s; finished ranks: "
                              f"{sorted(results)}")
        try:
            rank, ok, value = queue.get(timeout=min(remaining, 1.0))
        except Exception:  # queue.Empty
            dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results]
            if dead and all(p.exitcode not in (0, None) for p in (procs[r] for r in dead)):
                raise LaunchError(f"rank(s) {dead} died without reporting (exit codes "
                                  f"{[procs[r].exitcode for r in dead]})") from None
            continue
        if not ok:
            raise LaunchError(f"rank {rank} failed:\n{value}")
        import torch
        # Not weights_only: a test's function returns whatever it likes (records, numpy,
        # dataclasses). The bytes come through a pipe from a child this process started, running
        # this package's code: no file and no peer on the network is read here.
        results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    return [results[r] for r in range(world_size)]
