"""The run plan: what a run is, resolved once from its configuration and handed on.

A :class:`RunPlan` holds the resolved config, the run directory, the identity of the dataset
it asks for (known without loading the graph), and the partition book the workers read with
its cache key. The local launcher's caller builds it with :func:`plan_run` (``quietgnn train``,
:func:`quietgnn.train`); each worker rebuilds it with :func:`plan_worker` from the same inputs
(``config.json`` and the book the launcher names in ``QUIETGNN_BOOK``); under torchrun, where
no launcher runs first, every rank builds it itself, deterministically, from its command line.
Nothing downstream recomputes the run directory, the dataset identity or the book.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

# a real import, not a TYPE_CHECKING one: the plan's field types resolve at run time
# (typing.get_type_hints(RunPlan)), and the config is loaded before any plan anyway
from ..config import RunConfig
from .books import dataset_identity_of, resolve_book
from .outputs import Made

__all__ = ["RunPlan", "plan_run", "plan_local_run", "plan_worker", "local_run_dir",
           "torchrun_run_dir", "check_model_fits_book", "BOOK_ENV"]

#: how the launcher hands the book it resolved (and checked) to its workers
BOOK_ENV = "QUIETGNN_BOOK"
#: ... and the id of that book, which each worker finds again before it reads its part
BOOK_ID_ENV = "QUIETGNN_BOOK_ID"

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved: built once, then passed to the launcher, the workers, the CLI."""

    cfg: RunConfig
    run_dir: Path
    #: :func:`quietgnn.datasets.dataset_identity` of the requested graph (not loaded)
    dataset: dict[str, Any]
    #: the partition book the workers read; None: each worker partitions in process
    book: Optional[Path] = None
    #: the launcher's book cache key (``books/<name>-<method>-p<P>-<key>``); None for a
    #: configured book or none
    partition_key: Optional[str] = None
    #: the book was checked against the loaded dataset before any worker started (the
    #: launcher did); otherwise each worker checks what is known without loading
    book_checked: bool = False
    #: the id of the book that was checked (``book.json``'s ``book_id``): a worker refuses
    #: another found at ``book`` (a ``prepare --overwrite`` between the check and its start)
    book_id: Optional[str] = None

    def worker_env(self) -> dict[str, str]:
        """The environment that lets a launched worker's :func:`plan_worker` find the book."""
        env = {BOOK_ENV: str(self.book)} if self.book is not None else {}
        if self.book is not None and self.book_id is not None:
            env[BOOK_ID_ENV] = self.book_id
        return env


def plan_run(cfg: RunConfig, run_dir: Path, log: Log = print) -> RunPlan:
    """The plan of a local run into ``run_dir`` (already claimed): the configured book checked
    against the dataset, or the cached one made or reused (raises ``ValueError`` before any
    worker starts when the book and the dataset disagree)."""
    from .devices import place
    # every local rank on this host: refused here (exit 2) when the host cannot run it; the
    # backend chosen is what config.json records
    placement = place(cfg.runtime.device, cfg.runtime.backend, 0, cfg.num_parts)
    if placement.device.type != "cpu":
        log(f"placement: {placement}")
    cfg.runtime.backend = placement.backend
    identity = dataset_identity_of(cfg)
    book, key = resolve_book(cfg, log, identity)
    from ..graph import check_trainable_split
    from ..partition import PartitionBook
    opened = PartitionBook.open(book)       # its manifest, once, for the checks below
    check_model_fits_book(cfg, opened, on_gpu=placement.device.type == "cuda")
    check_trainable_split(*opened.split_counts(), str(opened.graph.get("name")))
    if cfg.runtime.resume:      # features edited since the checkpoint: refused before launch
        from .checkpoint import check_resume_features
        check_resume_features(Path(run_dir) / "checkpoints",
                              [opened.features_identity(r) for r in range(opened.num_parts)])
    return RunPlan(cfg=cfg, run_dir=Path(run_dir), dataset=identity, book=book,
                   partition_key=key, book_checked=True, book_id=opened.book_id)


def check_model_fits_book(cfg: RunConfig, book: Any, on_gpu: bool = False) -> None:
    """Refuse (``ValueError``) a model that every rank of this host cannot train in the memory
    available, before a worker starts or anything is written into the run directory: refused
    in the workers instead, the run left its ``config.json`` behind, and a rerun under the same
    ``--run-name`` found a run there. The book (an opened
    :class:`~quietgnn.partition.PartitionBook`) knows the graph's widths without loading it (a
    book too old to say is left to the workers' own check). ``on_gpu``: the ranks train on
    GPUs, where the weights, their gradients and Adam's moments live; a rank's host memory
    holds one copy, while it builds the model (the workers' own rule,
    ``WorkerContext.build_model``)."""
    from ..nn.model import TRAINING_COPIES, check_model_fits
    g, m = book.graph, cfg.model
    if isinstance(g.get("num_features"), int) and isinstance(g.get("num_classes"), int):
        check_model_fits(m.arch, g["num_features"], m.hidden, g["num_classes"], m.layers,
                         copies=1 if on_gpu else TRAINING_COPIES, ranks=cfg.num_parts)


