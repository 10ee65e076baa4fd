"""The training loop every strategy runs in (one instance per rank).

Reads top to bottom: setup -> (resume) -> epochs of train / evaluate / record / checkpoint ->
summary. It never looks at the strategy's name: everything strategy-specific happens behind
``Strategy.train_epoch`` and ``Strategy.evaluate`` / ``evaluate_local``.

When evaluation happens: after every ``train.eval_every`` epoch-equivalents of work and after
the last epoch. How: with ``train.eval_mode local`` (the default, P > 1) through
``evaluate_local`` where the strategy has one (its own graph: no traffic but the counts), else
exactly. The best validation accuracy selects the state; when a local evaluation selected it,
that state is evaluated exactly once when the run ends, and that exact test accuracy is the one
reported. ``train.patience`` ends the run when validation has not improved for that many
epoch-equivalents; every rank sees the same global accuracy, so all stop at the same epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..seeds import rank_seed
from ..strategies.base import Strategy, WorkerContext
from .. import heap
from ..graph import check_trainable_split
from ..partition.plans import check_plans
from .clock import ComputeClock
from .identity import check_resume_epochs
from .metrics import (MetricsWriter, human_bytes, peak_gpu_mb, peak_rss_mb, summarize_ops,
                      truncate_metrics)
from .records import EpochRecord, RunSummary, SetupRecord
from .rundir import attempt_totals, write_json

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["Trainer", "train_on"]


@dataclasses.dataclass
class Selection:
    """The state the run reports: the best validation accuracy so far and its epoch's
    accuracies (exact ones once a local evaluation's pick was checked)."""

    val_acc: float = -1.0
    test_acc: float = float("nan")
    train_acc: float = float("nan")
    epoch: int = -1
    local_val_acc: Optional[float] = None   #: the local estimate that selected it, if local


class Trainer:
    def __init__(self, ctx: WorkerContext, strategy: Strategy, cfg: RunConfig, run_dir: Path,
                 keep_records: bool = False) -> None:
        self.ctx, self.strategy, self.cfg, self.run_dir = ctx, strategy, cfg, Path(run_dir)
        self.keep_records = keep_records
        self.comm = ctx.comm
        self.clock = ComputeClock(ctx.device)   # what compute is measured in (clock.py)
        self.best = Selection()
        self.history: list[dict[str, Any]] = []   # this rank's per-epoch totals (for summary)
        #: with ``keep_records``: every record this run wrote to its metrics file (the set-up's
        #: first), kept in memory for a study that trains in-process (:func:`train_on`); off
        #: for a worker, whose run may hold thousands of rounds per epoch
        self.records: list[dict[str, Any]] = []
        self.work_done = 0.0    # epoch-equivalents trained: the clock of eval_every and patience
        self.best_work = 0.0    # work_done when the best validation accuracy was found
        self.selected: Any = None   # Strategy.eval_state() of the best, when a local eval chose it
        self.stop = False       # patience or the budget ran out (the same epoch on every rank)
        self.stopped_by: Optional[str] = None
        self.t_start = time.perf_counter()
        self.checkpointer: Any = None
        self.nothing_left = False   # resumed from the run's own last checkpoint
        #: rank 0: the best-validation model seen so far (:meth:`_snapshot_best`)
        self.model_best: Optional[dict[str, Any]] = None
        #: rank 0, once run() returned: the :class:`RunSummary` as ``summary.json`` holds it
        self.summary: Optional[dict[str, Any]] = None
        rt = cfg.runtime
        if rt.checkpoint_every or rt.resume:
            from .checkpoint import Checkpointer
            self.checkpointer = Checkpointer(self.run_dir / "checkpoints", ctx.rank,
                                             ctx.world_size, keep=rt.keep_checkpoints,
                                             comm=self.comm, log=ctx.log)
            # the features a resume must find unchanged (free from a book; else one pass)
            self.features = ctx.part.features_identity()

    # ------------------------------------------------------------------ main loop
    def run(self) -> Optional[RunSummary]:
        cfg, s, comm, rank = self.cfg, self.strategy, self.comm, self.ctx.rank
        p = self.ctx.part      # the global counts: every rank refuses alike, before any traffic
        check_trainable_split(p.num_train_global, p.num_val_global, p.num_test_global,
                              p.graph_name)
        t_start = self.t_start = time.perf_counter()
        with comm.phase("setup"):
            # the parts must agree on the rows that cross between them before a strategy
            # exchanges any (one part edited trains silently on wrong rows otherwise); a
            # disagreement stops every rank here together (partition/plans.py)
            check_plans(comm, self.ctx.part)
            s.setup()
        heap.trim()   # the set-up's freed temporaries (quietgnn/heap.py)
        self._ledger("setup")
        start_epoch = self._maybe_resume()
        with comm.phase("setup"):
            # Ranks load and partition at their own pace; without this the first collective
            # of epoch 0 absorbs the skew and a rank's first epoch counts seconds of waiting
            # for the last one to arrive (seen on emulated hosts: 11 s of a 0.9 s epoch).
            comm.barrier("start")
        metrics = MetricsWriter(self.run_dir, rank, append=start_epoch > 0)
        setup = summarize_ops(comm.take_records())
        rec = SetupRecord(epoch=-1, rank=rank, phase="setup", bytes=setup["bytes"],
                          rounds=setup["rounds"], peak_rss_mb=peak_rss_mb(),
                          setup_s=time.perf_counter() - t_start,
                          peak_gpu_mb=peak_gpu_mb(self.ctx.device))
        self._keep(rec)
        metrics.write(rec)
        # train.epochs: passes, for every strategy; none left after the run's own last checkpoint
        epochs = start_epoch if self.nothing_left else s.max_calls(cfg.train.epochs)
        epoch = start_epoch - 1
        for epoch in range(start_epoch, epochs):
            rec = self._epoch(epoch, last=epoch == epochs - 1)
            self._keep(rec)
            metrics.write(rec)
            self._progress(rec)
            if self._checkpoint_due(epoch):
                from .identity import run_identity
                self.checkpointer.save(epoch, self._state(epoch), identity=run_identity(cfg))
            if s.finished() or self.stop:
                break
        metrics.close()
        self._ledger("train")
        self._write_model(epoch)
        wall = time.perf_counter() - t_start
        return self._summary(wall, epoch + 1 - start_epoch)

    def _checkpoint_due(self, epoch: int) -> bool:
        every = self.cfg.runtime.checkpoint_every
        return bool(self.checkpointer and every and (epoch + 1) % every == 0)

    def _ledger(self, when: str) -> None:
        # diagnostics of what holds a rank's memory (QUIETGNN_MEM_LEDGER; runtime/memledger.py)
        from . import memledger
        if memledger.enabled():
            memledger.write_ledger(self.run_dir, self.ctx.rank, when,
                                   {"strategy": self.strategy, "part": self.ctx.part})

    def _keep(self, rec: SetupRecord | EpochRecord) -> None:
        if self.keep_records:
            self.records.append(rec.to_json())

    def _epoch(self, epoch: int, last: bool) -> EpochRecord:
        s, comm = self.strategy, self.comm
        comm.epoch = epoch
        t0, c0, p0 = time.perf_counter(), self.clock.now(), time.process_time()
        with comm.phase("train"):
            res = s.train_epoch(epoch)
        c_train = self.clock.now() - c0
        t_train = time.perf_counter() - t0
        p_train = time.process_time() - p0
        before, self.work_done = self.work_done, self.work_done + float(res.work)
        every = self.cfg.train.eval_every
        due = math.floor(self.work_done / every + 1e-9) > math.floor(before / every + 1e-9)
        accs: Optional[dict[str, float]] = None
        how, final, t_eval, c_eval, p_eval = None, None, 0.0, 0.0, 0.0
        records = comm.take_records()
        if last or s.finished() or due:
            te, ce, pe = time.perf_counter(), self.clock.now(), time.process_time()
            with comm.phase("eval"):
                accs, how = self._evaluate()
                self._select(accs, how, epoch)
                tc = self.cfg.train
                if tc.patience and self.work_done - self.best_work >= tc.patience:
                    self.stop, self.stopped_by = True, "patience"
                # (every rank reaches the flag's all-reduce, whatever patience said; a budget
                # spent at the run's own end stops nothing)
                if tc.budget_s and self._over_budget(tc.budget_s) and not self.stop \
                        and not (last or s.finished()):
                    self.stop, self.stopped_by = True, "budget"
                if last or s.finished() or self.stop:
                    final = self._final_exact()
            c_eval = self.clock.now() - ce
            t_eval, p_eval = time.perf_counter() - te, time.process_time() - pe
            eval_records = comm.take_records()
            c_eval = self.clock.less_comm(c_eval, eval_records)
            records += eval_records
        if last or s.finished() or self.stop or self._checkpoint_due(epoch):
            # what a strategy keeps in flight lands in this epoch: the run ends here, or its
            # state is saved (and a resume would drop the next epoch's record)
            ts, cs = time.perf_counter(), self.clock.now()
            with comm.phase("train"):
                s.settle()
            c_train += self.clock.now() - cs
            t_train += time.perf_counter() - ts
            records += comm.take_records()
        ops = summarize_ops(records)
        if not math.isfinite(res.loss):
            # sync_gradients stops every rank together on non-finite values; this catches
            # strategies whose loss never crosses ranks.
            raise FloatingPointError(f"rank {self.ctx.rank}: non-finite training loss "
                                     f"{res.loss} in epoch {epoch}")
        accs = accs or {}
        rec = EpochRecord(
            epoch=epoch, rank=self.ctx.rank, loss=res.loss, steps=res.steps, work=res.work,
            train_acc=accs.get("train"), val_acc=accs.get("val"), test_acc=accs.get("test"),
            wall_s=t_train + t_eval,
            compute_s=self.clock.less_comm(c_train, (r for r in records if r.phase == "train")),
            comm_s=ops["comm_s"], eval_s=t_eval, eval_compute_s=c_eval,
            cpu_s=p_train, eval_cpu_s=p_eval, eval_mode=how, bytes=ops["bytes"],
            bytes_by_kind=ops["bytes_by_kind"], messages=ops["messages"],
            rounds=ops["rounds"], peak_rss_mb=peak_rss_mb(), extra=res.extra,
            selected=final,     # the exact evaluation of the selected state, if made
            peak_gpu_mb=peak_gpu_mb(self.ctx.device))
        self.history.append({"epoch": epoch, "compute_s": rec.compute_s, "work": res.work,
                             "evaluated": how, "wall_s": rec.wall_s, "loss": res.loss,
                             "train_sent": rec.sent("train"), "eval_sent": rec.sent("eval"),
                             "peak_rss_mb": rec.peak_rss_mb})
        return rec

    def _over_budget(self, budget_s: float) -> bool:
        """Whether any rank has spent ``budget_s`` (ranks' clocks differ: one small
        all-reduce, counted in phase ``control``, which no projection charges, so that every
        rank stops at the same epoch). It needs every rank alive: a strategy that finishes
        on the survivors of a lost rank (``tma``) fails at the next evaluation instead."""
        import torch
        late = float(time.perf_counter() - self.t_start >= budget_s)
        flag = torch.tensor([late], dtype=torch.float32, device=self.ctx.device)
        with self.comm.phase("control"):
            return bool(self.comm.all_reduce(flag, "budget", op="max",
                                             carries="control").item())

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self) -> tuple[dict[str, float], str]:
        """(accuracies, 'local' | 'exact'); one rank holds the whole graph: exact is free."""
        if self.cfg.train.eval_mode == "local" and self.ctx.world_size > 1:
            accs = self.strategy.evaluate_local()
            if accs is not None:
                return accs, "local"
        return self.strategy.evaluate(), "exact"

    def _select(self, accs: dict[str, float], how: str, epoch: int) -> None:
        """Keep the best validation accuracy (the first of equals) and, when it comes from a
        local evaluation, a copy of the state for the exact evaluation at the end."""
        if not accs["val"] > self.best.val_acc:
            return
        self.best = Selection(val_acc=accs["val"], test_acc=accs["test"],
                              train_acc=accs["train"], epoch=epoch)
        self.best_work = self.work_done
        self.selected = self.strategy.eval_state() if how == "local" else None
        self._snapshot_best(epoch, accs)

    def _final_exact(self) -> Optional[dict[str, Any]]:
        """Evaluate the state a local evaluation selected exactly (collective), report those
        accuracies, and put the current state back; None when exact evaluations selected."""
        if self.selected is None:
            return None
        s = self.strategy
        current = s.eval_state()
        s.load_eval_state(self.selected)
        try:
            exact = s.evaluate()
        finally:
            s.load_eval_state(current)
        self.best = dataclasses.replace(self.best, local_val_acc=self.best.val_acc,
                                        val_acc=exact["val"], test_acc=exact["test"],
                                        train_acc=exact["train"])
        return {"epoch": self.best.epoch, **exact}

    # ------------------------------------------------------------------ checkpoints
    def _state(self, epoch: int) -> dict[str, Any]:
        return {"epoch": epoch, "best": dataclasses.asdict(self.best), "history": self.history,
                "work_done": self.work_done, "best_work": self.best_work,
                "selected": self.selected,
                "strategy": self.strategy.state_dict(), "config": self.cfg.to_dict(),
                "sent_by_class": dict(self.comm.sent_by_class),
                "book_id": self.ctx.part.book_id, "features": self.features,
                "model_best": self.model_best}

    def _maybe_resume(self) -> int:
        if not self.checkpointer:
            return 0
        if not self.cfg.runtime.resume:
            self.checkpointer.start_fresh()   # an earlier run's checkpoints must not mix in
            return 0
        from .checkpoint import restore_rng
        state = self.checkpointer.load_latest(self.cfg, self.ctx.part.book_id, self.features)
        if state is None:
            if self.ctx.rank == 0:
                self.ctx.log("--resume: no checkpoint yet, starting at epoch 0")
            self.checkpointer.start_fresh()
            return 0
        self.strategy.load_state_dict(state["strategy"])
        self.nothing_left = check_resume_epochs(
            state["config"], self.cfg, int(state["epoch"]),
            self.strategy.max_calls(self.cfg.train.epochs), self.strategy.finished())
        names = {f.name for f in dataclasses.fields(Selection)}
        self.best = Selection(**{k: v for k, v in state["best"].items() if k in names})
        self.history = state["history"]
        # the earlier attempts' bytes by class, added to this attempt's setup (as the metrics
        # keep both attempts' setup records)
        for c, n in state.get("sent_by_class", {}).items():
            self.comm.sent_by_class[c] = self.comm.sent_by_class.get(c, 0) + int(n)
        self.model_best = state.get("model_best")
        self.work_done = float(state.get("work_done", sum(h.get("work", 1.0)
                                                          for h in self.history)))
        self.best_work = float(state.get("best_work", 0.0))
        self.selected = state.get("selected")
        # Last, so that nothing in load_state_dict consumes random numbers after the restore:
        # dropout masks (and samplers on the global RNG) continue as if never interrupted.
        restore_rng(state["rng"])
        if "comm_round" in state:
            self.comm.round = int(state["comm_round"])   # rounds line up with an unbroken run
        epoch = int(state["epoch"])
        # this attempt trains the epochs after it again
        truncate_metrics(self.run_dir, self.ctx.rank, epoch)
        if self.ctx.rank == 0:
            self.ctx.log(f"resumed from checkpoint of epoch {epoch}")
        return epoch + 1

    # ------------------------------------------------------------------ the trained model
    def _snapshot_best(self, epoch: int, accs: dict[str, float]) -> None:
        """Rank 0 copies the model just scored; :meth:`_select` calls it only when that score
        is the best validation accuracy so far, the rule of the reported test accuracy (a
        strategy whose scored model is no GNN yet, RETEXO before its last layer, is skipped)."""
        if self.ctx.rank != 0:
            return
        model = self.strategy.export_model()
        if model is not None:
            self.model_best = {"epoch": epoch, "val_acc": accs["val"], "test_acc": accs["test"],
                               "spec": model.spec(), "selected": "best_val",
                               "state": {k: v.detach().to("cpu", copy=True)
                                         for k, v in model.state_dict().items()}}

    def _write_model(self, last_epoch: int) -> None:
        """Rank 0 writes ``model.json`` + ``model.pt`` (:mod:`quietgnn.nn.export`): the
        best-validation copy, or the last model when no evaluation had a validation score."""
        if self.ctx.rank != 0:
            return
        best = self.model_best
        if best is None:
            model = self.strategy.export_model()
            if model is None:
                self.ctx.log(f"note: strategy {self.cfg.strategy!r} ended without a whole model "
                             f"to save (see Strategy.export_model); no model.pt written")
                return
            best = {"epoch": last_epoch, "val_acc": None, "test_acc": None, "selected": "last",
                    "spec": model.spec(), "state": model.state_dict()}
        from ..nn.export import save_model
        info = {k: best[k] for k in ("epoch", "val_acc", "test_acc", "selected")}
        if best["selected"] == "best_val" and best["epoch"] == self.best.epoch:
            # a local evaluation selected it: the exact evaluation at the end scored it
            info.update(val_acc=self.best.val_acc, test_acc=self.best.test_acc)
        info.update(strategy=self.cfg.strategy, dataset=self.cfg.dataset.name,
                    num_classes=self.ctx.part.num_classes)
        save_model(self.run_dir, best["spec"], best["state"], info)

    # ------------------------------------------------------------------ reporting
    def _progress(self, rec: EpochRecord) -> None:
        if self.ctx.rank != 0 or not self.cfg.runtime.progress:
            return
        epochs = self.cfg.train.epochs
        e = rec.epoch + 1           # epochs done; the epoch itself is numbered from 0 as in
        tty = sys.stderr.isatty()   # metrics.jsonl, the summary's best_epoch and the report
        if not tty and e % max(1, epochs // 10) and e != epochs:
            return
        acc = "" if rec.val_acc is None else \
            f" val {rec.val_acc:.4f} test {rec.test_acc:.4f}" + \
            (" (local)" if rec.eval_mode == "local" else "")
        if rec.selected:
            sel = rec.selected
            acc += f" | selected epoch {sel['epoch']}: exact test {sel['test']:.4f}"
        # the basis of the summary's "rank 0 sent" figure: per epoch-equivalent
        sent = human_bytes(rec.sent("train") / (rec.work or 1.0))
        filled = int(24 * e / epochs)
        bar = "#" * filled + "." * (24 - filled)
        line = (f"[{bar}] epoch {rec.epoch} ({e}/{epochs}) loss {rec.loss:.4f}{acc} | "
                f"rank 0 sent {sent}/epoch | {rec.wall_s * 1000:.0f} ms")
        sys.stderr.write(("\r" + line + " " * 4) if tty else line + "\n")
        if tty and e == epochs:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def _summary(self, wall: float, epochs_run: int) -> Optional[dict[str, Any]]:
        # what this rank sent, by traffic class: every op of the run but this gather
        mine = {"rank": self.ctx.rank, "history": self.history,
                "sent_by_class": dict(self.comm.sent_by_class)}
        gpu = peak_gpu_mb(self.ctx.device)
        if gpu is not None:     # (a CPU run's gather stays as it was)
            mine["peak_gpu_mb"] = gpu
        with self.comm.phase("control"):
            everyone = self.strategy.gather_objects(mine)   # None: no dead ranks to route around
            if everyone is None:
                everyone = self.comm.all_gather_object(mine, carries="control")
            self.comm.take_records()
        if self.ctx.rank != 0:
            return None
        cfg = self.cfg
        hist = [h["history"] for h in everyone]
        n_ep = min(len(h) for h in hist) if hist else 0
        train_bytes = sum(e["train_sent"] for h in hist for e in h)
        eval_bytes = sum(e["eval_sent"] for h in hist for e in h)
        compute = sum(max(h[i]["compute_s"] for h in hist) for i in range(n_ep))
        # per epoch-equivalent (EpochResult.work), so that a strategy whose trainer epoch is
        # many passes (tma) compares with the others per unit of work
        work = sum(float(e.get("work", 1.0)) for e in hist[0][:n_ep]) if n_ep else 0.0
        per = work if work > 0 else n_ep
        summary = RunSummary(
            strategy=cfg.strategy, dataset=cfg.dataset.name, parts=self.ctx.world_size,
            partitioner=cfg.partition_method, model=cfg.model.arch,
            layers=cfg.model.layers, hidden=cfg.model.hidden, seed=cfg.train.seed,
            epochs=n_ep, test_acc=self.best.test_acc, val_acc=self.best.val_acc,
            train_acc=self.best.train_acc, best_epoch=self.best.epoch,
            # how the reported state was chosen: the best validation accuracy of evaluations
            # made this way ('local': then evaluated exactly once at the end)
            selected_by="local" if self.best.local_val_acc is not None else "exact",
            # a strategy's options.eval_nodes: its evaluations ran on a fixed sample of about
            # that many nodes per split, not on the whole graph (None: the whole graph)
            eval_sample_nodes=getattr(self.strategy.options, "eval_nodes", 0) or None,
            local_val_acc=self.best.local_val_acc,
            evaluations=sum(1 for e in hist[0] if e.get("evaluated")),
            stopped_early=self.stop, stopped_by=self.stopped_by,
            final_loss=hist[0][-1]["loss"] if n_ep else float("nan"),
            train_bytes=train_bytes,
            epoch_equivalents=work,
            train_bytes_per_epoch=train_bytes / per if per else 0.0,
            # what the progress line shows: rank 0's training bytes sent per epoch-equivalent
            rank0_train_bytes_per_epoch=sum(e["train_sent"] for e in hist[0]) / per
            if per else 0.0,
            eval_bytes=eval_bytes, wall_seconds=wall, **attempt_totals(self.run_dir, wall),
            compute_seconds=compute,
            peak_rss_mb=max(e["peak_rss_mb"] for h in hist for e in h) if n_ep else 0.0,
            peak_gpu_mb=max((h["peak_gpu_mb"] for h in everyone if "peak_gpu_mb" in h),
                            default=None),
            run_dir=str(self.run_dir), options=cfg.to_dict()["options"],
            **_residency(cfg.runtime.residency, everyone),
            strategy_report=self.strategy.run_report() or None,
        ).to_json()
        write_json(self.run_dir / "summary.json", summary)
        return summary


def train_on(comm: Any, part: Any, cfg: RunConfig, run_dir: Path, log: Any = None,
             device: Any = None, keep_records: bool = False) -> Trainer:
    """Train ``cfg``'s strategy on this rank's ``part`` over an open communicator, with the
    loop ``quietgnn train`` runs; returns the finished :class:`Trainer` (``summary`` on rank
    0; with ``keep_records``, ``records``: this rank's per-epoch records, the set-up's first).

    The worker calls it once per process; a study calls it for several configurations in one
    process group (start-up paid once), so the communicator is left as a fresh one would be:
    records of an earlier run and its traffic totals do not leak into this one."""
    import torch

    from ..strategies.base import WorkerContext
    comm.take_records()
    comm.epoch = -1
    comm.sent_by_class = {}
    comm.residency = cfg.runtime.residency   # the worker set it before any traffic; a study not
    # Dropout masks differ per rank by design (each rank draws its own nodes' masks).
    torch.manual_seed(rank_seed(cfg.train.seed, comm.rank))
    if device is not None and torch.device(device).type == "cuda":
        # peak_gpu_mb is this run's, not an earlier one's in the same process (a study)
        torch.cuda.reset_peak_memory_stats(device)
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                        model_cfg=cfg.model, train_cfg=cfg.train,
                        device=device if device is not None else torch.device("cpu"),
                        run_dir=Path(run_dir), log=log or (lambda msg: None))
    strategy = cfg.strategy_cls(ctx, cfg.options)
    trainer = Trainer(ctx, strategy, cfg, Path(run_dir), keep_records=keep_records)
    try:
        trainer.summary = trainer.run()
    except BaseException:
        with contextlib.suppress(Exception):   # the run's own error is the one to report
            strategy.close()
        raise
    strategy.close()
    return trainer


def _residency(level: str, everyone: list[dict[str, Any]]) -> dict[str, Any]:
    """The level and the bytes each rank sent per traffic class (comm/traffic.py), so a run
    shows what left each site (the summary's own gather is not counted)."""
    per_rank = {str(e["rank"]): dict(sorted(e.get("sent_by_class", {}).items()))
                for e in everyone}
    total: dict[str, int] = {}
    for d in per_rank.values():
        for c, n in d.items():
            total[c] = total.get(c, 0) + n
    return {"residency": level, "bytes_sent_by_class": dict(sorted(total.items())),
            "bytes_sent_by_class_per_rank": per_rank}

