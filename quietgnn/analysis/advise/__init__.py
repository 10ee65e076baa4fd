"""``quietgnn advise``: which strategy for this graph, model, number of parts and network.

Three steps, each one a plain function so the validation (``benchmarks/bench_advise.py``)
can reuse them:

1. :func:`probe` *measures* what is cheap to measure: the partition statistics of each
   strategy's partitioner, the model's size, and a few epochs of every candidate strategy on
   the real partitions (through ``quietgnn bench``'s runner, so the bytes are the counted
   ones and the compute is one thread per rank, as in every other figure), and how many
   epochs ``centralized`` (one process) needs to reach 98 % of its own accuracy here.
2. :func:`build_prior` turns quietgnn's own measured runs (the headline study: every
   strategy trained to the end on real graphs) into what a few epochs cannot show: how many
   optimizer updates a strategy needs as a function of what ``centralized`` needs on the
   same graph (a ratio, a constant or a power law: whichever predicts a left-out graph
   best), how often it got there at all, and its accuracy gap (:mod:`quietgnn.analysis.advise.fit`).
   The shipped table is :mod:`quietgnn.analysis.advise.prior` (``bench_advise.py --write-prior``).
3. :func:`rank` projects each strategy's epoch time on the tier (compute + hops x latency +
   slowest rank's bytes / bandwidth, less what an exchange waited for late hides behind the
   compute, as ``quietgnn report`` does), multiplies by the epochs
   it needs given ``centralized``'s here (the updates it needs over its updates per epoch on
   this graph's parts: :func:`updates_per_pass`; at most the probe's epochs where its probe
   already reached the target; where it was run on for ``centralized``'s work and was still
   short, what the borrowed runs as far short then went on to need, and how often they got
   there at all: :func:`~quietgnn.analysis.advise.fit.late_odds`), adds what is sent once and
   what recurs every few epochs (once per period crossed), divides by its chance of reaching
   the target, and sorts.

The prediction is only as good as its parts: the costs and ``centralized``'s pace are
measured on the user's graph, the strategies' ratios are borrowed from other graphs;
``accuracy_risk`` says how much the latter can be trusted.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from .fit import (TARGET_FRAC, _work_needed, _work_to_target, build_prior, late_odds,
                  near_target)
from .probe import _names, _parts_of, _per_work, plan_extension
from .phases import PHASED, PROBE_PHASE, phase_costs, phased_seconds
from ..projection import hidden_s
from ...comm.network import TIERS, Tier, parse_tier

__all__ = ["advise", "probe", "rank", "build_prior", "CANDIDATES", "BASELINES"]

#: strategies the advisor compares by default (``centralized`` is the single-machine
#: reference): the seed methods and ``halo``
CANDIDATES = ("halo", "adaqp", "grappa", "tma", "retexo", "minibatch")
#: the seeds' baselines, compared too with ``--strategies all``: the borrowed table has them
#: and predicts them well, but ten candidates are often closer to each other than the
#: prediction's error, so the first choice is right less often (docs/guide/advise.md)
BASELINES = ("bns", "pipegcn", "sancus", "llcg")

# Per strategy, how one probe epoch is made comparable with the headline runs the prior
# comes from: tma averages every 25 local passes, so it runs 50 (two averages, each
# evaluated); grappa runs 4 so that one repartitioning (below) falls between two plain
# epochs, llcg 5 so that two averages (below) do; the others run 3 epochs and the first
# (warm-up: lazy setup, allocator) is left out of the per-epoch figures.
_PROBE_EPOCHS = {"tma": 50, "grappa": 4, "llcg": 5}
_PROBE_EVAL_EVERY = {"tma": 25}
_DEFAULT_PROBE_EPOCHS = 3
#: work a strategy repeats every few epochs, by the option that sets the period in epochs
#: (grappa reloads a chunk every ``repart_every`` epochs, llcg averages and corrects every
#: ``period``). A few probe epochs at the real period (50, 15 by default) never see it, and
#: charging it once would undercount a run that needs several periods: the probe runs the
#: option at ``_PROBE_PERIOD`` instead, so epoch ``_PROBE_PERIOD`` (grappa's reload, at an
#: epoch's start) or ``_PROBE_PERIOD - 1`` (llcg's average, at its end: offset 1) holds one
#: repetition, and :func:`rank` charges it once per period of the real run.
_PERIODIC = {"grappa": "repart_every", "llcg": "period"}
_PERIOD_OFFSET = {"llcg": 1}
_PROBE_PERIOD = 2
#: epochs of ``centralized`` the probe runs to see how fast this graph is learned
REFERENCE_EPOCHS = 200


def _tier(spec: str | Tier) -> Tier:
    if isinstance(spec, Tier):
        return spec
    if spec in TIERS:
        return TIERS[spec]
    if ":" in str(spec):
        return parse_tier(str(spec))
    raise ValueError(f"tier {spec!r}: expected one of {sorted(TIERS)} or NAME:BANDWIDTH:LATENCY "
                     f"(e.g. site:200M:15ms)")


# ---------------------------------------------------------------------- 1. measure
def _graph_and_partitions(dataset: str, root: Optional[str], prepared: Optional[str],
                          parts: int, strategies: Sequence[str],
                          set_: dict[str, Any]) -> tuple[dict, dict]:
    """The graph's size, and edge cut / halo / replication and training nodes per part of
    each strategy's default partitioner (of the directory's partition for a prepared graph:
    nothing is loaded but the parts' training masks)."""
    import numpy as np
    import torch

    from ...strategies import get_strategy
    if prepared:
        from ...partition import PartitionBook
        book = PartitionBook.open(prepared)
        g = book.graph
        info = {"name": g.get("name"), "nodes": g.get("num_nodes"), "edges": g.get("num_edges"),
                "features": g.get("num_features"), "classes": g.get("num_classes"),
                "parts": book.num_parts}
        st = dict(book.stats)
        try:
            st["train_per_part"] = [int(np.asarray(book.mapped(f"part-{r}/train_mask.npy")).sum())
                                    for r in range(book.num_parts)]
        except (ValueError, OSError):
            pass   # an older book: the updates per pass are then taken as 1
        return info, {book.method: st}
    from ...datasets import load_dataset
    from ...partition.local import partition_stats
    from ...partition.partitioners import partition_nodes
    graph = load_dataset(dataset, root, synthetic={k.split(".", 1)[1]: v for k, v in set_.items()
                                                   if k.startswith("synthetic.")})
    out: dict[str, Any] = {}
    for method in sorted({get_strategy(s).default_partitioner for s in strategies}):
        if method == "given":
            continue
        assign = partition_nodes(graph, method, parts)
        st = partition_stats(graph, assign)
        out[method] = {k: st[k] for k in ("edge_cut_fraction", "halo_total",
                                          "replication_factor", "balance")}
        if graph.train_mask is not None:
            a = torch.as_tensor(np.asarray(assign))[graph.train_mask]
            out[method]["train_per_part"] = torch.bincount(a, minlength=parts).tolist()
    info = {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
            "features": graph.num_features, "classes": graph.num_classes}
    return info, out


