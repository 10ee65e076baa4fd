"""The prior of ``quietgnn advise`` (step 2 of :mod:`quietgnn.analysis.advise`): from finished
``quietgnn bench`` runs, how many optimizer updates each strategy needs relative to
``centralized`` on the same graph, how often it got there, and its accuracy gap.

Work is counted in updates, not epochs: ``centralized`` and the full-batch strategies take
one gradient step per pass over the training set, ``minibatch`` one per batch, so the number
of its steps in an epoch grows with the graph's training set (one on a graph with fewer
training nodes per part than a batch, several on a larger one). A ratio of epochs learned
where an epoch is one step would not carry over to a graph where it is five."""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..matrix import Result
from ..projection import Curve, cumulative_to_accuracy

#: the target: this fraction of ``centralized``'s test accuracy (as ``quietgnn report``)
TARGET_FRAC = 0.98


def _work_to_target(curve: Curve | Mapping[str, Any], target: float) -> Optional[float]:
    return cumulative_to_accuracy(curve, target, lambda p: p.passes)


def build_prior(results: Iterable[Result | Mapping[str, Any]], *, exclude: Sequence[str] = (),
                target_frac: float = TARGET_FRAC,
                updates: Optional[dict[str, dict[str, int]]] = None) -> dict[str, Any]:
    """Updates-to-target ratios (to ``centralized``'s on the same graph and model), reach
    rates and accuracy gaps per strategy from finished
    ``quietgnn bench`` results (one seed or more per dataset x model; datasets in
    ``exclude`` left out: the validation holds each dataset out of its own prior).
    ``updates[dataset][strategy]``: optimizer updates per epoch-equivalent of that strategy's
    runs on that dataset (:func:`quietgnn.analysis.advise.updates_per_pass`); 1 where not given."""
    updates = updates or {}
    groups: dict[tuple[str, str], dict[str, list[Result]]] = {}
    for r in map(Result.from_json, results):
        if not r.ok or not r.curve or r.dataset in exclude:
            continue
        groups.setdefault((r.dataset, r.model), {}).setdefault(r.name, []).append(r)
    ratios: dict[str, list[float]] = {}
    # (graph, centralized's work, the strategy's)
    pairs: dict[str, list[tuple[str, float, float]]] = {}
    reached: dict[str, list[int]] = {}
    # runs not at the target after centralized's work: (how near, got there later, work ratio)
    late: list[list[Any]] = []
    gaps: dict[str, list[float]] = {}
    ref_work: list[float] = []
    cells = []
    for (ds, model), by in groups.items():
        if "centralized" not in by:
            continue
        ref = statistics.mean(r.summary.test_acc for r in by["centralized"])
        target = target_frac * ref
        w_c = [w for w in (_work_to_target(r.curve, target) for r in by["centralized"]) if w]
        if not w_c:
            continue
        w_ref = statistics.mean(w_c)
        ref_work.append(w_ref)
        cells.append(f"{ds}/{model}")
        for s, runs in by.items():
            if s == "centralized":
                continue
            for r in runs:
                w = _work_to_target(r.curve, target)
                if w is not None:
                    w *= float((updates.get(ds) or {}).get(s, 1))
                reached.setdefault(s, []).append(int(w is not None))
                gaps.setdefault(s, []).append(100.0 * (r.summary.test_acc - ref))
                if w is not None:
                    ratios.setdefault(s, []).append(w / w_ref)
                    pairs.setdefault(s, []).append((ds, w_ref, w))
                near = near_target(r.curve, target, w_ref, float((updates.get(ds) or {})
                                                                 .get(s, 1)))
                if near is not None and (w is None or w > w_ref):
                    late.append([round(near, 4), int(w is not None),
                                 round(w / w_ref, 4) if w is not None else None, s, ds])
    strategies = {}
    for s in reached:
        rs = ratios.get(s, [])
        strategies[s] = {
            # geometric mean: a ratio of 2 and one of 1/2 should average to 1
            "epochs_ratio": math.exp(statistics.mean(math.log(x) for x in rs)) if rs else None,
            "reach": sum(reached[s]) / len(reached[s]),
            "gap_pp": statistics.mean(gaps[s]), "worst_gap_pp": min(gaps[s]),
            "cells": len(reached[s]),
            "fit": _choose_fit(pairs.get(s, []), work_shapes(s))}
    return {"target_frac": target_frac, "cells": sorted(cells), "work_unit": "updates",
            "updates_per_epoch": {ds: dict(u) for ds, u in sorted(updates.items())
                                  if ds not in exclude},
            # the fallback where the probe could not run `centralized` (a prepared graph)
            "reference_epochs_to_target": statistics.median(ref_work) if ref_work else None,
            "late": sorted(late, key=lambda x: (x[0], x[3], x[4])),
            "strategies": strategies}


