"""Projection: what a recorded run would cost on a network tier (:mod:`quietgnn.comm.network`).

A run is measured on one machine (loopback gloo), where communication is nearly free. The
communicator records every collective of every rank (``rounds`` in the per-epoch metrics,
see :mod:`quietgnn.runtime.metrics`); this module replays those records on a network tier
described by a bandwidth and a latency, with a deliberately simple alpha-beta model:

    comm(epoch)  = sum over the epoch's rounds r of
                   hops_r * latency + max over ranks of max(sent_r, recv_r) / bandwidth
    epoch time   = max over ranks of compute_s  +  comm(epoch)  +  eval(epoch)
    eval(epoch)  = max over ranks of eval_compute_s  +  comm of the epoch's eval rounds

* A *round* is one collective; all ranks issue the same collectives in the same order, so
  round ``r`` means the same operation on every rank. The round is as slow as its slowest
  rank, and a rank's link is busy for ``max(sent, recv)`` bytes (full duplex).
* *hops* are the sequential latency steps of the algorithm, as recorded by
  :class:`~quietgnn.comm.Communicator`: ``all_to_all`` 1 (2 with a size handshake),
  ``all_reduce`` ``2 ceil(log2 P)`` (reduce-scatter + all-gather), ``broadcast``
  ``ceil(log2 P)``, ``barrier`` ``2 ceil(log2 P)``.
* ``compute_s`` is the thread CPU time of the training step outside communication with one
  compute thread per worker, so the slowest rank's value is what a machine of its own would
  spend (on a GPU: the wall seconds, device synchronised, outside communication). Ranks that
  share fewer cores than there are ranks (emulated hosts on one machine)
  are projected with ``cores``: a phase then takes at least the ranks' total CPU seconds over
  the cores.

Overlap: an exchange a strategy starts and waits for later (``all_to_all_async``: ``pipegcn``,
``adaqp``'s overlap) records the compute it flew behind; an epoch's such exchanges cost only
what exceeds the longest of those windows (they share the link and the window). What it gives
up: no congestion between concurrent pairs beyond the per-rank link, no packet loss.
The model is linear in (latency, 1/bandwidth), so an epoch is summarised by two numbers,
``hops`` (sum of hops) and ``crit_bytes`` (sum over rounds of the slowest rank's bytes), and any
tier is a dot product; :func:`epoch_curve` computes them once per run.

Which rounds count: phases ``train`` and ``data`` (bulk data movement during training, e.g.
Grappa's chunk reloads, is on the critical path too) as training; ``eval`` rounds and compute
as the evaluation the run did (on the epochs it evaluated: how often is ``train.eval_every``),
charged to the epoch's time too; ``setup`` is one-off (reported separately as
``setup_hops``/``setup_bytes``), ``control`` is bookkeeping.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..comm.network import Tier
from ..runtime.records import EpochRecord, Record, SetupRecord, metrics_line, optional

__all__ = ["Curve", "Point", "SetupCost", "Projected", "epoch_curve", "curve_work", "project",
           "hidden_s", "time_to_accuracy", "TRAIN_PHASES"]

#: phases whose rounds are charged to training time
TRAIN_PHASES = ("train", "data")


# ---------------------------------------------------------------------- the curve
@dataclasses.dataclass(frozen=True)
class Point(Record):
    """One epoch of a run, every rank's record merged: what projection, reports, plots and
    the advisor read. Fields a curve stored before they were kept read ``None``."""

    epoch: int
    work: float                        #: epoch-equivalents (``EpochRecord.work``)
    compute_s: float                   #: the slowest rank's
    compute_sum_s: float               #: summed over ranks (what ranks sharing cores need)
    cpu_sum_s: Optional[float]         #: every thread's CPU, summed over ranks
    hops: float                        #: training rounds' latency steps
    crit_bytes: float                  #: training rounds' slowest-rank bytes, summed
    rounds: int                        #: training rounds counted
    eval_hops: float                   #: the same of the epoch's evaluation, if any
    eval_crit_bytes: float
    eval_compute_s: float
    eval_compute_sum_s: float
    eval_cpu_sum_s: Optional[float]
    train_bytes: int                   #: sent, summed over ranks
    data_bytes: int
    eval_bytes: int
    wall_s: float                      #: measured, the slowest rank's
    comm_s: float
    eval_s: float
    test_acc: Optional[float]          #: None on epochs without evaluation
    val_acc: Optional[float]
    train_acc: Optional[float]
    peak_rss_mb: float                 #: the largest of any rank
    #: of ``hops`` and ``crit_bytes``, the part of exchanges waited for after compute
    #: (``all_to_all_async``), and the longest compute one of them flew behind (the smallest
    #: over ranks); None in curves recorded before it was kept (charged as waited at once)
    overlap_hops: Optional[float] = optional()
    overlap_crit_bytes: Optional[float] = optional()
    overlap_s: Optional[float] = optional()
    #: on GPUs, the most any rank's tensors held on its device so far (MiB); None on CPUs
    peak_gpu_mb: Optional[float] = optional()

    @property
    def passes(self) -> float:
        """``work``, 1 for a curve stored before it was kept."""
        return 1.0 if self.work is None else float(self.work)


@dataclasses.dataclass(frozen=True)
class SetupCost(Record):
    """The set-up's rounds, once per run."""

    hops: float
    crit_bytes: float
    rounds: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class Curve(Record):
    """A run's epochs as :func:`epoch_curve` merges them (``curve`` in a bench result)."""

    setup: Optional[SetupCost]
    ranks: Optional[int]
    phases: Optional[list[str]]
    epochs: list[Point]
    #: bytes sent in phase ``train`` per epoch-equivalent, summed over ranks, by message kind
    #: (``halo_fwd``, ``allreduce``, ...): where a strategy's traffic goes
    train_bytes_by_kind: Optional[dict[str, float]] = optional()

    def to_json(self, columns: bool = True) -> dict[str, Any]:
        """The JSON form: ``epochs`` as one list per field (``columns``: a result file holds
        thousands of points, and the field names would be most of its bytes), or as one
        object per point."""
        out = super().to_json()
        if columns:
            names = [f.name for f in dataclasses.fields(Point)]
            out["epochs"] = {k: [getattr(p, k) for p in self.epochs] for k in names}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Curve:
        """Either JSON form (and that of results written before the columns: points)."""
        if isinstance(data, Curve):
            return data
        eps = data.get("epochs") or []
        if isinstance(eps, Mapping):
            n = max((len(v) for v in eps.values()), default=0)
            eps = [{k: v[i] for k, v in eps.items() if i < len(v)} for i in range(n)]
        return super().from_json({**data, "epochs": eps})

    @classmethod
    def of(cls, curve: Curve | Mapping[str, Any] | Sequence[Any]) -> Curve:
        """A curve, its JSON form, or a list of its points."""
        if isinstance(curve, Curve):
            return curve
        if not isinstance(curve, Mapping):
            return cls(setup=None, ranks=None, phases=None,
                       epochs=[Point.from_json(p) for p in curve])
        return cls.from_json(curve)