def updates_per_pass(strategy: str, partitions: dict[str, Any]) -> int:
    """Optimizer updates in one epoch-equivalent of ``strategy`` with its default options on
    its default partitioner's parts (``partitions``: :func:`probe`'s); 1 where the training
    nodes per part are unknown (see :meth:`Strategy.updates_per_pass`)."""
    from ...strategies import get_strategy
    cls = get_strategy(strategy)
    counts = (partitions.get(cls.default_partitioner) or {}).get("train_per_part")
    if not counts and len(partitions) == 1:   # a prepared graph: its one partition
        counts = next(iter(partitions.values())).get("train_per_part")
    return int(cls.updates_per_pass(cls.Options(), list(counts))) if counts else 1


def _parameters(model: str, info: dict[str, Any], set_: dict[str, Any]) -> Optional[int]:
    from ...nn.model import ModelConfig, build_model
    keys = {k.split(".", 1)[1]: v for k, v in set_.items() if k.startswith("model.")}
    if not info.get("features") or not info.get("classes"):
        return None
    net = build_model(ModelConfig(arch=model, **keys), int(info["features"]),
                      int(info["classes"]), seed=0)
    return sum(p.numel() for p in net.parameters())


def _layers(model: str, set_: dict[str, Any]) -> int:
    from ...nn.model import ModelConfig
    keys = {k.split(".", 1)[1]: v for k, v in set_.items() if k.startswith("model.")}
    return int(ModelConfig(arch=model, **keys).layers)


def _exact() -> set[str]:
    """Strategies that claim equality with ``centralized`` (they need what it needed)."""
    from ...strategies import available_strategies, get_strategy
    return {s for s in available_strategies() if get_strategy(s).exact}


