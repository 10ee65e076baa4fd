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

import ctypes
import hashlib
import io
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from .supervise import (ErrorPipes, describe_failures, error_text, is_consequence,
                        is_input_error, supervise, terminate)

__all__ = ["LaunchError", "launch", "spawn_function", "free_port", "cache_dir", "prepare_book",
           "check_book_dataset"]


class LaunchError(RuntimeError):
    """A worker failed; the message names the rank and carries its traceback."""

    #: the run failed on bad input (a worker raised ValueError: a damaged file, a config the
    #: data contradicts); the CLI exits with 2 as for input errors found before the launch
    input_error: bool = False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cache_dir() -> Path:
    return Path(os.environ.get("QUIETGNN_CACHE", Path.home() / ".cache" / "quietgnn"))


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _worker_env(rank: int, world: int, port: int, threads: int, extra: dict[str, str]) -> dict:
    env = dict(os.environ)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


# ---------------------------------------------------------------------- partition book cache
def prepare_book(cfg: Any, log: Callable[[str], None] = print) -> Path:
    """The partition book for ``cfg``: the configured one, or a cached one keyed by everything
    that determines the assignment (created on first use)."""
    from ..partition import PartitionBook
    if cfg.partition.book:
        book = PartitionBook.open(cfg.partition.book)
        if book.num_parts != cfg.num_parts:
            raise ValueError(f"partition book {cfg.partition.book!r} has {book.num_parts} parts "
                             f"but the run asks for {cfg.num_parts}; pass --parts "
                             f"{book.num_parts} or re-partition")
        _check_book_files(book)
        if not cfg.dataset.prepared:   # prepared: the book *is* the dataset
            check_book_dataset(book, cfg, load=True)
        return Path(cfg.partition.book)
    from ..datasets import dataset_files
    key_src = {"dataset": asdict(cfg.dataset), "method": cfg.partition_method,
               "parts": cfg.num_parts, "seed": cfg.partition.seed,
               "clusters": cfg.partition.clusters, "file": cfg.partition.file,
               "root": str(Path(cfg.dataset.root).resolve()) if cfg.dataset.root else None}
    if cfg.dataset.name == "synthetic":
        key_src["synthetic"] = asdict(cfg.synthetic)
    # The content of every file the graph and the assignment are read from: a file replaced
    # in place (same path, even the same size and mtime) gets a new book, not the old one.
    key_src["content"] = [[str(f), _content_sha256(f)]
                          for f in dataset_files(cfg.dataset.name, cfg.dataset.root)]
    if cfg.partition.file:
        f = Path(cfg.partition.file)
        key_src["file_sha256"] = _content_sha256(f) if f.is_file() else None
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = cache_dir() / "books" / f"{Path(cfg.dataset.name).name}-{cfg.partition_method}-" \
                                   f"p{cfg.num_parts}-{key}"
    if (path / "book.json").is_file():
        try:
            PartitionBook.open(path)
            return path
        except ValueError:
            pass  # damaged cache entry: rebuild below
    t0 = time.perf_counter()
    name, nodes, edges = _build_book(cfg, path)
    # The graph is gone (it lived in _build_book); hand its pages back to the OS so that the
    # launcher, which idles while the workers train, does not sit on the heap that loading
    # and partitioning left behind (hundreds of MiB at 10^7 edges).
    release_free_memory()
    log(f"partitioned {name} ({nodes} nodes, {edges} edges) with {cfg.partition_method} into "
        f"{cfg.num_parts} in {time.perf_counter() - t0:.1f}s -> {path} (peak memory "
        f"{_peak_rss_mb():.0f} MiB, {_rss_mb():.0f} MiB after)")
    return path


