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
  spend. Ranks that share fewer cores than there are ranks (emulated hosts on one machine)
  are projected with ``cores``: a phase then takes at least the ranks' total CPU seconds over
  the cores.

What it gives up: no overlap of compute and communication (an upper bound for strategies that
overlap), no congestion between concurrent pairs beyond the per-rank link, no packet loss.
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

from typing import Any, Iterable, Mapping, Optional, Sequence

from ..comm.network import Tier

__all__ = ["epoch_curve", "curve_work", "project", "time_to_accuracy", "TRAIN_PHASES"]

#: phases whose rounds are charged to training time
TRAIN_PHASES = ("train", "data")


# ---------------------------------------------------------------------- per-epoch summary
def _merge_rounds(records: Iterable[Mapping[str, Any]],
                  phases: Sequence[str]) -> tuple[float, float, int]:
    """(sum of hops, sum of slowest-rank bytes, rounds) over the rounds of one epoch of all
    ranks. ``records``: that epoch's record of each rank."""
    per_round: dict[int, list[float]] = {}   # round -> [hops, max bytes]
    for rec in records:
        for rnd, _kind, phase, sent, recv, hops, *_ in rec.get("rounds") or []:
            if phase not in phases:
                continue
            cur = per_round.setdefault(int(rnd), [0.0, 0.0])
            cur[0] = max(cur[0], float(hops))
            cur[1] = max(cur[1], float(sent), float(recv))
    hops = sum(v[0] for v in per_round.values())
    crit = sum(v[1] for v in per_round.values())
    return hops, crit, len(per_round)


def _phase_bytes(rec: Mapping[str, Any], phase: str) -> int:
    return int((rec.get("bytes") or {}).get(phase, {}).get("sent", 0))


def epoch_curve(metrics: Mapping[int, Sequence[Mapping[str, Any]]],
                phases: Sequence[str] = TRAIN_PHASES) -> dict[str, Any]:
    """Summarise a run's per-rank metrics (``read_metrics(run_dir)``) for projection.

    Returns ``{"setup": {...}, "epochs": [row, ...]}`` with one row per epoch that every rank
    recorded::

        epoch, work (epoch-equivalents, ``EpochResult.work``), compute_s (max over ranks),
        compute_sum_s / eval_compute_sum_s (summed over ranks: what ranks sharing cores need),
        cpu_sum_s / eval_cpu_sum_s (every thread's CPU, summed over ranks; None if not kept),
        hops, crit_bytes, rounds (counted rounds), eval_hops / eval_crit_bytes / eval_compute_s
        (the epoch's evaluation, if any),
        train_bytes / data_bytes / eval_bytes (sent, summed over ranks),
        wall_s / comm_s / eval_s (max over ranks, measured), test_acc / val_acc / train_acc
        (None on epochs without evaluation), peak_rss_mb (max over ranks)
    """
    if not metrics:
        raise ValueError("no metrics to project: the run directory has no metrics/rank-*.jsonl "
                         "files (did the run start?)")
    by_epoch: dict[int, dict[int, Mapping[str, Any]]] = {}
    for rank, recs in metrics.items():
        for rec in recs:
            # a resumed run appends: the last record of an epoch wins
            by_epoch.setdefault(int(rec["epoch"]), {})[int(rank)] = rec
    ranks = set(metrics)
    setup = by_epoch.pop(-1, {})
    s_hops, s_bytes, s_rounds = _merge_rounds(setup.values(), ("setup",))
    rows = []
    for ep in sorted(by_epoch):
        recs = by_epoch[ep]
        if set(recs) != ranks:
            continue  # torn: not every rank finished this epoch
        hops, crit, n = _merge_rounds(recs.values(), phases)
        e_hops, e_crit, _ = _merge_rounds(recs.values(), ("eval",))
        r0 = recs[min(recs)]
        rows.append({
            "epoch": ep, "work": float(r0.get("work", 1.0)),
            "compute_s": max(float(r.get("compute_s") or 0.0) for r in recs.values()),
            "compute_sum_s": sum(float(r.get("compute_s") or 0.0) for r in recs.values()),
            # every thread's CPU (communication's copies and framing included): what ranks
            # sharing cores take from each other; None for records written before it was kept
            "cpu_sum_s": _total(recs.values(), "cpu_s"),
            "hops": hops, "crit_bytes": crit, "rounds": n,
            "eval_hops": e_hops, "eval_crit_bytes": e_crit,
            "eval_compute_s": max(float(r.get("eval_compute_s") or 0.0) for r in recs.values()),
            "eval_compute_sum_s": sum(float(r.get("eval_compute_s") or 0.0)
                                      for r in recs.values()),
            "eval_cpu_sum_s": _total(recs.values(), "eval_cpu_s"),
            "train_bytes": sum(_phase_bytes(r, "train") for r in recs.values()),
            "data_bytes": sum(_phase_bytes(r, "data") for r in recs.values()),
            "eval_bytes": sum(_phase_bytes(r, "eval") for r in recs.values()),
            "wall_s": max(float(r.get("wall_s") or 0.0) for r in recs.values()),
            "comm_s": max(float(r.get("comm_s") or 0.0) for r in recs.values()),
            "eval_s": max(float(r.get("eval_s") or 0.0) for r in recs.values()),
            "test_acc": r0.get("test_acc"), "val_acc": r0.get("val_acc"),
            "train_acc": r0.get("train_acc"),
            "peak_rss_mb": max(float(r.get("peak_rss_mb") or 0.0) for r in recs.values()),
        })
    return {"setup": {"hops": s_hops, "crit_bytes": s_bytes, "rounds": s_rounds,
                      "bytes": sum(_phase_bytes(r, "setup") for r in setup.values())},
            "ranks": len(ranks), "phases": list(phases), "epochs": rows}


