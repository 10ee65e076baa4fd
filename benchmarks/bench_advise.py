"""Validation of ``quietgnn advise`` against measured winners: the headline study's, and
with ``--regimes`` the regime map's.

    python benchmarks/bench_advise.py --write-prior   # quietgnn/analysis/advise/prior.py
    python benchmarks/bench_advise.py                 # probe, rank, compare (~40 min; resumable)
    python benchmarks/bench_advise.py --render        # tables from advise.json only
    python benchmarks/bench_advise.py --regimes       # the regime map's groups (no new runs)

For every dataset x model of the headline study (P = 4; its cells at today's code, see
:func:`current_results`) and every built-in tier, the measured winner is the strategy whose
run reached 98 % of ``centralized`` first on that tier (``quietgnn report``'s projected
training time to accuracy of the finished runs, plus the run's set-up traffic). The probe's
compute is brought to the measured runs' machine by the ratio of the two ``centralized`` runs
on the graph (``--render`` also lists the unscaled result). The advisor sees none of those
runs' curves for the dataset it is judged on: its prior is rebuilt with that dataset held out
(leave-one-dataset-out; the regime studies' groups borrowed, as by the shipped prior), and its
per-epoch costs come from its own probe (a few epochs per strategy, run through the trainer
into ``benchmarks/results/advise/probes/``; resumable).

``--regimes``: the same judgement on each group (prepared graph x partition x layers) of the
regime studies (:data:`REGIME_STUDIES`, ``quietgnn bench`` results), held out whole from a
prior of the headline study and the other groups; its per-epoch costs read from the group's
own runs as the probe would measure them (:func:`group_probe`): no run is made.

Writes ``benchmarks/results/advise.json`` (one record per cell: ``dataset``, ``model``,
``parts``, ``tier``, ``measured_winner``, ``advised`` — the ranking, first = its choice —
predicted and measured seconds) and ``benchmarks/results/advise/advise.md``; ``--regimes``:
``advise-regimes.json`` and ``advise/regimes.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quietgnn.analysis.advise import (BASELINES, CANDIDATES, _graph_and_partitions,  # noqa: E402
                              build_prior, probe, rank, updates_per_pass)
from quietgnn.analysis.advise import (_DEFAULT_PROBE_EPOCHS, _PERIOD_OFFSET,  # noqa: E402
                                      _PERIODIC, _PROBE_EPOCHS, REFERENCE_EPOCHS, _exact,
                                      _near)
from quietgnn.analysis.advise.fit import TARGET_FRAC, _work_to_target  # noqa: E402
from quietgnn.analysis.advise.phases import PHASED, phase_costs  # noqa: E402
from quietgnn.analysis.advise.probe import _per_work, plan_extension  # noqa: E402
from quietgnn.strategies import get_strategy  # noqa: E402
from quietgnn.comm.network import TIERS  # noqa: E402
from quietgnn.analysis.projection import Curve  # noqa: E402
from quietgnn.analysis.report import build_report  # noqa: E402

RESULTS = ROOT / "benchmarks/results"
#: the candidates judged: the advisor's default, or with ``--with-baselines`` the seeds'
#: baselines too (``quietgnn advise --strategies all``)
_CANDS: tuple[str, ...] = CANDIDATES
ROOTS = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon",
         "cs": "coauthor"}
#: the regime map's studies (``benchmarks/regimes_*.yaml``): each dataset label is a group
REGIME_STUDIES = ("regimes-1e6", "regimes-1e7")
#: the map's links: 1 Gbit/s, 100 Mbit/s, 10 Mbit/s
REGIME_TIERS = ("lan", "wan", "edge")
#: probe epochs per strategy read from a regime run (tma's epoch is an averaging period)
_PROBE_ROWS = {"tma": 2}


def _jsonl(study: str) -> list[dict]:
    path = RESULTS / study / "results.jsonl"
    return [_rows(json.loads(x)) for x in path.read_text().splitlines()] \
        if path.exists() else []


def current_results() -> list[dict]:
    """The finished runs of today's code behind each dataset x model x strategy label of the
    headline figures (as the halo-baseline report combines them; later studies win):
    the headline matrix; re-runs of some cells (``headline-tma``, ``headline-big``); the
    ``halo-baseline`` study, whose ``halo`` is today's (static inputs fetched once) and whose
    ``centralized`` and ``adaqp`` ran at the same code; ``minibatch-cache``'s default-option
    runs at the headline's 200 epochs (today's ``minibatch``, with its feature cache; its
    20-epoch CS runs are not the headline's settings, its 4-bit gradient runs not the default
    options the advisor probes); and ``headline-grappa`` (``grappa`` and ``centralized`` on
    all four graphs: today's ``grappa`` keeps mostly-zero features sparse, which made its
    epochs several times cheaper than the headline's run measured). The advisor
    probes today's code: a run of older code is not what it predicts. The headline's own
    ``halo`` is the vanilla one, which re-sends its inputs every epoch. And
    ``headline-baselines``: the seeds' baselines on Cora and CiteSeer evaluated every epoch;
    and ``headline-minibatch``: today's ``minibatch`` (mostly-zero features sparse) on Cora,
    CiteSeer and CS, evaluated as the headline's older cells."""
    cells: dict[tuple, dict] = {}

    def add(r: dict) -> None:
        cells[(r["dataset"], r["model"], r["strategy"])] = r

    jsonl = _jsonl
    for study in ("headline", "headline-tma", "headline-big"):
        for r in jsonl(study):
            add(r)
    for f in sorted((RESULTS / "halo-baseline" / "results").glob("*.json")):
        r = _rows(json.loads(f.read_text()))
        if r["strategy"] != "halo-vanilla":
            add(r)
    for r in jsonl("minibatch-cache"):
        # its default-option runs: the advisor probes (and predicts) default options; the
        # study's 4-bit gradient variant is another configuration of the same strategy name
        if (r.get("overrides") or {}).get("train.epochs") == 200 and not r.get("options"):
            add(r)
    def rescaled(rows: list[dict], keep) -> None:
        """The runs of a study that ran its own ``centralized`` beside them, those ``keep``
        accepts, their compute brought to the headline's machine load by the ratio of the two
        studies' ``centralized`` paces."""
        by = {(r["dataset"], r["model"], r["strategy"]): r for r in rows
              if r.get("status") == "ok" and r.get("curve")}
        for (ds, model, s), r in by.items():
            ref, here = cells.get((ds, model, "centralized")), by.get((ds, model, "centralized"))
            if keep(s) and ref and here:
                add(scaled(r, pace(ref) / pace(here)))

    # only headline-grappa's grappa: its centralized and halo ran on a loaded machine, and the
    # others they race (tma, adaqp, minibatch) were measured on a quiet one; its per-run files:
    # it ran in two invocations, and each rewrites results.jsonl
    rescaled([_rows(json.loads(f.read_text()))
              for f in sorted((RESULTS / "headline-grappa" / "results").glob("*.json"))],
             lambda s: s == "grappa")
    # the baselines on Cora and CiteSeer evaluated every epoch, as the seeds' runs were (the
    # headline's own evaluate every 5)
    rescaled(jsonl("headline-baselines"), lambda s: s != "centralized")
    # today's minibatch (its features sparse) evaluated as the headline's older cells were
    # (exactly, every epoch on Cora and CiteSeer, every 4 on CS); Computers' is minibatch-cache's
    rescaled(jsonl("headline-minibatch"), lambda s: s == "minibatch")
    return [r for r in cells.values() if r.get("status") == "ok" and r.get("curve")]


def _rows(r: dict) -> dict:
    """A result with its curve as one object per epoch, whichever form it was stored in."""
    return {**r, "curve": Curve.from_json(r["curve"]).to_json(columns=False)} \
        if r.get("curve") else r


def pace(run: dict) -> float:
    """Median compute seconds per epoch-equivalent after the first epoch (warm-up)."""
    rows = run["curve"]["epochs"]
    return statistics.median(float(e["compute_s"]) / (float(e.get("work", 1.0)) or 1.0)
                             for e in rows[1:] or rows)


def scaled(run: dict, factor: float) -> dict:
    """``run`` with every epoch's compute multiplied by ``factor`` (recorded in the run)."""
    c = dict(run["curve"])
    c["epochs"] = [{**e, "compute_s": float(e["compute_s"]) * factor,
                    "eval_compute_s": float(e.get("eval_compute_s") or 0.0) * factor}
                   for e in c["epochs"]]
    return {**run, "curve": c, "compute_scaled_by": factor}


def training_only(results: list[dict]) -> list[dict]:
    """The runs with their evaluation's cost left out: the advisor predicts training time
    (evaluation is the user's cadence), and runs from before evaluation was recorded carry
    none, so charging it where a later study recorded it would compare unlike things."""
    out = []
    for r in results:
        c = dict(r["curve"])
        c["epochs"] = [{**e, "eval_compute_s": 0.0, "eval_hops": 0, "eval_crit_bytes": 0}
                       for e in c["epochs"]]
        out.append({**r, "curve": c})
    return out


def measured(report: dict, results: list[dict], ds: str, model: str,
             tier: str) -> dict[str, float]:
    """Seconds to target on ``tier`` of each non-reference strategy at P = 4: the report's
    projected training time to the target plus the run's set-up traffic on the tier (what
    is placed once before the first epoch, which the advisor charges too)."""
    g = next(g for g in report["groups"] if g["dataset"] == ds and g["model"] == model)
    setup = {(r["strategy"], int(r["parts"])): r["curve"].get("setup") or {}
             for r in results if r["dataset"] == ds and r["model"] == model}
    out = {}
    for row in g["rows"]:
        t = (row.get("tta") or {}).get(tier)
        if row["strategy"] in _CANDS and row["parts"] == 4 and t and t["seconds"]:
            su = setup.get((row["strategy"], 4), {})
            out[row["strategy"]] = t["seconds"] + TIERS[tier].seconds(
                float(su.get("hops", 0)), float(su.get("crit_bytes", 0)))
    return out


def updates_by_dataset(data_root: Path, results: list[dict]) -> dict[str, dict[str, int]]:
    """Optimizer updates per epoch-equivalent of every candidate on each dataset of
    ``results`` at P = 4 with default options (what the measured runs used), from the graph's
    training nodes per part of each strategy's partitioner: the prior counts work in
    updates (:mod:`quietgnn.analysis.advise.fit`)."""
    out = {}
    for ds in sorted({r["dataset"] for r in results}):
        everyone = CANDIDATES + BASELINES   # the shipped table covers what --strategies asks
        _, parts = _graph_and_partitions(ds, str(data_root / ROOTS[ds]), None, 4, everyone, {})
        out[ds] = {s: updates_per_pass(s, parts) for s in everyone}
    return out


def regime_results() -> list[dict]:
    """The regime studies' finished runs at default options of the advisor's candidates and
    ``centralized``, each group (its dataset label) a dataset. Runs on emulated hosts are left
    out (their compute is that of hosts sharing these cores), and so is a group whose prepared
    graph is not on this machine (``benchmarks/out`` is not in git: its matrix prepares it)."""
    runs = [r for study in REGIME_STUDIES for r in _jsonl(study)
            if r.get("status") == "ok" and r.get("curve") and not r.get("link")
            and r["strategy"] == r.get("strategy_name", r["strategy"]) and not r.get("options")
            and (r["strategy"] in CANDIDATES or r["strategy"] == "centralized")]
    here = {r["dataset"] for r in runs if r["strategy"] != "centralized" and
            (ROOT / (r.get("overrides") or {}).get("dataset.prepared", "-")).is_dir()}
    gone = sorted({r["dataset"] for r in runs} - here)
    if gone:
        print(f"bench_advise: regime groups {gone} left out: their prepared graphs are not "
              f"here (the commands are in benchmarks/regimes_*.yaml)", file=sys.stderr)
    return [r for r in runs if r["dataset"] in here]


def regime_updates(results: list[dict]) -> dict[str, dict[str, int]]:
    """Optimizer updates per epoch of every candidate on each regime group's parts."""
    out = {}
    for r in results:
        prepared = (r.get("overrides") or {}).get("dataset.prepared")
        if r["dataset"] not in out and r["strategy"] != "centralized" and prepared:
            _, parts = _graph_and_partitions("", None, str(ROOT / prepared), 4, CANDIDATES, {})
            out[r["dataset"]] = {s: updates_per_pass(s, parts) for s in CANDIDATES}
    return out


def write_prior(data_root: Path) -> None:
    missing = [s for s in REGIME_STUDIES if not (RESULTS / s / "results.jsonl").is_file()]
    if missing:   # the shipped table would silently lose what the map taught it
        mats = ", ".join("benchmarks/" + m.replace("-", "_") + ".yaml" for m in missing)
        print(f"bench_advise --write-prior: no results of {missing} here; run them (their "
              f"matrices: {mats}) before rewriting the prior", file=sys.stderr)
        raise SystemExit(2)
    headline = current_results()
    regimes = regime_results()
    prior = build_prior(headline + regimes, updates={
        **updates_by_dataset(data_root, headline), **regime_updates(regimes)})
    prior["source"] = ("benchmarks/results/{headline,headline-tma,headline-big,halo-baseline,"
                       "minibatch-cache,headline-grappa,headline-baselines,headline-minibatch}: "
                       "every strategy at P = 4, GCN and SAGE 2x64, 200 epoch-equivalents, on "
                       "Cora, CiteSeer, Computers and CS; and benchmarks/results/"
                       f"{{{','.join(REGIME_STUDIES)}}}: the regime map's groups (synthetic "
                       "graphs prepared in hash and ldg parts, P = 4)")
    path = ROOT / "quietgnn/analysis/advise/prior.py"
    path.write_text('"""What ``quietgnn advise`` borrows from quietgnn\'s measured runs '
                    '(written by\n``python benchmarks/bench_advise.py --write-prior``; do not '
                    'edit by hand)."""\n\nPRIOR = ' + pprint.pformat(prior, width=96,
                                                                     sort_dicts=True) + "\n")
    print(f"wrote {path}")


def validate(data_root: Path, datasets: list[str]) -> list[dict]:
    results = training_only(current_results())
    report = build_report(results, dict(TIERS)).to_json()
    # the prior borrows the regime studies' groups too (as the shipped one does)
    regimes = regime_results()
    borrowed = results + regimes
    updates = {**updates_by_dataset(data_root, results), **regime_updates(regimes)}
    records = []
    for g in report["groups"]:
        ds, model = g["dataset"], g["model"]
        if datasets and ds not in datasets:
            continue
        strategies = [s for s in _CANDS if any(
            r["strategy"] == s and r["parts"] == 4 for r in g["rows"])]
        kw = dict(root=str(data_root / ROOTS[ds]), parts=4, model=model,
                  strategies=strategies, set_={"model.hidden": 64, "model.layers": 2},
                  run_epochs=200,   # the measured runs' (retexo's schedule: 100 rounds a layer)
                  out=ROOT / "benchmarks/results/advise/probes" / f"{ds}-{model}",
                  log=lambda msg: print(msg, file=sys.stderr, flush=True))
        m = probe(ds, **kw)
        m0 = unextended(m)
        prior = build_prior(borrowed, exclude=[ds], updates=updates)
        # the probe and the measured runs ran at different machine loads: the probe's
        # compute is brought to the measured runs' machine by the ratio of its centralized
        # run to theirs on this graph (one factor for every strategy; unscaled kept beside)
        ref = next(r for r in results if (r["dataset"], r["model"], r["strategy"])
                   == (ds, model, "centralized"))
        factor = (m["reference_compute_s"] / pace(ref)) if m.get("reference_compute_s") else 1.0
        for tier in TIERS:
            truth = measured(report, results, ds, model, tier)
            if not truth:
                continue
            adv = rank(on_machine(m, 1.0 / factor), tier, prior)
            raw = [r["strategy"] for r in rank(m, tier, prior)["ranking"]]
            no_ext = [r["strategy"] for r in rank(on_machine(m0, 1.0 / factor), tier,
                                                  prior)["ranking"]]
            no_late = [r["strategy"] for r in rank(on_machine(without_late(m), 1.0 / factor),
                                                   tier, prior)["ranking"]]
            order = [r["strategy"] for r in adv["ranking"]]
            winner = min(truth, key=truth.get)
            pred = {r["strategy"]: r["predicted_seconds_to_target"] for r in adv["ranking"]}
            errs = [math.log(pred[s] / truth[s]) for s in truth if pred.get(s)]
            records.append({
                "dataset": ds, "model": model, "parts": 4, "tier": tier,
                "measured_winner": winner, "advised": order,
                "hit": order[:1] == [winner], "top2": winner in order[:2],
                "predicted_s": pred, "measured_s": truth,
                # how far the predicted times are: median |log(predicted / measured)|
                "median_abs_log_error": statistics.median(map(abs, errs)) if errs else None,
                "probe_compute_factor": factor, "advised_unscaled": raw,
                "hit_unscaled": raw[:1] == [winner], "top2_unscaled": winner in raw[:2],
                "advised_no_extension": no_ext, "hit_no_extension": no_ext[:1] == [winner],
                "top2_no_extension": winner in no_ext[:2],
                "advised_no_late": no_late, "hit_no_late": no_late[:1] == [winner],
                "top2_no_late": winner in no_late[:2],
                # the probe's extension: epochs run on, and where it reached the target
                "extended": {s: [v["extended_to"], v.get("reached_at")]
                             for s, v in m["strategies"].items() if v.get("extended_to")},
            })
            print(f"{ds}/{model}/{tier}: winner {winner}, advised {order[:3]}",
                  file=sys.stderr, flush=True)
    return records


def on_machine(m: dict, factor: float) -> dict:
    """The probe ``m`` with every strategy's compute (per epoch, per period and per phase)
    times ``factor``."""
    out = {**m, "strategies": {}}
    for s, v in m["strategies"].items():
        v = dict(v)
        if "compute_s" in v:
            v["compute_s"] = v["compute_s"] * factor
        if v.get("periodic"):
            v["periodic"] = {**v["periodic"],
                             "compute_s": v["periodic"]["compute_s"] * factor}
        if v.get("phases"):
            def times(c: dict) -> dict:
                return {**c, "compute_s": c["compute_s"] * factor}
            v["phases"] = [{**times(ph), "start": times(ph["start"]), "end": times(ph["end"])}
                           for ph in v["phases"]]
        out["strategies"][s] = v
    return out


def unextended(m: dict) -> dict:
    """The probe ``m`` as ``extend=False`` gives it: each extended strategy with its short
    probe's ``reached_at`` (kept beside by :func:`probe`), not the extension's."""
    out = {**m, "strategies": {}}
    for s, v in m["strategies"].items():
        if "extended_to" in v:
            # (how near it was comes from the extension: a probe that did centralized's work
            # is not extended)
            v = {k: x for k, x in v.items() if k not in ("extended_to", "probe_reached_at",
                                                        "near", "near_at")}
            v["reached_at"] = m["strategies"][s].get("probe_reached_at")
        out["strategies"][s] = v
    return out


def without_late(m: dict) -> dict:
    """The probe ``m`` without how near a strategy short of the target was (``near``): the
    borrowed table alone predicts its work and its chance, as before the late runs were
    used."""
    return {**m, "strategies": {s: {k: x for k, x in v.items() if k not in ("near", "near_at")}
                                for s, v in m["strategies"].items()}}


def render(records: list[dict], command: str = "python benchmarks/bench_advise.py") -> list[str]:
    n = len(records)
    hit = sum(r["hit"] for r in records)
    top2 = sum(r["top2"] for r in records)
    errs = [r["median_abs_log_error"] for r in records if r["median_abs_log_error"] is not None]
    hit_u = sum(r.get("hit_unscaled", r["hit"]) for r in records)
    top2_u = sum(r.get("top2_unscaled", r["top2"]) for r in records)
    factors = {f"{r['dataset']}/{r['model']}": r.get("probe_compute_factor", 1.0)
               for r in records}
    hit_x = sum(r.get("hit_no_extension", r["hit"]) for r in records)
    top2_x = sum(r.get("top2_no_extension", r["top2"]) for r in records)
    hit_l = sum(r.get("hit_no_late", r["hit"]) for r in records)
    top2_l = sum(r.get("top2_no_late", r["top2"]) for r in records)
    cells = {f"{r['dataset']}/{r['model']}": r.get("extended") or {} for r in records}
    ext = [f"{c} {s} {k} ({'never' if at is None else f'at {at:g}'})"
           for c, e in cells.items() for s, (k, at) in sorted(e.items())]
    lines = ["# quietgnn advise: validation against the headline study", "",
             f"Command: `{command}` (candidates: {', '.join(_CANDS)}; "
             "leave-one-dataset-out prior, "
             "per-epoch costs from the advisor's own probe; measured: training time to 98 % of "
             "`centralized` plus set-up traffic, today's code, see `current_results`).", "",
             f"- first choice = measured winner: {hit}/{n} cells ({100 * hit / max(n, 1):.0f}%)",
             f"- measured winner in the top two: {top2}/{n} ({100 * top2 / max(n, 1):.0f}%)",
             f"- predicted vs measured time to target: median factor "
             f"{math.exp(statistics.median(errs)) if errs else float('nan'):.2f}x "
             f"(per cell, the median over strategies of max(pred/meas, meas/pred))",
             f"- with the probe's compute as measured (not brought to the measured runs' "
             f"machine): first choice {hit_u}/{n}, top two {top2_u}/{n}",
             f"- without the probe's extension (`--no-extend`: the borrowed table alone "
             f"predicts the work): first choice {hit_x}/{n}, top two {top2_x}/{n}",
             f"- without the late runs (a strategy still short of the target after "
             f"`centralized`'s work predicted from the borrowed table alone): first choice "
             f"{hit_l}/{n}, top two {top2_l}/{n}",
             "- extended probes (epochs run on; where the target was reached, in "
             "epoch-equivalents): " + (", ".join(ext) or "none"),
             "- probe compute / measured runs' compute (`centralized` on each graph and model): "
             + ", ".join(f"{k} {v:.2f}x" for k, v in factors.items()), "",
             "| dataset | model | tier | measured winner | advised (first three) | hit | "
             "time factor |", "|---|---|---|---|---|---|---|"]
    for r in records:
        e = r["median_abs_log_error"]
        lines.append(f"| {r['dataset']} | {r['model']} | {r['tier']} | {r['measured_winner']} "
                     f"| {', '.join(r['advised'][:3])} | "
                     f"{'yes' if r['hit'] else ('top 2' if r['top2'] else 'no')} | "
                     f"{'—' if e is None else f'{math.exp(e):.2f}x'} |")
    misses = [r for r in records if not r["hit"]]
    if misses:
        lines += ["", "Misses (measured seconds to target of the winner and of the advised):", ""]
        for r in misses:
            a, w = r["advised"][0], r["measured_winner"]
            lines.append(f"- {r['dataset']}/{r['model']}/{r['tier']}: advised {a} "
                         f"(measured {_s(r['measured_s'].get(a))}, predicted "
                         f"{_s(r['predicted_s'].get(a))}), winner {w} (measured "
                         f"{_s(r['measured_s'][w])}, predicted {_s(r['predicted_s'].get(w))})")
    return lines


def group_probe(runs: dict[str, dict], prepared: str, layers: int) -> dict:
    """What the advisor's probe would measure on a regime group's graph, read from the group's
    runs (``runs``: strategy -> result): each strategy's first epochs (``grappa``, ``llcg``:
    through the first repetition of their periodic work; ``retexo``: each layer's first,
    second and last round, the phases; ``tma``: two averaging periods) and ``centralized``'s
    epochs to the target."""
    info, stats = _graph_and_partitions("", None, str(ROOT / prepared), 4, CANDIDATES, {})
    ref = runs.get("centralized")
    ref_work = _work_to_target(ref["curve"], TARGET_FRAC * ref["summary"]["test_acc"]) \
        if ref else None
    measured: dict = {}
    for s, res in runs.items():
        if s == "centralized":
            continue
        rows = res["curve"]["epochs"]
        opts = res["summary"].get("options") or {}
        period = int(opts.get(_PERIODIC[s], getattr(get_strategy(s).Options(), _PERIODIC[s]))) \
            if s in _PERIODIC else 0
        if period and len(rows) > period + 1:
            # through the first repetition and one steady epoch after it (the last row)
            m = _per_work({"epochs": rows[:period + 2]}, period, _PERIOD_OFFSET.get(s, 0))
            m["periodic"]["every"] = period
        else:
            m = _per_work({"epochs": rows[:_PROBE_ROWS.get(s, 3)]})
        if s in PHASED:
            epochs = int((res.get("overrides") or {}).get("train.epochs", 100))
            sched = get_strategy(s).Options(**{k: v for k, v in opts.items()
                                               if k == PHASED[s]}).schedule(layers, epochs)
            starts = [sum(sched[:k]) for k in range(len(sched))]
            pick = [rows[i] for o, n in zip(starts, sched) for i in (o, o + 1, o + n - 1)]
            m["phases"] = phase_costs({"epochs": pick}, layers, sched)
        setup = res["curve"].get("setup") or {}
        m.update(setup={"hops": float(setup.get("hops", 0)),
                        "crit_bytes": float(setup.get("crit_bytes", 0))},
                 partitioner=res["summary"].get("partitioner"),
                 updates_per_epoch=updates_per_pass(s, stats))
        measured[s] = m
    if ref and ref_work:
        _extend(runs, measured, ref, ref_work)
    return {"graph": info, "partitions": stats, "parts": 4, "model": "gcn", "parameters": None,
            "reference_epochs": ref_work, "reference_compute_s": None, "strategies": measured}


def _extend(runs: dict[str, dict], measured: dict, ref: dict, ref_work: float) -> None:
    """The probe's extension (:mod:`quietgnn.analysis.advise.probe`) read from the runs: the
    plan on the budget of ``centralized``'s run (its first ``REFERENCE_EPOCHS``), each
    extended strategy's run cut at the planned epochs — through its first evaluation at or
    after them, as the study evaluated every few epochs where the probe evaluates each."""
    eps = ref["curve"]["epochs"][:REFERENCE_EPOCHS]
    cost = sum(float(e.get("compute_s") or 0.0) for e in eps)
    probe_epochs = {s: 0 if s in PHASED else _PROBE_EPOCHS.get(s, _DEFAULT_PROBE_EPOCHS)
                    for s in measured}
    skip = set(_PERIODIC) | _exact()
    target = TARGET_FRAC * ref["summary"]["test_acc"]
    plan = plan_extension(measured, ref_work, cost, 4, probe_epochs, skip)
    for s, m in measured.items():
        if s in skip or "error" in m:
            continue
        # a phased strategy's probe ran another schedule: only its extension is read
        k = plan.get(s) or (0 if s in PHASED else probe_epochs[s])
        if not k:
            continue
        rows, done = [], 0.0
        for e in runs[s]["curve"]["epochs"]:
            rows.append(e)
            done += float(e.get("work") or 1.0)
            if done >= k - 1e-9 and e.get("test_acc") is not None:
                break
        if s in plan:
            m["extended_to"] = k
        m["reached_at"] = _work_to_target({"epochs": rows}, target)
        _near(m, {"epochs": rows}, target, ref_work)


def validate_regimes(headline: list[dict], headline_updates: dict) -> list[dict]:
    """Each regime group held out whole (its links share its runs) and judged on every tier."""
    everyone = regime_results()
    updates = {**headline_updates, **regime_updates(everyone)}
    records = []
    for name in sorted({r["dataset"] for r in everyone}):
        runs = {r["strategy"]: r for r in everyone if r["dataset"] == name}
        if "centralized" not in runs or len(runs) < 3:
            print(f"regime group {name}: no centralized run or fewer than two candidates: "
                  f"left out", file=sys.stderr)
            continue
        mine = training_only(list(runs.values()))
        report = build_report(mine, dict(TIERS)).to_json()
        prior = build_prior(headline + [r for r in everyone if r["dataset"] != name],
                            updates={k: v for k, v in updates.items() if k != name})
        any_run = next(r for s, r in runs.items() if s != "centralized")
        m = group_probe(runs, any_run["overrides"]["dataset.prepared"],
                        int(any_run["summary"]["layers"]))
        for tier in REGIME_TIERS:
            truth = measured(report, mine, name, "gcn", tier)
            if not truth:
                continue
            ranking = rank(m, tier, prior)["ranking"]
            order = [r["strategy"] for r in ranking]
            pred = {r["strategy"]: r["predicted_seconds_to_target"] for r in ranking}
            winner = min(truth, key=truth.get)
            no_late = [r["strategy"] for r in rank(without_late(m), tier, prior)["ranking"]]
            errs = [abs(math.log(pred[s] / truth[s])) for s in truth if pred.get(s)]
            records.append({"group": name, "tier": tier, "measured_winner": winner,
                            "advised": order, "hit": order[:1] == [winner],
                            "top2": winner in order[:2], "advised_no_late": no_late,
                            "hit_no_late": no_late[:1] == [winner],
                            "top2_no_late": winner in no_late[:2],
                            "near": {s: round(v["near"], 4) for s, v in m["strategies"].items()
                                     if v.get("near") is not None},
                            "predicted_s": pred, "measured_s": truth,
                            "median_abs_log_error": statistics.median(errs) if errs else None})
            print(f"{name}/{tier}: winner {winner}, advised {order[:3]}", file=sys.stderr,
                  flush=True)
    return records


def render_regimes(records: list[dict]) -> list[str]:
    n = len(records)
    hit, top2 = sum(r["hit"] for r in records), sum(r["top2"] for r in records)
    return ["# quietgnn advise on the regime map", "",
            "Command: `python benchmarks/bench_advise.py --regimes` (leave-one-group-out prior: "
            "the headline study + the regime studies' other groups; per-epoch costs read from "
            "the held-out group's runs as the probe measures them; winner: fewest projected "
            "seconds of training to 98 % of `centralized` plus set-up traffic, among the "
            f"advisor's candidates; studies: {', '.join(REGIME_STUDIES)}).", "",
            f"- first choice = measured winner: {hit}/{n} cells ({100 * hit / max(n, 1):.0f}%)",
            f"- measured winner in the top two: {top2}/{n} ({100 * top2 / max(n, 1):.0f}%)",
            f"- without the late runs (a strategy still short of the target after "
            f"`centralized`'s work predicted from the borrowed table alone): first choice "
            f"{sum(r['hit_no_late'] for r in records)}/{n}, top two "
            f"{sum(r['top2_no_late'] for r in records)}/{n}", "",
            "| group | tier | measured winner | advised (first three) | hit | its predicted / "
            "measured | winner's predicted / measured |", "|---|---|---|---|---|---|---|"] + [
        f"| {r['group']} | {r['tier']} | {r['measured_winner']} | "
        f"{', '.join(r['advised'][:3])} | "
        f"{'yes' if r['hit'] else ('top 2' if r['top2'] else 'no')} | "
        f"{_s(r['predicted_s'].get(r['advised'][0]))} / "
        f"{_s(r['measured_s'].get(r['advised'][0]))} | "
        f"{_s(r['predicted_s'].get(r['measured_winner']))} / "
        f"{_s(r['measured_s'][r['measured_winner']])} |" for r in records]


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.3g}s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-prior", action="store_true")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--data-root", default=str(ROOT.parent / "shared/data"))
    ap.add_argument("--datasets", default="", help="comma-separated subset")
    ap.add_argument("--with-baselines", action="store_true",
                    help="judge `advise --strategies all` (into advise-baselines.*)")
    ap.add_argument("--regimes", action="store_true",
                    help="judge on the regime map's groups (into advise-regimes.*)")
    args = ap.parse_args()
    global _CANDS
    name, command = "advise", "python benchmarks/bench_advise.py"
    if args.with_baselines:
        _CANDS = CANDIDATES + BASELINES
        name, command = "advise-baselines", command + " --with-baselines"
    if args.write_prior:
        write_prior(Path(args.data_root))
        return 0
    jpath = ROOT / f"benchmarks/results/{name}.json"
    from _study import write_report
    if args.regimes:
        headline = training_only(current_results())
        records = validate_regimes(headline, updates_by_dataset(Path(args.data_root), headline))
        write_report(ROOT / "benchmarks/results/advise/regimes.md", render_regimes(records),
                     ROOT / "benchmarks/results/advise-regimes.json",
                     {"command": "python benchmarks/bench_advise.py --regimes",
                      "cells": records})
        return 0
    if args.render:
        records = json.loads(jpath.read_text())["cells"]
    else:
        records = validate(Path(args.data_root), [d for d in args.datasets.split(",") if d])
    write_report(ROOT / f"benchmarks/results/advise/{name}.md", render(records, command),
                 None if args.render else jpath, {"command": command, "cells": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
