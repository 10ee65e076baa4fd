"""Does ``quietgnn advise`` pick the winner of the regime map (#47, item 5)?

    python benchmarks/bench_advise_regimes.py      # after bench_regimes.py: rank, compare

For every cell of ``benchmarks/results/regimes.json`` (graph x partition x layers, at each
link) the measured winner is the advisor's candidate with the fewest projected seconds to
98 % of ``centralized`` in the map. The advisor is judged leave-one-group-out: its prior
(:func:`quietgnn.analysis.advise.build_prior`) is the headline study's runs plus the regime study's
*other* groups (graph x partition x layers: the three links of a group share its runs, so a
group is held out whole), and its per-epoch costs come from the held-out group's own runs
read as its probe would measure them — each strategy's first epochs (``grappa``: through its
first chunk reload, the periodic cost; ``retexo``: each layer's first, second and last
round, the phases; ``tma``: two averaging periods) — and ``centralized``'s epochs to the
target on that graph. No run is made here: the regime study's run directories
(``benchmarks/out/regimes/runs``) are read, or where one is not on this machine what the study
kept of it in git (``benchmarks/results/regimes/kept``); a group with neither is left out,
and said so.

Also what ``bench_advise.py --write-prior`` borrows: :func:`regime_results` (every group's
runs as ``quietgnn bench`` results) and :func:`regime_updates`.

Writes ``benchmarks/results/advise-regimes.json`` and
``benchmarks/results/advise/regimes.md``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from quietgnn.analysis.advise.fit import TARGET_FRAC, _work_to_target, build_prior  # noqa: E402
from quietgnn.analysis.advise.phases import PHASED, phase_costs  # noqa: E402
from quietgnn.analysis.advise.probe import _per_work, plan_extension  # noqa: E402
from quietgnn.analysis.advise import (_DEFAULT_PROBE_EPOCHS, _PERIOD_OFFSET,  # noqa: E402
                                      _PERIODIC, _PROBE_EPOCHS, CANDIDATES, REFERENCE_EPOCHS,
                                      _exact, _graph_and_partitions, _near, rank,
                                      updates_per_pass)
from quietgnn.analysis.projection import Curve, epoch_curve  # noqa: E402
from quietgnn.runtime.metrics import read_metrics  # noqa: E402
from quietgnn.strategies import get_strategy  # noqa: E402
from bench_advise import _s, without_late  # noqa: E402

REGIMES = ROOT / "benchmarks/results/regimes.json"
RUNS = ROOT / "benchmarks/out/regimes/runs"
KEPT = ROOT / "benchmarks/results/regimes/kept"
#: probe epochs per strategy (as ``quietgnn advise`` probes: tma's epoch is an averaging period)
_PROBE_ROWS = {"tma": 2}


def _label(edges: float) -> str:
    """1e6 -> ``"1e6"``: the graph label in the regime study's run names."""
    mant, exp = f"{edges:.0e}".split("e")
    return f"{mant}e{int(exp)}"


def groups(saved: dict) -> dict[str, dict[str, Any]]:
    """Per group ``syn-<edges>-<partition>-L<layers>``: its cells' records (default options,
    the advisor's candidates), the prepared graph and every run's curve and summary."""
    central = {round(v["test_acc"], 12): k for k, v in saved.get("centralized", {}).items()}
    out: dict[str, dict[str, Any]] = {}
    for r in saved.get("runs", []):
        if "variant" in r or "error" in r or r["strategy"] not in CANDIDATES:
            continue
        name = f"syn-{_label(r['edges'])}-{r['partition']}-L{r['layers']}"
        g = out.setdefault(name, {"records": [], "runs": {}, "layers": r["layers"],
                                  "central": central.get(round(r["centralized_test_acc"], 12))})
        g["records"].append(r)
        run = f"{_label(r['edges'])}-{r['partition']}-L{r['layers']}-{r['strategy']}"
        if r["strategy"] not in g["runs"]:
            g["runs"][r["strategy"]] = (run, r.get("best_test_acc"))
    for name, g in out.items():
        runs = {**g["runs"], "centralized": (f"central-{g['central']}", None)} \
            if g["central"] else g["runs"]
        g["runs"] = {s: res for s, (run, best) in runs.items()
                     if (res := _result(run, best)) is not None}
        g["missing"] = sorted(set(runs) - set(g["runs"]))
        if g["missing"]:
            print(f"regime group {name}: no run directory and nothing kept for "
                  f"{g['missing']} (looked in {RUNS} and {KEPT}): "
                  f"left out", file=sys.stderr)
        any_run = next(iter(g["runs"].values()), None)
        g["prepared"] = any_run and any_run["config"]["dataset"]["prepared"]
    return out