def _near(m: dict[str, Any], curve: Any, target: float, ref_work: float) -> None:
    """Where a probe (or its extension) ran at least ``centralized``'s work (``ref_work``
    updates) and was still short of ``target``: how near it was then (``near``, a fraction of
    the target) and its epochs (``near_at``), for :func:`rank`. A shorter run says nothing
    here: the borrowed runs' nearness is measured at that work."""
    from ..projection import Curve
    c = Curve.of(curve)
    upe = float(m.get("updates_per_epoch") or 1)
    done = sum(p.passes for p in c.epochs)
    if m.get("reached_at") is None and c.epochs and done * upe >= ref_work - 1e-9:
        m["near"], m["near_at"] = near_target(c, target, ref_work, upe), done


def _real_schedule(strategy: str, options: dict[str, Any], layers: int,
                   run_epochs: int) -> dict[str, Any]:
    """A probe's options for its extension: a phased strategy's phases as long as in the
    real run of ``run_epochs`` (so its first epochs are the real run's first epochs: all in
    ``retexo``'s first layer), every other strategy's as probed."""
    if strategy not in PHASED:
        return options
    from ...strategies import get_strategy
    sched = get_strategy(strategy).Options().schedule(layers, run_epochs)
    return {**options, PHASED[strategy]: sched}


def _real_period(strategy: str, option: str) -> int:
    """The period in epochs the user's run would have: the strategy's default (``advise``
    passes no strategy options)."""
    from ...strategies import get_strategy
    return int(getattr(get_strategy(strategy).Options(), option))