def curve_work(epochs: Sequence[Mapping[str, Any]]) -> float:
    """Epoch-equivalents of work in a curve's epochs (``EpochResult.work``; 1 per epoch for
    results written before it was recorded): the divisor of every per-epoch figure."""
    w = sum(float(e.get("work", 1.0)) for e in epochs)
    return w if w > 0 else float(len(epochs))


def _total(recs: Iterable[Mapping[str, Any]], key: str) -> Optional[float]:
    vals = [r.get(key) for r in recs]
    return None if any(v is None for v in vals) else sum(float(v) for v in vals)


def _first(row: Mapping[str, Any], *keys: str) -> Optional[float]:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _shared(slowest: float, total: Optional[float], cores: Optional[int]) -> float:
    """Wall seconds of a compute phase: the slowest rank's CPU seconds on hosts with a core
    each; with the ranks sharing ``cores`` cores (processor sharing: a work-conserving
    scheduler), no less than the ranks' total CPU seconds spread over the cores either: all
    of a process's threads (``cpu_sum_s``: communication's copies and framing take cores
    too), or the compute alone for older records."""
    if not cores or total is None:
        return slowest
    return max(slowest, total / cores)


def project(curve: Mapping[str, Any], tier: Tier,
            cores: Optional[int] = None) -> list[dict[str, float]]:
    """Per epoch on ``tier``: ``{"epoch", "compute_s", "comm_s", "eval_s", "time_s", "cum_s",
    "test_acc"}``: ``comm_s`` of training, ``eval_s`` the evaluation's compute and
    communication, ``time_s`` all three; ``cum_s`` is the cumulative projected time.
    ``cores``: the ranks share that many cores (e.g. emulated hosts on one machine) instead
    of having one each."""
    out, cum = [], 0.0
    for row in curve["epochs"]:
        comm = tier.seconds(row["hops"], row["crit_bytes"])
        compute = _shared(row["compute_s"], _first(row, "cpu_sum_s", "compute_sum_s"), cores)
        ev = _shared(float(row.get("eval_compute_s") or 0.0),
                     _first(row, "eval_cpu_sum_s", "eval_compute_sum_s"), cores)
        ev += tier.seconds(row.get("eval_hops", 0), row.get("eval_crit_bytes", 0))
        t = compute + comm + ev
        cum += t
        out.append({"epoch": row["epoch"], "compute_s": compute, "comm_s": comm,
                    "eval_s": ev, "time_s": t, "cum_s": cum, "test_acc": row.get("test_acc")})
    return out


def time_to_accuracy(curve: Mapping[str, Any], tier: Tier, target: float,
                     cores: Optional[int] = None) -> Optional[dict[str, float]]:
    """Projected seconds until test accuracy first reaches ``target`` (cumulative time through
    the end of that epoch), or ``None`` if it never does."""
    for p in project(curve, tier, cores):
        acc = p["test_acc"]
        if acc is not None and acc >= target:
            return {"seconds": p["cum_s"], "epoch": p["epoch"]}
    return None