def _merge_rounds(records: Iterable[SetupRecord | EpochRecord],
                  phases: Sequence[str]) -> tuple[float, float, int]:
    """(sum of hops, sum of slowest-rank bytes, rounds) over the rounds of one epoch of all
    ranks. ``records``: that epoch's record of each rank."""
    hops, crit, n, _ = _merge_overlap(records, phases)
    return hops, crit, n


def _merge_overlap(records: Iterable[SetupRecord | EpochRecord], phases: Sequence[str]
                   ) -> tuple[float, float, int, Optional[tuple[float, float, float]]]:
    """:func:`_merge_rounds` and, where any round was an exchange waited for later, (its
    hops, its slowest-rank bytes, the longest compute one of them flew behind: per round the
    smallest over ranks)."""
    # round -> [hops, max bytes, smallest window, then per rank: waited for late?]
    per_round: dict[int, list[Any]] = {}
    for rec in records:
        for rnd, _kind, phase, sent, recv, hops, *rest in rec.rounds or []:
            if phase not in phases:
                continue
            cur = per_round.setdefault(int(rnd), [0.0, 0.0, None])
            cur[0] = max(cur[0], float(hops))
            cur[1] = max(cur[1], float(sent), float(recv))
            # [seconds, overlap]: waited for late; a rank that waited at once hid nothing
            w = float(rest[1]) if len(rest) > 1 else 0.0
            cur[2] = w if cur[2] is None else min(cur[2], w)
            cur.append(len(rest) > 1)
    hops = sum(v[0] for v in per_round.values())
    crit = sum(v[1] for v in per_round.values())
    late = [v for v in per_round.values() if any(v[3:])]
    overlap = (sum(v[0] for v in late), sum(v[1] for v in late), max(v[2] for v in late)) \
        if late else None
    return hops, crit, len(per_round), overlap