def near_target(curve: Curve | Mapping[str, Any], target: float, ref_updates: float,
                updates_per_epoch: float = 1.0) -> Optional[float]:
    """The best test accuracy a run had evaluated by the time it had taken ``ref_updates``
    optimizer updates (``centralized``'s work to the target on the graph; the run's first
    evaluation at or after that point counts, runs evaluated every few epochs), as a fraction
    of ``target``; None without an evaluation."""
    done, best = 0.0, None
    for p in Curve.of(curve).epochs:
        done += p.passes * updates_per_epoch
        if p.test_acc is not None:
            best = max(best or 0.0, p.test_acc)
            if done >= ref_updates - 1e-9:
                break
    return None if best is None else best / target


def late_odds(prior: Mapping[str, Any], near: float) -> tuple[float, Optional[float]]:
    """What the borrowed runs say of a run that had not reached the target after the work
    ``centralized`` needed, being ``near`` (a fraction of the target) then: the chance it
    gets there in the end, by a logistic fit of the borrowed late runs' outcome on their
    nearness (pooled over strategies: each has too few late runs of its own; a run far short
    then seldom got there, one just short often did), and the geometric mean of their work
    over ``centralized``'s where they got there (None if none did). The prior's ``late``
    rows: (near, got there, work ratio, strategy, graph). Without late rows: an even chance."""
    rows = [(float(r[0]), int(r[1])) for r in prior.get("late") or ()]
    got = [float(r[2]) for r in prior.get("late") or () if r[1] and r[2]]
    ratio = math.exp(statistics.mean(math.log(x) for x in got)) if got else None
    if not rows or len({y for _, y in rows}) < 2:
        return (statistics.mean(y for _, y in rows) if rows else 0.5), ratio
    a, b = _logistic(rows)
    return 1.0 / (1.0 + math.exp(-(a + b * near))), ratio


def _logistic(rows: Sequence[tuple[float, int]], ridge: float = 1e-2) -> tuple[float, float]:
    """Maximum likelihood ``P(y = 1) = 1 / (1 + exp(-(a + b x)))`` by Newton's method, with a
    small ridge on ``b`` (late runs that split cleanly by nearness would send it to
    infinity); ``x`` centred for the conditioning."""
    mx = statistics.mean(x for x, _ in rows)
    a = b = 0.0
    for _ in range(50):
        ga, gb, haa, hab, hbb = 0.0, -ridge * b, 0.0, 0.0, ridge
        for x, y in rows:
            z = x - mx
            p = 1.0 / (1.0 + math.exp(-(a + b * z)))
            w = p * (1.0 - p)
            ga += y - p
            gb += (y - p) * z
            haa += w
            hab += w * z
            hbb += w * z * z
        det = haa * hbb - hab * hab
        if det <= 1e-15:
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) + abs(db) < 1e-10:
            break
    return a - b * mx, b


