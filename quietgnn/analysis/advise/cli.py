"""``quietgnn advise`` on the command line: its flags, and the ranking as a table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

from . import BASELINES, CANDIDATES, _human, advise
from ...comm.network import TIERS

__all__ = ["cli_main", "format_table"]


def _seconds(s: Optional[float]) -> str:
    if s is None:
        return "never"
    return f"{s:.3g} s" if s < 120 else f"{s / 60:.3g} min"


def format_table(res: dict[str, Any]) -> str:
    t = res["tier"]
    lines = [f"tier {t['name']} ({t['bandwidth'] / 1e6:g} Mbit/s, {t['latency'] * 1e3:g} ms), "
             f"P = {res['parts']}, {res['model']}",
             "", "| # | strategy | bytes/epoch | epoch time | to target | accuracy risk |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(res["ranking"], 1):
        b = "—" if r["bytes_per_epoch"] is None else _human(r["bytes_per_epoch"])
        e = "—" if r["epoch_seconds"] is None else _seconds(r["epoch_seconds"])
        lines.append(f"| {i} | {r['strategy']} | {b} | {e} | "
                     f"{_seconds(r['predicted_seconds_to_target'])} | {r['accuracy_risk']} |")
    lines.append("")
    for r in res["ranking"]:
        lines.append(f"- {r['strategy']}: {r['reason']}")
    rec = res["recommendation"]
    lines += ["", _target_line(res),
              f"recommendation: {rec}" if rec else "recommendation: none (every probe "
              "failed or no strategy has measured epochs to borrow)"]
    return "\n".join(lines)


def _target_line(res: dict[str, Any]) -> str:
    """The accuracy every prediction is a time to, and whether it says much: a graph that
    centralized barely learns makes every strategy 'reach' it, and the ranking is of little
    use (advice was given as confidently on a graph at chance level)."""
    acc, target = res.get("reference_acc"), res.get("target_acc")
    if acc is None or target is None:
        return ("target: 98% of centralized's test accuracy, as the borrowed runs measured it "
                "(no reference run here)")
    line = (f"target: test accuracy {target:.4f} (98% of centralized's {acc:.4f}, measured "
            f"here exactly; check a prediction with quietgnn train --train.eval_mode exact)")
    classes = (res.get("graph") or {}).get("classes")
    # within a tenth of the way from chance (1/C) to perfect
    if isinstance(classes, int) and classes > 1 and (acc - 1 / classes) < 0.1 * (1 - 1 / classes):
        line += (f"; note: centralized is near chance here ({classes} classes: 1/{classes} = "
                 f"{1 / classes:.3f}), so reaching the target says little; the ranking is of "
                 f"cost, not of accuracy")
    return line


def cli_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="quietgnn advise", description="Probe every strategy for a few epochs on this "
        "graph and rank them by predicted time to 98% of centralized on a network tier.")
    ap.add_argument("--dataset", default="synthetic", help="dataset name or file (default: "
                    "the built-in synthetic graph)")
    ap.add_argument("--root", help="dataset root directory")
    ap.add_argument("--data", help="a directory written by quietgnn prepare")
    ap.add_argument("--parts", type=int, default=None,
                    help="number of parts / ranks (default 4; a prepared graph's own)")
    ap.add_argument("--model", default="gcn", help="gcn, sage, gat or gin (default gcn)")
    ap.add_argument("--tier", default="wan", help=f"one of {', '.join(TIERS)} or "
                    f"NAME:BANDWIDTH:LATENCY, e.g. site:200M:15ms (default wan)")
    ap.add_argument("--strategies", default=",".join(CANDIDATES),
                    help=f"comma-separated candidates, or 'all' to add the seeds' baselines "
                         f"({', '.join(BASELINES)}) (default: {','.join(CANDIDATES)})")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config key for every probe run, e.g. model.hidden=128 (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-extend", action="store_true",
                    help="stop the probes of the strategies whose epochs are like "
                         "centralized's at the probe's length instead of running them on "
                         "until they reach the target: the measured table alone predicts "
                         "their work (quicker by up to one centralized run's compute)")
    args = ap.parse_args(list(argv))
    try:
        from ..bench import _kv
        extra = _kv(args.set, "--set")
        res = advise(args.dataset, root=args.root, prepared=args.data, parts=args.parts,
                     model=args.model, tier=args.tier,
                     strategies=list(CANDIDATES + BASELINES) if args.strategies == "all"
                     else [s for s in args.strategies.split(",") if s], set_=extra,
                     extend=not args.no_extend,
                     log=None if args.json else
                     (lambda m: print(m, file=sys.stderr, flush=True)))
    except (ValueError, OSError) as exc:
        print(f"quietgnn advise: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=1) if args.json else format_table(res))
    return 0 if res["recommendation"] else 1