def probe(dataset: str = "synthetic", *, root: Optional[str] = None,
          prepared: Optional[str] = None, parts: Optional[int] = None, model: str = "gcn",
          strategies: Sequence[str] = CANDIDATES, out: Optional[str | Path] = None,
          set_: Optional[dict[str, Any]] = None, timeout_s: float = 600.0,
          reference_epochs: int = REFERENCE_EPOCHS, log: Any = None,
          run_epochs: Optional[int] = None, extend: bool = True) -> dict[str, Any]:
    """Measure every strategy of ``strategies`` for a few epochs, and how many epochs
    ``centralized`` needs on this graph (``reference_epochs`` of it, one process; skipped for
    a prepared graph, which may not fit one process, and with 0); ``run_epochs``: the
    ``train.epochs`` of the run being planned (default: ``set_``'s, else the trainer's
    default), which sets a phased strategy's schedule (:mod:`quietgnn.analysis.advise.phases`);
    ``extend``: run the extension where ``centralized`` ran (:mod:`quietgnn.analysis.advise.probe`);
    returns ``{"graph",
    "partitions", "model", "reference_epochs", "strategies": {name: costs or error}}``."""
    from ..matrix import RunSpec
    from ..runner import run_matrix
    from ...strategies import available_strategies
    known = set(available_strategies())
    strategies = _names(strategies)
    parts = _parts_of(prepared, parts)
    bad = [s for s in strategies if s not in known or s == "centralized"]
    if bad:
        raise ValueError(f"strategies {bad}: expected some of {sorted(known - {'centralized'})}")
    if not isinstance(parts, int) or parts < 2:
        raise ValueError(f"parts = {parts!r}; expected an int >= 2 (with one part there is "
                         f"nothing to advise: train `centralized`)")
    common = dict(set_ or {})
    info, stats = _graph_and_partitions(dataset, root, prepared, parts, strategies, common)
    params = _parameters(model, info, common)
    if prepared:
        # the directory names its graph and its parts
        common["dataset.prepared"] = str(prepared)
        dataset, parts = str(info["name"]), int(info["parts"])
    layers = _layers(model, common)
    if run_epochs is None:
        from ...strategies.base import TrainConfig
        run_epochs = int(common.get("train.epochs", TrainConfig().epochs))
    specs = []
    for s in strategies:
        k = _PROBE_EPOCHS.get(s, _DEFAULT_PROBE_EPOCHS)
        opts = {_PERIODIC[s]: _PROBE_PERIOD} if s in _PERIODIC else {}
        if s in PHASED:
            k, opts = PROBE_PHASE * layers, {PHASED[s]: PROBE_PHASE}
        # exactly: each rank's own-graph accuracy (eval_mode local) is not the exact target's
        specs.append(RunSpec(dataset=dataset, strategy=s, parts=parts, model=model, seed=0,
                             root=root, options=opts,
                             overrides={**common, "train.epochs": k,
                                        "train.eval_every": _PROBE_EVAL_EVERY.get(s, k),
                                        "train.eval_mode": "exact"}))
    ref_spec = None
    if not prepared and reference_epochs > 0:
        ref_spec = RunSpec(dataset=dataset, strategy="centralized", parts=1, model=model,
                           seed=0, root=root, overrides={**common,
                                                         "train.epochs": reference_epochs,
                                                         "train.eval_every": 1,
                                                         "train.eval_mode": "exact"})
        specs.append(ref_spec)
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="quietgnn-advise-")
        out = tmp.name
    try:
        results = run_matrix(specs, out, timeout_s=timeout_s, log=log or (lambda m: None))
        return _measure(specs, results, ref_spec, info, stats, parts, model, params, layers,
                        run_epochs, out, timeout_s, log, extend)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _measure(specs, results, ref_spec, info, stats, parts, model, params, layers, run_epochs,
             out, timeout_s, log, extend) -> dict[str, Any]:
    """The probe's figures from its runs, extended (:mod:`quietgnn.analysis.advise.probe`) where
    ``centralized`` ran."""
    from ..runner import run_matrix
    measured: dict[str, Any] = {}
    ref_work = ref_compute = target = ref_cost = ref_acc = None
    curves = {}
    for spec, res in zip(specs, results):
        if spec is ref_spec:
            if res.ok and res.curve:
                ref_acc = res.summary.test_acc
                target = TARGET_FRAC * ref_acc
                ref_work = _work_to_target(res.curve, target)
                # the machine's pace at probe time: the same run elsewhere says how much
                # faster or slower that machine (or its load then) is than this one now
                eps = res.curve.epochs
                ref_compute = statistics.median(p.compute_s / (p.passes or 1.0)
                                                for p in eps[1:] or eps)
                ref_cost = sum(p.compute_s for p in eps)
            continue
        if not res.ok or not res.curve:
            err = (res.error or res.curve_error or "no result").strip()
            measured[spec.strategy] = {"error": err.splitlines()[0][:300]}
            continue
        period = _PROBE_PERIOD if spec.strategy in _PERIODIC else 0
        m = _per_work(res.curve, period, _PERIOD_OFFSET.get(spec.strategy, 0)) or \
            {"error": "no complete epoch"}
        if "periodic" in m:
            m["periodic"]["every"] = _real_period(spec.strategy, _PERIODIC[spec.strategy])
        setup = res.curve.setup
        m["setup"] = {"hops": float(setup.hops if setup else 0),
                      "crit_bytes": float(setup.crit_bytes if setup else 0)}
        m["partitioner"] = res.summary.partitioner
        m["updates_per_epoch"] = updates_per_pass(spec.strategy, stats)
        if spec.strategy in PHASED:
            from ...strategies import get_strategy
            sched = get_strategy(spec.strategy).Options().schedule(layers, run_epochs)
            m["phases"] = phase_costs(res.curve, layers, sched)
        measured[spec.strategy] = m
        curves[spec.strategy] = res.curve
    if target is not None:
        # a probe that already reached the target measured an upper bound of the work on
        # this graph (its one evaluation is at its last epoch); not one probed at another
        # schedule than the real run's (a phased or periodic strategy's)
        for s, curve in curves.items():
            if s not in PHASED and s not in _PERIODIC:
                measured[s]["reached_at"] = _work_to_target(curve, target)
                _near(measured[s], curve, target, ref_work)
        # (a phased probe's epochs are another schedule's: they count for nothing here)
        ext = plan_extension(measured, ref_work, ref_cost, parts,
                             {sp.strategy: 0 if sp.strategy in PHASED
                              else int(sp.overrides["train.epochs"])
                              for sp in specs if sp is not ref_spec},
                             skip=set(_PERIODIC) | _exact()) \
            if extend and ref_work and ref_cost else {}
        runs = [(s, dataclasses.replace(sp, options=_real_schedule(s, sp.options, layers,
                                                                    run_epochs),
                                        overrides={**sp.overrides, "train.epochs": k,
                                                   "train.eval_every": 1}))
                for s, k in ext.items() for sp in specs if sp.strategy == s]
        for (s, sp), res in zip(runs, run_matrix([sp for _, sp in runs], out,
                                                 timeout_s=timeout_s,
                                                 log=log or (lambda m: None))):
            measured[s]["extended_to"] = int(sp.overrides["train.epochs"])
            # the short probe's own figure kept beside (what ``extend=False`` would give)
            measured[s]["probe_reached_at"] = measured[s].get("reached_at")
            if res.ok and res.curve:
                measured[s]["reached_at"] = _work_to_target(res.curve, target)
                _near(measured[s], res.curve, target, ref_work)
    return {"graph": info, "partitions": stats, "parts": parts, "model": model,
            "parameters": params, "reference_epochs": ref_work,
            "reference_compute_s": ref_compute, "reference_acc": ref_acc,
            "target_acc": target, "strategies": measured}