def _result(name: str, best: Optional[float]) -> Optional[dict[str, Any]]:
    """The run ``name`` as a ``quietgnn bench`` result, from its run directory or what the
    study kept of it (None: neither here); one stopped at the study's budget has no
    summary: its best test accuracy (``best``) and its configuration stand in."""
    run, kept = RUNS / name, KEPT / f"{name}.json"
    if (run / "config.json").is_file():
        config = json.loads((run / "config.json").read_text())
        summary = json.loads((run / "summary.json").read_text()) \
            if (run / "summary.json").is_file() else None
        curve = epoch_curve(read_metrics(run))
    elif kept.is_file():
        saved = json.loads(kept.read_text())
        config, summary = saved["config"], saved["summary"]
        curve = Curve.from_json(saved["curve"])
    else:
        return None
    if summary is None:
        summary = {"strategy": config["strategy"], "model": config["model"]["arch"],
                   "test_acc": best, "options": config.get("options") or {},
                   "partitioner": config["partition"]["method"]}
    return {"strategy": summary["strategy"], "model": summary["model"], "status": "ok",
            "summary": summary, "config": config, "curve": curve.to_json(columns=False)}


def regime_results(saved: dict, exclude: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every group's runs (but ``exclude``'s) as ``quietgnn bench`` results, the group as the
    dataset: what the prior borrows."""
    return [{**res, "dataset": name} for name, g in groups(saved).items() if name not in exclude
            for res in g["runs"].values()]


def regime_updates(saved: dict) -> dict[str, dict[str, int]]:
    """Optimizer updates per epoch of every candidate on each group's parts."""
    out = {}
    for name, g in groups(saved).items():
        if g["prepared"]:
            _, parts = _graph_and_partitions("", None, str(ROOT / g["prepared"]), 4, CANDIDATES,
                                             {})
            out[name] = {s: updates_per_pass(s, parts) for s in CANDIDATES}
    return out


def group_probe(g: dict[str, Any]) -> dict[str, Any]:
    """What the advisor's probe would measure on this group's graph, read from its runs."""
    info, stats = _graph_and_partitions("", None, str(ROOT / g["prepared"]), 4, CANDIDATES, {})
    ref = g["runs"].get("centralized")
    ref_work = (_work_to_target(ref["curve"], TARGET_FRAC * ref["summary"]["test_acc"])
                if ref else None)
    measured: dict[str, Any] = {}
    for s, res in g["runs"].items():
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
            sched = get_strategy(s).Options(**{k: v for k, v in opts.items()
                                               if k == PHASED[s]}).schedule(
                g["layers"], int(res["config"]["train"]["epochs"]))
            starts = [sum(sched[:k]) for k in range(len(sched))]
            pick = [rows[i] for o, n in zip(starts, sched) for i in (o, o + 1, o + n - 1)]
            m["phases"] = phase_costs({"epochs": pick}, g["layers"], sched)
        setup = res["curve"].get("setup") or {}
        m.update(setup={"hops": float(setup.get("hops", 0)),
                        "crit_bytes": float(setup.get("crit_bytes", 0))},
                 partitioner=res["summary"].get("partitioner"),
                 updates_per_epoch=updates_per_pass(s, stats))
        measured[s] = m
    if ref and ref_work:
        _extend(g, measured, ref, ref_work)
    return {"graph": info, "partitions": stats, "parts": 4, "model": "gcn", "parameters": None,
            "reference_epochs": ref_work, "reference_compute_s": None, "strategies": measured}