def epoch_curve(metrics: Mapping[int, Sequence[Any]],
                phases: Sequence[str] = TRAIN_PHASES) -> Curve:
    """Merge a run's per-rank metrics (``read_metrics(run_dir)``: each rank's lines, as JSON
    or as records) into one :class:`Point` per epoch that every rank recorded."""
    if not metrics:
        raise ValueError("no metrics to project: the run directory has no metrics/rank-*.jsonl "
                         "files (did the run start?)")
    by_epoch: dict[int, dict[int, EpochRecord]] = {}
    setup: dict[int, SetupRecord] = {}
    for rank, lines in metrics.items():
        for line in lines:
            rec = metrics_line(line)
            if isinstance(rec, SetupRecord):
                setup[int(rank)] = rec
            else:   # a resumed run appends: the last record of an epoch wins
                by_epoch.setdefault(int(rec.epoch), {})[int(rank)] = rec
    ranks = set(metrics)
    s_hops, s_bytes, s_rounds = _merge_rounds(setup.values(), ("setup",))
    points = []
    for ep in sorted(by_epoch):
        recs = by_epoch[ep]
        if set(recs) != ranks:
            continue  # torn: not every rank finished this epoch
        rs = list(recs.values())
        hops, crit, n, late = _merge_overlap(rs, phases)
        e_hops, e_crit, _ = _merge_rounds(rs, ("eval",))
        r0 = recs[min(recs)]
        points.append(Point(
            epoch=ep, work=r0.passes,
            compute_s=max(r.compute_s or 0.0 for r in rs),
            compute_sum_s=sum(r.compute_s or 0.0 for r in rs),
            # every thread's CPU (communication's copies and framing included): what ranks
            # sharing cores take from each other; None for records written before it was kept
            cpu_sum_s=_total(r.cpu_s for r in rs),
            hops=hops, crit_bytes=crit, rounds=n, eval_hops=e_hops, eval_crit_bytes=e_crit,
            eval_compute_s=max(r.eval_compute_s or 0.0 for r in rs),
            eval_compute_sum_s=sum(r.eval_compute_s or 0.0 for r in rs),
            eval_cpu_sum_s=_total(r.eval_cpu_s for r in rs),
            train_bytes=sum(r.sent("train") for r in rs),
            data_bytes=sum(r.sent("data") for r in rs),
            eval_bytes=sum(r.sent("eval") for r in rs),
            wall_s=max(r.wall_s or 0.0 for r in rs), comm_s=max(r.comm_s or 0.0 for r in rs),
            eval_s=max(r.eval_s or 0.0 for r in rs),
            test_acc=r0.test_acc, val_acc=r0.val_acc, train_acc=r0.train_acc,
            peak_rss_mb=max(r.peak_rss_mb or 0.0 for r in rs),
            peak_gpu_mb=max((r.peak_gpu_mb for r in rs if r.peak_gpu_mb is not None),
                            default=None),
            **({} if late is None else dict(zip(("overlap_hops", "overlap_crit_bytes",
                                                 "overlap_s"), late)))))
    kinds: dict[str, float] = {}
    for ep in (by_epoch[p.epoch] for p in points):
        for r in ep.values():
            for key, n in (r.bytes_by_kind or {}).items():
                phase, _, kind = key.partition("/")
                if phase == "train":
                    kinds[kind] = kinds.get(kind, 0.0) + n
    work = curve_work(points)
    return Curve(setup=SetupCost(hops=s_hops, crit_bytes=s_bytes, rounds=s_rounds,
                                 bytes=sum(r.sent("setup") for r in setup.values())),
                 ranks=len(ranks), phases=list(phases), epochs=points,
                 train_bytes_by_kind={k: v / work for k, v in sorted(kinds.items())}
                 if points and work else None)


def curve_work(epochs: Sequence[Point]) -> float:
    """Epoch-equivalents of work in a curve's epochs (``EpochResult.work``; 1 per epoch for
    results written before it was recorded): the divisor of every per-epoch figure."""
    w = sum(p.passes for p in epochs)
    return w if w > 0 else float(len(epochs))


def _total(vals: Iterable[Optional[float]]) -> Optional[float]:
    vals = list(vals)
    return None if any(v is None for v in vals) else sum(float(v) for v in vals)


def _first(*vals: Optional[float]) -> Optional[float]:
    return next((v for v in vals if v is not None), None)


def _shared(slowest: float, total: Optional[float], cores: Optional[int]) -> float:
    """Wall seconds of a compute phase: the slowest rank's CPU seconds on hosts with a core
    each; with the ranks sharing ``cores`` cores (processor sharing: a work-conserving
    scheduler), no less than the ranks' total CPU seconds spread over the cores either: all
    of a process's threads (``cpu_sum_s``: communication's copies and framing take cores
    too), or the compute alone for older records."""
    if not cores or total is None:
        return slowest
    return max(slowest, total / cores)