# ---------------------------------------------------------------------- 2. the prior
# build_prior, _work_to_target, _choose_fit, _work_needed: quietgnn/analysis/advise/fit.py


def _periods(work: float, per: Optional[dict[str, Any]]) -> int:
    """Period boundaries a run of ``work`` epochs crosses: the repeated work happens at the
    start of epochs ``every``, ``2 every``, ... (epoch 0's is the set-up, charged there)."""
    if not per or not per.get("every"):
        return 0
    return max(0, math.ceil(work) - 1) // int(per["every"])


def default_prior() -> dict[str, Any]:
    from .prior import PRIOR
    return PRIOR


# ---------------------------------------------------------------------- 3. rank
def _risk(p: Optional[dict[str, Any]]) -> tuple[str, str]:
    if not p:
        return "unknown", "no measured runs of this strategy to borrow epochs from"
    why = (f"reached 98% of centralized in {p['reach']:.0%} of {p['cells']} measured runs, "
           f"mean gap {p['gap_pp']:+.1f} pp (worst {p['worst_gap_pp']:+.1f})")
    if p["reach"] < 0.75 or p["worst_gap_pp"] < -3.0:
        return "high", why
    if p["reach"] < 1.0 or p["gap_pp"] < -1.0:
        return "medium", why
    return "low", why