def _extend(g: dict[str, Any], measured: dict[str, Any], ref: dict[str, Any],
            ref_work: float) -> None:
    """The probe's extension (:mod:`quietgnn.analysis.advise.probe`) read from the runs: the
    plan on the budget of ``centralized``'s run here (its first ``REFERENCE_EPOCHS``), each
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
        for e in g["runs"][s]["curve"]["epochs"]:
            rows.append(e)
            done += float(e.get("work") or 1.0)
            if done >= k - 1e-9 and e.get("test_acc") is not None:
                break
        if s in plan:
            m["extended_to"] = k
        m["reached_at"] = _work_to_target({"epochs": rows}, target)
        _near(m, {"epochs": rows}, target, ref_work)


def validate(saved: dict, headline: list[dict[str, Any]],
             headline_updates: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    from bench_regimes import LINKS
    updates = {**headline_updates, **regime_updates(saved)}
    records = []
    for name, g in sorted(groups(saved).items()):
        if not g["prepared"] or "centralized" not in g["runs"]:
            continue
        prior = build_prior(headline + regime_results(saved, exclude=(name,)),
                            updates={k: v for k, v in updates.items() if k != name})
        m = group_probe(g)
        for link, tier in LINKS.items():
            truth = {r["strategy"]: r["projected_seconds_to_98"] for r in g["records"]
                     if r["link"] == link and r.get("projected_seconds_to_98") is not None}
            if not truth:
                continue
            adv = rank(m, tier, prior)
            order = [r["strategy"] for r in adv["ranking"]]
            pred = {r["strategy"]: r["predicted_seconds_to_target"] for r in adv["ranking"]}
            winner = min(truth, key=truth.get)
            no_late = [r["strategy"] for r in rank(without_late(m), tier, prior)["ranking"]]
            errs = [abs(math.log(pred[s] / truth[s])) for s in truth if pred.get(s)]
            records.append({"group": name, "link": link, "tier": tier.name,
                            "measured_winner": winner, "advised": order,
                            "hit": order[:1] == [winner], "top2": winner in order[:2],
                            "advised_no_late": no_late, "hit_no_late": no_late[:1] == [winner],
                            "top2_no_late": winner in no_late[:2],
                            "near": {s: round(v["near"], 4) for s, v in m["strategies"].items()
                                     if v.get("near") is not None},
                            "predicted_s": pred, "measured_s": truth,
                            "median_abs_log_error": sorted(errs)[len(errs) // 2] if errs
                            else None})
            print(f"{name}/{link}: winner {winner}, advised {order[:3]}", file=sys.stderr,
                  flush=True)
    return records


def render(records: list[dict[str, Any]]) -> list[str]:
    n = len(records)
    hit = sum(r["hit"] for r in records)
    top2 = sum(r["top2"] for r in records)
    lines = ["# quietgnn advise on the regime map (#47 item 5)", "",
             "Command: `python benchmarks/bench_advise_regimes.py` (leave-one-group-out prior: "
             "the headline study + the regime study's other groups; per-epoch costs read from "
             "the held-out group's runs as the probe measures them; winner: fewest projected "
             "seconds to 98 % in `benchmarks/results/regimes.json`, among the advisor's "
             "candidates).", "",
             f"- first choice = measured winner: {hit}/{n} cells ({100 * hit / max(n, 1):.0f}%)",
             f"- measured winner in the top two: {top2}/{n} ({100 * top2 / max(n, 1):.0f}%)",
             f"- without the late runs (a strategy still short of the target after "
             f"`centralized`'s work predicted from the borrowed table alone): first choice "
             f"{sum(r['hit_no_late'] for r in records)}/{n}, top two "
             f"{sum(r['top2_no_late'] for r in records)}/{n}",
             "- how near the target each strategy short of it was after `centralized`'s work "
             "(per group): " + "; ".join(
                 f"{g} " + ", ".join(f"{s} {v:.2f}" for s, v in sorted(nr.items()))
                 for g, nr in dict((r["group"], r["near"]) for r in records).items() if nr),
             "",
             "| group | link | measured winner | advised (first three) | hit | its predicted / "
             "measured | winner's predicted / measured |", "|---|---|---|---|---|---|---|"]
    for r in records:
        a, w = r["advised"][0], r["measured_winner"]
        lines.append(f"| {r['group']} | {r['link']} | {w} | {', '.join(r['advised'][:3])} | "
                     f"{'yes' if r['hit'] else ('top 2' if r['top2'] else 'no')} | "
                     f"{_s(r['predicted_s'].get(a))} / {_s(r['measured_s'].get(a))} | "
                     f"{_s(r['predicted_s'].get(w))} / {_s(r['measured_s'][w])} |")
    return lines


def main() -> int:
    from _study import write_report
    from bench_advise import current_results, training_only, updates_by_dataset
    saved = json.loads(REGIMES.read_text())
    headline = training_only(current_results())
    records = validate(saved, headline,
                       updates_by_dataset(ROOT.parent / "shared/data", headline))
    write_report(ROOT / "benchmarks/results/advise/regimes.md", render(records),
                 ROOT / "benchmarks/results/advise-regimes.json",
                 {"command": "python benchmarks/bench_advise_regimes.py", "cells": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