@dataclasses.dataclass(frozen=True)
class Projected(Record):
    """One epoch on a tier: ``comm_s`` of training, ``eval_s`` the evaluation's compute and
    communication, ``time_s`` all three; ``cum_s`` the time through the end of the epoch."""

    epoch: int
    compute_s: float
    comm_s: float
    eval_s: float
    time_s: float
    cum_s: float
    test_acc: Optional[float]


def hidden_s(tier: Tier, hops: float, crit_bytes: float, window_s: float,
             compute_s: float) -> float:
    """Seconds of an epoch's late-waited exchanges (``hops``, ``crit_bytes``) that the compute
    they flew behind (``window_s``) hides on ``tier``: an exchange waited for after compute
    costs only what that compute did not hide. No more than the epoch's compute either (the
    window also holds other CPU: framing, evaluation between epochs, which --without-eval
    leaves out). The projection and the advisor both charge overlap through this."""
    return min(tier.seconds(hops, crit_bytes), window_s, compute_s)


def project(curve: Curve | Mapping[str, Any] | Sequence[Any], tier: Tier,
            cores: Optional[int] = None, compute_speedup: float = 1.0) -> list[Projected]:
    """Per epoch of ``curve`` on ``tier``. ``cores``: the ranks share that many cores (e.g.
    emulated hosts on one machine) instead of having one each. ``compute_speedup``: a
    what-if, every rank's compute (training and evaluation) that many times faster than
    measured (e.g. an accelerator), the bytes and rounds as counted."""
    if not compute_speedup > 0:
        raise ValueError(f"compute_speedup = {compute_speedup!r}; expected a factor > 0 "
                         f"(1: as measured)")
    out, cum = [], 0.0
    for p in Curve.of(curve).epochs:
        compute = _shared(p.compute_s, _first(p.cpu_sum_s, p.compute_sum_s),
                          cores) / compute_speedup
        comm = tier.seconds(p.hops, p.crit_bytes)
        if p.overlap_s is not None:
            # the compute it flew behind scales as the epoch's does (cores, speedup)
            comm -= hidden_s(tier, p.overlap_hops or 0.0, p.overlap_crit_bytes or 0.0,
                             p.overlap_s * (compute / p.compute_s if p.compute_s else 0.0),
                             compute)
        ev = _shared(p.eval_compute_s or 0.0, _first(p.eval_cpu_sum_s, p.eval_compute_sum_s),
                     cores) / compute_speedup
        ev += tier.seconds(p.eval_hops or 0, p.eval_crit_bytes or 0)
        t = compute + comm + ev
        cum += t
        out.append(Projected(epoch=p.epoch, compute_s=compute, comm_s=comm, eval_s=ev,
                             time_s=t, cum_s=cum, test_acc=p.test_acc))
    return out


def time_to_accuracy(curve: Curve | Mapping[str, Any] | Sequence[Any], tier: Tier,
                     target: float, cores: Optional[int] = None,
                     compute_speedup: float = 1.0) -> Optional[Projected]:
    """The projected epoch at which test accuracy first reaches ``target`` (``cum_s``: the
    time through the end of that epoch), or ``None`` if it never does."""
    for p in project(curve, tier, cores, compute_speedup):
        if p.test_acc is not None and p.test_acc >= target:
            return p
    return None


def measured_epoch_s(curve: Curve | Mapping[str, Any] | Sequence[Any]) -> Optional[float]:
    """Measured wall seconds of training per epoch-equivalent, evaluation left out, over the
    epochs after the first (its warm-up); None without epochs."""
    eps = Curve.of(curve).epochs
    rows = eps[1:] or eps
    work = curve_work(rows)
    return sum(p.wall_s - (p.eval_s or 0.0) for p in rows) / work if rows and work else None


def cumulative_to_accuracy(curve: Curve | Mapping[str, Any] | Sequence[Any], target: float,
                           amount: Callable[[Point], float]) -> Optional[float]:
    """The sum of ``amount`` over the epochs through the first whose evaluation reached
    ``target``, or None if none did (the advisor's work, a measured run's seconds)."""
    total = 0.0
    for p in Curve.of(curve).epochs:
        total += amount(p)
        if p.test_acc is not None and p.test_acc >= target:
            return total
    return None


def measured_time_to_accuracy(curve: Curve | Mapping[str, Any] | Sequence[Any],
                              target: float) -> Optional[float]:
    """Measured wall seconds through the epoch whose evaluation first reached ``target``
    (evaluations included, as :func:`time_to_accuracy` counts them), or None."""
    return cumulative_to_accuracy(curve, target, lambda p: p.wall_s)
