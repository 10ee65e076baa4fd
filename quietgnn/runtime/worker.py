"""One rank of a run: join the group, load this rank's partition, train, report.

Entered two ways with the same code:

* from the local launcher: ``python -m quietgnn.runtime.worker --run-dir DIR`` with RANK,
  WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by :mod:`quietgnn.runtime.launcher`;
* under ``torchrun``, which sets the same variables: ``quietgnn train`` notices them and
  calls :func:`run_worker` directly.

Any exception is written with its traceback to ``<run>/logs/rank-<k>.error`` (the launcher
shows it) and the process exits non-zero at once, without waiting on peers: they notice the
broken connection (or time out) and fail in turn, so no rank hangs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from ..errors import is_consequence, is_explained
from ..safefiles import atomic_write, no_follow
from ..serial import loads_json

if TYPE_CHECKING:
    from ..partition import LocalPartition
    from .plan import RunPlan

__all__ = ["run_worker", "worker_env", "load_local_partition"]


def _env_int(name: str, lo: int, hi: Optional[int], default: Optional[int] = None) -> int:
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    span = f"{lo} .. {hi}" if hi is not None else f">= {lo}"
    if raw is None:
        raise ValueError(f"{name} is not set in the environment; expected an integer {span} "
                         f"(the local launcher and torchrun set it: start ranks with "
                         f"`quietgnn train` or `torchrun ... -m quietgnn train`)")
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} = {raw!r} in the environment; expected an integer {span} "
                         f"(set by the local launcher and torchrun; unset it or fix it)")
    return v


def worker_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the environment (launcher or torchrun), each
    checked, and with more than one rank the rendezvous address (``MASTER_ADDR``, a
    ``MASTER_PORT`` in 1 .. 65535): a bad value is named here, not in a store's timeout."""
    world = _env_int("WORLD_SIZE", 1, None)
    rank = _env_int("RANK", 0, world - 1)
    local = _env_int("LOCAL_RANK", 0, world - 1, default=rank)
    if world > 1:
        if not os.environ.get("MASTER_ADDR"):
            raise ValueError("MASTER_ADDR is not set in the environment; expected the address "
                             "of rank 0's host (torchrun sets it from --master-addr or "
                             "--rdzv-endpoint)")
        _env_int("MASTER_PORT", 1, 65535)
        from ..comm.rendezvous import _resolve
        _resolve(os.environ["MASTER_ADDR"])    # a host name that does not resolve, named
    return rank, world, local


def load_local_partition(plan: RunPlan, rank: int, world: int) -> LocalPartition:
    """This rank's partition: from the plan's book when there is one, otherwise by loading the
    dataset and partitioning deterministically in-process (every rank gets the same
    assignment from the same seed) and keeping only this rank's part."""
    from ..partition import PartitionBook, build_partitions, partition_nodes
    from ..partition.book import book_id_of
    cfg = plan.cfg
    if plan.book is not None:
        opened = PartitionBook.open(plan.book)
        if plan.book_id is not None and opened.book_id != plan.book_id:
            raise ValueError(f"the partition book {str(plan.book)!r} was replaced after the "
                             f"launcher checked it (book {plan.book_id}, now "
                             f"{opened.book_id}): a prepare --overwrite ran meanwhile; start "
                             f"the run again once it has finished")
        if not plan.book_checked:
            # torchrun (no launcher, whose plan_run checked the book against the loaded
            # dataset before handing it over): check what is known without loading the graph
            from .books import check_book_dataset, check_book_partition
            check_book_partition(opened, cfg)
            if not cfg.dataset.prepared:
                check_book_dataset(opened, cfg, load=False, identity=plan.dataset)
        # a strategy that converts the rows it reads gets the part as stored (mapped, narrow)
        return opened.load_part(rank, world,
                                stored=cfg.strategy_cls.reads_stored_part(cfg.options))
    from .netcluster import EMULATED_ENV
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    # (emulated hosts are one machine: the whole graph is on its disk whatever a rank loads)
    if cfg.runtime.residency != "none" and local < world and not os.environ.get(EMULATED_ENV):
        raise ValueError(f"runtime.residency = {cfg.runtime.residency} on several hosts needs "
                         f"each site's own part: without --data every rank loads the whole "
                         f"graph ({cfg.dataset.name}) and partitions it, so every host would "
                         f"hold every site's features and labels; prepare the graph with "
                         f"--partitioner given where that is allowed and give each host its "
                         f"book.json and part-<rank>/ (--data DIR)")
    from ..datasets import load_dataset
    graph = load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                         split_seed=cfg.dataset.split_seed, split=cfg.dataset.split)
    parts = partition_nodes(graph, cfg.partition_method, world, seed=cfg.partition.seed,
                            clusters=cfg.partition.clusters, file=cfg.partition.file)
    # The identity PartitionBook.write gives the same graph + assignment, so a checkpoint
    # taken under the launcher (book on disk) resumes under torchrun and vice versa.
    book_id = book_id_of(graph.fingerprint(), [parts])
    return build_partitions(graph, parts, ranks=[rank], book_id=book_id)[0]