def _content_sha256(path: Path) -> str:
    """sha256 of ``path``'s bytes (streamed), remembered in ``<cache>/file-hashes.json`` per
    (resolved path, size, mtime_ns, ctime_ns, inode): a run whose cached book is reused then
    costs one ``stat`` per dataset file instead of re-reading gigabytes. ctime is part of the
    key because mtime is not evidence: a file rewritten in place and given its old mtime back
    (``touch -r``, ``os.utime``, ``cp -p``, ``rsync -t``) keeps size, mtime and inode, but every
    write or utime sets ctime to now, and ctime cannot be set back from user space."""
    from ..partition.book import _sha256
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    table_path = cache_dir() / "file-hashes.json"
    try:
        table = json.loads(table_path.read_text())
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    entry = table.get(str(path))
    if isinstance(entry, dict) and entry.get("stat") == stamp and \
            isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = _sha256(path)
    table[str(path)] = {"stat": stamp, "sha256": digest}
    try:   # best effort, atomic (a concurrent run's entry may be lost: it is re-hashed later)
        table_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = table_path.with_name(f".{table_path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, table_path)
    except OSError:
        pass
    return digest


def check_book_dataset(book: Any, cfg: Any, load: bool) -> None:
    """Refuse a partition book made from another graph than the one ``cfg`` asks for (a Cora
    book run as ``--dataset citeseer`` would train on Cora and label the run CiteSeer).

    First what is known without loading (:func:`quietgnn.datasets.dataset_identity`: the
    name; for synthetic also its sizes, spec and split seed); then, with ``load``, the loaded
    graph's sizes and fingerprint (catches an edited file or another split). The launcher
    checks with ``load=True`` before any worker starts; under torchrun each rank checks
    without loading (the point of a book there is not to load the graph)."""
    from ..datasets import dataset_identity
    have = book.graph if isinstance(book.graph, dict) else {}
    want = dataset_identity(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                            split_seed=cfg.dataset.split_seed)
    diffs = _identity_diffs(have, want)
    if not diffs and load:
        from ..datasets import load_dataset
        graph = load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                             split_seed=cfg.dataset.split_seed)
        want = {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "num_features": graph.num_features, "num_classes": graph.num_classes}
        diffs = _identity_diffs(have, want)
        if not diffs and "fingerprint" in have:
            fp = graph.fingerprint()
            if fp != have["fingerprint"]:
                diffs = [f"fingerprint: book {have['fingerprint']}, dataset {fp} (same name and "
                         f"sizes, other edges, labels or split: an edited file or another "
                         f"split_seed)"]
        del graph
        release_free_memory()
    if diffs:
        desc = f"{have.get('name')!r}"
        if "num_nodes" in have and "num_edges" in have:
            desc += f" ({have['num_nodes']} nodes, {have['num_edges']} edges)"
        raise ValueError(
            f"partition book {str(book.path)!r} was made from graph {desc}, but this run asks "
            f"for dataset {cfg.dataset.name!r}: {'; '.join(diffs)}. Pass the dataset the book "
            f"was made from ({have.get('name')!r}, with the options it was partitioned with), "
            f"or partition "
            f"{cfg.dataset.name!r} for this run (`quietgnn prepare ... --out DIR`, or leave "
            f"out --book and the launcher partitions it)")


def _identity_diffs(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """'key: book X, dataset Y' for every key known on both sides that differs."""
    diffs = []
    for k, w in want.items():
        if k not in have:
            continue
        h = have[k]
        if isinstance(h, dict) and isinstance(w, dict):
            sub = [f"{k}.{kk}: book {h[kk]!r}, dataset {w[kk]!r}" for kk in sorted(set(h) & set(w))
                   if h[kk] != w[kk]]
            diffs += sub
        elif h != w:
            diffs.append(f"{k}: book {h!r}, dataset {w!r}")
    return diffs


def _build_book(cfg: Any, path: Path) -> tuple[str, int, int]:
    from ..datasets import load_dataset
    from ..partition import make_book
    graph = load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                         split_seed=cfg.dataset.split_seed)
    make_book(path, graph, cfg.partition_method, cfg.num_parts, seed=cfg.partition.seed,
              clusters=cfg.partition.clusters, file=cfg.partition.file)
    return graph.name, graph.num_nodes, graph.num_edges