def rank(measured: dict[str, Any], tier: str | Tier = "wan",
         prior: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Rank the probed strategies by predicted seconds to the target on ``tier``."""
    t = _tier(tier)
    prior = prior or default_prior()
    # epochs-to-target of centralized on this graph as measured by the probe, else the
    # median of the graphs the prior was measured on
    base_work = measured.get("reference_epochs") or prior.get("reference_epochs_to_target") \
        or 100.0
    halo = measured["strategies"].get("halo", {})
    rows = []
    for s, m in measured["strategies"].items():
        p = prior["strategies"].get(s)
        risk, risk_why = _risk(p)
        row: dict[str, Any] = {"strategy": s, "accuracy_risk": risk,
                               "extended_epochs": m.get("extended_to")}
        if "error" in m:
            rows.append({**row, "bytes_per_epoch": None, "epoch_seconds": None,
                         "predicted_seconds_to_target": None,
                         "reason": f"probe failed: {m['error']}"})
            continue
        phases = m.get("phases")
        # a phased strategy's epoch is its first phase's (where a run spends its first
        # epochs), its once-only traffic the first phase's; later phases' at their start
        epoch_s = (phases[0]["compute_s"] + t.seconds(phases[0]["hops"], phases[0]["crit_bytes"])
                   if phases else m["compute_s"] + t.seconds(m["hops"], m["crit_bytes"]))
        if m.get("overlap") and not phases:
            # as quietgnn report projects it: the exchange the compute hides costs nothing
            ov = m["overlap"]
            epoch_s -= hidden_s(t, ov["hops"], ov["crit_bytes"], ov["window_s"], m["compute_s"])
        once = (phases[0]["start"] if phases else m.get("once")) or {"hops": 0.0,
                                                                     "crit_bytes": 0.0}
        setup_s = t.seconds(m["setup"]["hops"] + once["hops"],
                            m["setup"]["crit_bytes"] + once["crit_bytes"])
        per = m.get("periodic")
        per_s = (per["compute_s"] + t.seconds(per["hops"], per["crit_bytes"])) if per else 0.0
        tta = work = None
        if p and p.get("epochs_ratio") and p["reach"] > 0:
            # the prior counts optimizer updates (centralized: one per epoch); a mini-batch
            # epoch here holds several
            work = _work_needed(p, base_work) / float(m.get("updates_per_epoch") or 1)
            # expected time: a strategy that gets there in half the runs costs twice; one
            # whose probe got there here needs at most the probe's work, and does get there
            reach = p["reach"]
            if m.get("reached_at"):
                work, reach = min(work, float(m["reached_at"])), 1.0
            elif m.get("near") is not None:
                # run for centralized's work here and still short of the target: what the
                # borrowed runs as far short then went on to do (fit.late_odds)
                reach, ratio = late_odds(prior, float(m["near"]))
                late = (base_work * ratio / float(m.get("updates_per_epoch") or 1)
                        if ratio else 0.0)
                work = max(work, late, float(m["near_at"]))
            train_s = phased_seconds(phases, work, t.seconds) if phases else work * epoch_s
            tta = (setup_s + train_s + _periods(work, per) * per_s) / reach
        comm_s = epoch_s - (phases[0] if phases else m)["compute_s"]
        vs = (f"{m['bytes'] / halo['bytes']:.2g}x halo's bytes"
              if halo.get("bytes") and s != "halo" else f"{_human(m['bytes'])}/epoch")
        extra = (f" + {_human(once['bytes'])} once" if once.get("bytes") else "")
        if per and per.get("every"):
            extra += f" + {_human(per['bytes'])} every {per['every']} epochs"
        row.update(bytes_per_epoch=m["bytes"], once_bytes=once.get("bytes", 0.0),
                   periodic_bytes=per["bytes"] if per else 0.0,
                   period_epochs=per.get("every") if per else None, epoch_seconds=epoch_s,
                   predicted_seconds_to_target=tta,
                   reason=(f"{vs}{extra}; epoch {epoch_s:.3g}s on {t.name} "
                           f"({100 * comm_s / epoch_s if epoch_s else 0:.0f}% network); "
                           + (f"needs ~{work:.3g} epochs (centralized {base_work:.0f})"
                              + (f" of {m['updates_per_epoch']} updates each"
                                 if (m.get("updates_per_epoch") or 1) > 1 else "")
                              + (f", reached the target within the probe's "
                                 f"{m['reached_at']:.3g}" if m.get("reached_at") else "")
                              + (f", at {m['near']:.0%} of the target after "
                                 f"centralized's work here (the borrowed late runs put "
                                 f"its chance of getting there at {reach:.0%})"
                                 if m.get("near") is not None and not m.get("reached_at")
                                 else "")
                              + "; " if work is not None else "")
                           + risk_why))
        rows.append(row)
    never = float("inf")
    rows.sort(key=lambda r: (r["predicted_seconds_to_target"] is None,
                             r["predicted_seconds_to_target"] or never))
    rec = next((r["strategy"] for r in rows if r["predicted_seconds_to_target"] is not None),
               None)
    return {"tier": {"name": t.name, "bandwidth": t.bandwidth, "latency": t.latency},
            "parts": measured["parts"], "model": measured["model"],
            "graph": measured.get("graph"), "partitions": measured.get("partitions"),
            "parameters": measured.get("parameters"),
            "prior": {"cells": prior.get("cells"), "source": prior.get("source"),
                      "reference_epochs_to_target": base_work,
                      "measured_here": bool(measured.get("reference_epochs"))},
            "reference_acc": measured.get("reference_acc"),
            "target_acc": measured.get("target_acc"),
            "ranking": rows, "recommendation": rec}


def advise(dataset: str = "synthetic", *, root: Optional[str] = None,
           prepared: Optional[str] = None, parts: Optional[int] = None, model: str = "gcn",
           tier: str | Tier = "wan", strategies: Sequence[str] | str = CANDIDATES,
           set_: Optional[dict[str, Any]] = None, log: Any = None,
           extend: bool = True) -> dict[str, Any]:
    """Probe every strategy on this graph and rank them for ``tier`` (see the module
    docstring); returns the dict ``quietgnn advise --json`` prints. ``extend=False``: no
    extension of the probes (quicker; the borrowed table alone predicts the work)."""
    _tier(tier)   # a bad tier fails before minutes of probing
    strategies, parts = _names(strategies), _parts_of(prepared, parts)
    if log is not None:
        log(f"quietgnn advise: {len(strategies)} probe runs of a few epochs at P = {parts}"
            f"{'' if prepared else f', then centralized for up to {REFERENCE_EPOCHS} epochs'}"
            f"{' and the probes extended to the target' if extend else ''}: each starts "
            f"{parts} processes; on 2 cores this took " + (
                "5-6 min on Computers (--no-extend is quicker)" if extend else
                "about a minute on Cora"))
    return rank(probe(dataset, root=root, prepared=prepared, parts=parts, model=model,
                      strategies=strategies, set_=set_, log=log, extend=extend), tier)


def _human(n: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.0f} B"