def plan_local_run(cfg: RunConfig, log: Log, *, made: Made = (), label: Optional[str] = None,
                   stage: Optional[Callable[[Path], Optional[Path]]] = None) -> RunPlan:
    """A local run up to its launch: the run directory resolved (:func:`local_run_dir`) and
    claimed, then ``stage(run_dir)`` (the API saves an in-memory graph there, names it in
    ``cfg`` and returns the file), then :func:`plan_run`. A run refused here leaves nothing
    behind: not the staged file, not an empty run directory, not an out directory it made
    (``made``: the directories the run's output checks made, :func:`outputs.check_outputs`)."""
    from .launcher import check_workers_fit
    from .outputs import remove_made
    from .rundir import claim_run_dir, holds_run_dir, remove_if_empty
    run_dir: Optional[Path] = None
    staged: Optional[Path] = None
    try:
        check_workers_fit(cfg.num_parts)      # before anything is written or partitioned
        run_dir = local_run_dir(cfg, log, label)
        claim_run_dir(cfg, run_dir)
        if stage is not None:
            staged = stage(run_dir)
        return plan_run(cfg, run_dir, log)
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        if run_dir is not None and holds_run_dir(run_dir):
            # the unnamed run's directory _claim_dir just made; never another run's, which
            # may be empty still while that run builds its book
            remove_if_empty(run_dir)
        remove_made(made)
        raise


def plan_worker(cfg: RunConfig, run_dir: Path) -> RunPlan:
    """The plan as a worker sees it: the book the launcher handed over (checked there), else
    the configured one (torchrun: checked by each rank without loading), else none."""
    handed = os.environ.get(BOOK_ENV)
    book = handed or cfg.partition.book
    return RunPlan(cfg=cfg, run_dir=Path(run_dir), dataset=dataset_identity_of(cfg),
                   book=Path(book) if book else None, book_checked=bool(handed),
                   book_id=os.environ.get(BOOK_ID_ENV) if handed else None)


# ---------------------------------------------------------------------- run directory
def torchrun_run_dir(cfg: RunConfig) -> Path:
    """A torchrun job's run directory: the named one, else ``<job id>-<strategy>-<dataset>``
    (the same on every rank and every restart of the job)."""
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
    return Path(cfg.runtime.out_dir) / (cfg.runtime.run_name or
                                        f"{rid}-{cfg.strategy}-{Path(cfg.dataset.name).name}")


def local_run_dir(cfg: RunConfig, log: Log, label: Optional[str] = None) -> Path:
    """The run directory of a local run (``quietgnn train`` and :func:`quietgnn.train`): the
    named one, the one ``--resume`` continues, or a fresh ``<time>-<strategy>-<label>-p<P>``
    (``label``: the dataset's name unless given)."""
    name = cfg.runtime.run_name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = f"-{cfg.strategy}-{label or Path(cfg.dataset.name).name}-p{cfg.num_parts}"
    run_dir = Path(cfg.runtime.out_dir) / (name or f"{stamp}{suffix}")
    if cfg.runtime.resume:
        return _resume_dir(cfg, run_dir, suffix, named=bool(name), log=log)
    return run_dir if name else _claim_dir(run_dir)


def _claim_dir(run_dir: Path) -> Path:
    """A fresh, unnamed run's directory, created atomically: two runs of the same strategy,
    dataset and P started in the same second (a script launching several) would otherwise
    share ``<time>-<strategy>-<dataset>-p<P>`` and overwrite each other's metrics."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cand, n = run_dir, 1
    while True:
        try:
            cand.mkdir()
            return cand
        except FileExistsError:
            n += 1
            cand = run_dir.with_name(f"{run_dir.name}-{n}")


def _resume_dir(cfg: RunConfig, run_dir: Path, suffix: str, named: bool, log: Log) -> Path:
    """``--resume``: the named run, or else the newest ``*<suffix>`` run in ``out_dir`` holding
    a committed checkpoint; refuses (ValueError, before any worker starts) when that
    checkpoint belongs to another configuration."""
    from .checkpoint import check_resume_compatible, committed_checkpoints
    if not named:
        out = Path(cfg.runtime.out_dir)
        cands = [d for d in out.glob(f"*{suffix}") if committed_checkpoints(d / "checkpoints")] \
            if out.is_dir() else []
        if cands:
            run_dir = max(cands, key=lambda d: (d / "checkpoints").stat().st_mtime)
            log(f"--resume: continuing {run_dir}")
        else:
            log(f"--resume: no checkpointed run matching '*{suffix}' in {str(out)!r}; starting "
                f"a new run (name it with --run-name to resume a specific one)")
    epoch = check_resume_compatible(cfg, run_dir / "checkpoints")
    if epoch is not None and epoch + 1 > cfg.train.epochs and \
            not cfg.strategy_cls.own_schedule:     # (a call is a pass: surely nothing left)
        # refused here, not by the workers: nothing of the attempt is written (config.json,
        # attempts.jsonl); the workers judge the rest (Trainer: identity.check_resume_epochs)
        raise ValueError(f"--resume: the newest checkpoint is of epoch {epoch}, and this run "
                         f"asks for --epochs {cfg.train.epochs}: it would train nothing; pass "
                         f"--epochs above {epoch + 1} to train further, or use what the run "
                         f"has (its checkpoints, or a fresh run)")
    if named and epoch is None and not (run_dir / "summary.json").is_file():
        # (a finished run without one is refused next, by claim_run_dir)
        log(f"--resume: no checkpoint in {run_dir / 'checkpoints'}; starting at epoch 0")
    return run_dir