def release_free_memory() -> None:
    """Collect garbage and return freed heap pages to the OS (glibc ``malloc_trim``; a no-op
    elsewhere). Large tensors are freed to the OS at once, but the many mid-sized ones of a
    graph pipeline leave a fragmented heap that otherwise stays resident."""
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_mb() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") \
            / 2 ** 20
    except (OSError, ValueError, IndexError):
        return float("nan")


def _check_book_files(book: Any) -> None:
    """Missing or truncated part files are found here, before any worker starts (a cheap size
    check; each worker verifies its own file's checksum when it loads it)."""
    for name, info in sorted(book.files.items()):
        f = Path(book.path) / name
        if not f.is_file():
            raise ValueError(f"partition file {str(f)!r} is missing (listed in book.json); copy "
                             f"it from where the book was created or re-run `quietgnn prepare`")
        size = f.stat().st_size
        if size != info.get("bytes"):
            raise ValueError(f"partition file {str(f)!r} has {size} bytes, book.json records "
                             f"{info.get('bytes')}: it is truncated or was replaced; re-copy it "
                             f"or re-run `quietgnn prepare`")


def launch(cfg: Any, run_dir: Path, book: Optional[Path],
           env_extra: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]:
    """Run ``cfg`` on ``cfg.num_parts`` local processes; returns the summary (rank 0's)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json())
    world = cfg.num_parts
    port = free_port()
    extra = dict(env_extra or {})
    if book is not None:
        extra["QUIETGNN_BOOK"] = str(book)
    procs: list[subprocess.Popen] = []
    logs = []
    pipes = ErrorPipes(world)
    try:
        for r in range(world):
            out = None
            env = _worker_env(r, world, port, cfg.runtime.threads, extra)
            env["QUIETGNN_ERROR_FD"] = str(pipes.write_fds[r])
            if r != 0:
                f = open(run_dir / "logs" / f"rank-{r}.log", "w")
                logs.append(f)
                out = f
            else:
                env["QUIETGNN_TEE_LOG"] = "1"   # rank 0 talks to the terminal and to its log
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "quietgnn.runtime.worker", "--run-dir", str(run_dir)],
                env=env, stdout=out, stderr=out, preexec_fn=_die_with_parent,
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
        return json.loads(summary_path.read_text())
    if failed:
        exc = LaunchError(describe_failures(run_dir, failed, stuck, grace, pipes))
        # the cause decides the exit code, not the first rank to fall: a peer that saw the
        # broken connection (a CommError) may exit before the rank whose input was bad
        texts = [error_text(run_dir, r, pipes) for r, _, _ in failed if r not in stuck]
        cause = next((t for t in texts if not is_consequence(t)), texts[0] if texts else "")
        exc.input_error = is_input_error(cause)
        raise exc
    return json.loads(summary_path.read_text()) if summary_path.is_file() else None


# ---------------------------------------------------------------------- functions (tests)
def _fn_entry(fn: Callable, rank: int, world: int, port: int, timeout_s: float,
              args: tuple, queue: Any) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    import torch
    torch.set_num_threads(1)
    from ..comm import Communicator
    try:
        comm = Communicator.init(rank, world, timeout_s=timeout_s)
        result = fn(comm, *args)
        # Plain bytes through the queue: torch's shared-memory tensor pickling would need this
        # process alive until the parent has read the result.
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, True, buf.getvalue()))
        comm.close()
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))


def spawn_function(fn: Callable, world_size: int, args: tuple = (), timeout_s: float = 300.0,
                   comm_timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` fresh processes joined in a gloo group on
    127.0.0.1 and return the results by rank. Raises ``LaunchError`` with the traceback if any
    rank fails or the whole call exceeds ``timeout_s`` (for tests and benchmarks)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_fn_entry, args=(fn, r, world_size, port, comm_timeout_s, args,
                                                 queue), daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
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
                                      f"{[procs[r].exitcode for r in dead]})")
                continue
            if not ok:
                raise LaunchError(f"rank {rank} failed:\n{value}")
            import torch
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]