#: below this many training nodes a site's shared gradients are a near copy of their data
FEW_TRAINING_NODES = 10


def note_few_training_nodes(part: LocalPartition, level: str, rank: int) -> None:
    """Under a residency level, say in this rank's own log (it is this site's data that its
    gradients give away) when it holds fewer than :data:`FEW_TRAINING_NODES` training nodes."""
    few = int(part.train_mask.sum())
    if level != "none" and few < FEW_TRAINING_NODES:
        print(f"note: rank {rank} holds {few} training node(s): under runtime.residency "
              f"{level} their raw rows stay here, but the gradients this rank shares reveal "
              f"their labels and features (docs: Data residency, what a level does not "
              f"cover)", file=sys.stderr, flush=True)


def use_deterministic(device: torch.device) -> None:
    """``runtime.deterministic``: torch's deterministic algorithms. On a GPU cuBLAS is
    repeatable only with a fixed workspace, set before its first call (CUDA's own rule; without
    it torch raises at the first matmul): the smaller of the two settings torch names, unless
    the user chose one."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def run_worker(plan: RunPlan, write_config: bool = False) -> Optional[dict[str, Any]]:
    """Train this rank's share of ``plan``; returns the run summary on rank 0 (None
    elsewhere). ``write_config``: rank 0 writes ``config.json`` (under torchrun; the local
    launcher writes it itself) once every rank has joined, i.e. after every rank checked the
    directory."""
    from ..comm import Communicator
    from .trainer import train_on

    cfg, run_dir = plan.cfg, plan.run_dir
    rank, world, local_rank = worker_env()
    if world != cfg.num_parts:
        raise ValueError(f"world size {world} does not match the configuration, which asks for "
                         f"{cfg.num_parts} partition(s) (strategy {cfg.strategy!r}); start "
                         f"{cfg.num_parts} processes or set --parts {world}")
    torch.set_num_threads(cfg.runtime.threads)
    from .devices import place
    placement = place(cfg.runtime.device, cfg.runtime.backend, local_rank,
                      int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    device = placement.device
    if cfg.runtime.deterministic:
        use_deterministic(device)
    if write_config:   # under torchrun: what config.json records, as the launcher's does
        cfg.runtime.backend = placement.backend
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if rank == 0 and write_config:   # under torchrun (the launcher said it already)
            print(f"placement: {placement}", file=sys.stderr, flush=True)
    if rank == 0:
        from .rundir import record_attempt
        record_attempt(run_dir)
    comm = Communicator.init(rank, world, backend=placement.backend,
                             timeout_s=cfg.runtime.timeout_s, device=device)
    if write_config and rank == 0 and world > 1 and not comm.authenticated:
        from ..comm.rendezvous import SECRET_ENV
        print(f"note: the ranks did not authenticate each other ({SECRET_ENV} is not set): "
              f"any process reaching MASTER_ADDR:MASTER_PORT could have joined as a rank; set "
              f"the same {SECRET_ENV} on every host (openssl rand -hex 32)",
              file=sys.stderr, flush=True)
    if write_config:   # under torchrun, each rank with its own command line: first of all
        from .identity import check_ranks_agree     # (split_duplex is collective already)
        check_ranks_agree(comm, cfg)
    comm.split_duplex(cfg.runtime.duplex)
    comm.residency = cfg.runtime.residency   # before any traffic: every op is checked
    if write_config:   # under torchrun, where each host may have been given its own --out
        from .rundir import check_shared
        check_shared(comm, run_dir)
    if write_config and rank == 0:      # never through a link planted in the run directory
        atomic_write(run_dir / "config.json", cfg.to_json().encode())
    part = load_local_partition(plan, rank, world)
    note_few_training_nodes(part, cfg.runtime.residency, rank)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    summary = train_on(comm, part, cfg, run_dir, log=log, device=device).summary
    comm.close()
    return summary


def _report_failure(run_dir: Path, rank: int) -> str:
    """Write this rank's traceback to ``logs/rank-<k>.error`` and to the launcher's error pipe
    (``QUIETGNN_ERROR_FD``): when the disk is full the file cannot be written, and the
    launcher must still learn the reason rather than guess "killed"."""
    tb = traceback.format_exc()
    err = run_dir / "logs" / f"rank-{rank}.error"
    exc = sys.exc_info()[1]
    where = f"traceback: {err}"
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        with open(err, "w", opener=no_follow) as f:   # not through a link planted there
            f.write(tb)
    except OSError as werr:
        where = f"{err} could not be written: {werr.strerror or werr}"
        try:
            err.unlink(missing_ok=True)   # never leave a torn half of it
        except OSError:
            pass
    fd = os.environ.get("QUIETGNN_ERROR_FD")
    if fd:
        try:
            # The tail fits a pipe's buffer, so this never blocks on a launcher not reading.
            os.write(int(fd), tb.encode("utf-8", "replace")[-16000:])
        except (OSError, ValueError):
            pass
    # one line on stderr when the message says everything; the traceback is in the .error file
    if fd and exc is not None and is_consequence(exc):
        pass    # a peer's failure: the local launcher names the cause and these ranks together
    elif exc is not None and is_explained(exc):
        sys.stderr.write(f"[rank {rank}] {type(exc).__name__}: {exc} ({where})\n")
    else:
        sys.stderr.write(f"[rank {rank}] {tb}" + ("" if where.startswith("traceback") else
                                                  f"[rank {rank}] {where}\n"))
    sys.stderr.flush()
    return tb


def watch_parent(rank: int, poll_s: float = 0.5) -> None:
    """Stop this rank when the process that started it dies (torchrun's agent SIGKILLed, its
    node lost): the rank would otherwise train to the end as an orphan, holding memory and a
    port, with nobody to read its result. The local launcher uses PR_SET_PDEATHSIG instead;
    under torchrun the agent starts the workers, so each one watches its parent."""
    import threading
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                sys.stderr.write(f"[rank {rank}] the process that started this worker (pid "
                                 f"{parent}, the torchrun agent) is gone; stopping\n")
                sys.stderr.flush()
                os._exit(1)

    threading.Thread(target=run, name="quietgnn-parent-watch", daemon=True).start()


def main(argv: Optional[list[str]] = None) -> None:
    from ..config import config_from_dict
    from .plan import plan_worker

    ap = argparse.ArgumentParser(description="quietgnn worker (started by `quietgnn train`)")
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get("QUIETGNN_TEE_LOG"):
        from .rundir import tee_stderr
        tee_stderr(run_dir, rank)
    try:
        cfg = config_from_dict(loads_json((run_dir / "config.json").read_text()))
        run_worker(plan_worker(cfg, run_dir))
    except BaseException as exc:  # noqa: BLE001 - every failure must end this rank loudly
        if isinstance(exc, KeyboardInterrupt):
            os._exit(130)
        _report_failure(run_dir, rank)
        # os._exit: do not run atexit handlers that could block on a broken process group.
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