def _fit(pairs: Sequence[tuple[float, float]], kind: str) -> Optional[dict[str, Any]]:
    """Least squares in log space of the strategy's work on centralized's: ``work = exp(a) *
    ref ** b`` with b = 1 (``ratio``: a constant multiple), b = 0 (``constant``: the same
    work whatever the graph's pace; ``tma`` needs a few averaging periods), or b fitted
    (``power``; None below three runs or without spread, b kept in [0, 2]: a pace that falls
    as centralized's rises is noise)."""
    if not pairs:
        return None
    xs = [math.log(x) for x, _ in pairs]
    ys = [math.log(y) for _, y in pairs]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    if kind == "power":
        sxx = sum((x - mx) ** 2 for x in xs)
        if len(pairs) < 3 or sxx < 1e-9:
            return None
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        b = min(max(b, 0.0), 2.0)
    else:
        b = 1.0 if kind == "ratio" else 0.0
    return {"a": my - b * mx, "b": b, "kind": kind}


#: the shapes :func:`_choose_fit` picks from, simplest first (a tie keeps the simpler)
_FITS = ("ratio", "constant", "power")


def work_shapes(strategy: str) -> tuple[str, ...]:
    """The shapes ``strategy``'s work may take. A gradient method on ``centralized``'s model
    (compressed, stale, sampled or partial gradients) needs a multiple of its steps: the
    ratio alone. A strategy paced by its own schedule (:attr:`Strategy.own_schedule`: rounds
    of averaging, layers trained in turn) may need about the same work on every graph, or
    grow slower than ``centralized``'s: every shape of :data:`_FITS`, as the held-out graphs
    choose. Four graphs are too few to tell the shapes apart for a gradient method: where it
    happened to need a few steps on three of them, a constant (or a power law through them)
    fitted, and a graph on which ``centralized`` needs ten times more broke it."""
    from ...strategies import get_strategy
    try:
        own = get_strategy(strategy).own_schedule
    except ValueError:      # a label of no registered strategy
        own = False
    return _FITS if own else ("ratio",)


def _choose_fit(pairs: Sequence[tuple[str, float, float]],
                shapes: Sequence[str] = _FITS) -> Optional[dict[str, Any]]:
    """The shape of a strategy's work against centralized's that best predicts a graph it
    was not fitted on: each of ``shapes`` (:data:`_FITS`, or :func:`work_shapes`) is fitted
    on all graphs but one and scored
    (squared log error) on the one left out, in turn. Four graphs cannot pin a power law
    down (fitted on paces 6 to 40 it extrapolates to 150 badly), so the more flexible shape
    has to earn its place on graphs it has not seen. Below three graphs nothing can earn it
    (a power law or a constant through two graphs is fitted, never tested): the ratio, the
    shape that assumes least (the same model and optimizer need work in proportion to what
    ``centralized`` needs on the graph)."""
    graphs = sorted({g for g, _, _ in pairs})
    xy = [(x, y) for _, x, y in pairs]
    if len(graphs) < 3:
        return _fit(xy, "ratio")
    best, best_err = None, float("inf")
    for kind in shapes:
        err = 0.0
        for g in graphs:
            f = _fit([(x, y) for gg, x, y in pairs if gg != g], kind)
            if f is None:
                err = float("inf")
                break
            err += sum((math.log(y) - f["a"] - f["b"] * math.log(x)) ** 2
                       for gg, x, y in pairs if gg == g)
        if err < best_err - 1e-12:
            best, best_err = kind, err
    return _fit(xy, best) if best else _fit(xy, "ratio")


def _work_needed(p: dict[str, Any], ref_work: float) -> float:
    """Updates the strategy is expected to need where ``centralized`` needs ``ref_work``
    (one per epoch): the chosen fit (:func:`_choose_fit`) where there is one, else the mean
    ratio."""
    f = p.get("fit")
    if f:
        return math.exp(f["a"]) * ref_work ** f["b"]
    return ref_work * p["epochs_ratio"]
