"""Evaluation cost at the defaults against the old setting, per cell of the eval-cost study.

    quietgnn bench --matrix benchmarks/eval_cost.yaml
    python benchmarks/eval_cost_table.py [--out benchmarks/results/eval-cost]

Pairs every run labelled ``X`` (the defaults) with ``X-old`` (exact evaluation after every
epoch) on the same dataset and model, and writes ``eval-cost.json`` and ``eval-cost.md`` into
the study folder: evaluation bytes / training bytes (phase ``train`` + ``data``), evaluations
made, selected epoch and reported test accuracy of both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cell(res) -> dict:
    s, ep = res.summary, res.curve.epochs
    train = sum(e.train_bytes + e.data_bytes for e in ep)
    ev = sum(e.eval_bytes for e in ep)
    return {"train_bytes": train, "eval_bytes": ev, "ratio": ev / train if train else None,
            "evaluations": s.evaluations, "best_epoch": s.best_epoch,
            "test_acc": s.test_acc, "selected_by": s.selected_by or "exact"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/eval-cost"))
    out = Path(ap.parse_args(argv).out)
    sys.path.insert(0, str(ROOT))
    from quietgnn.analysis.report import load_results
    runs = {(r.dataset, r.model, r.strategy): r for r in load_results([out]) if r.ok}
    rows = []
    for (ds, model, label), res in runs.items():
        if label.endswith("-old"):
            continue
        old = runs.get((ds, model, f"{label}-old"))
        rows.append({"dataset": ds, "model": model, "strategy": label, "defaults": _cell(res),
                     "old": _cell(old) if old else None})
    (out / "eval-cost.json").write_text(json.dumps(rows, indent=1))

    def pct(x):
        return "—" if x is None else f"{100 * x:.2f} %"

    lines = ["# Evaluation cost: defaults vs exact evaluation every epoch", "",
             "eval/train: evaluation bytes / training bytes (phases train + data), summed over "
             "ranks; evals: evaluations made (defaults: local, + 1 exact at the end where "
             "`local`); test acc: the reported one (the selected state's, exactly evaluated).",
             "", "| dataset | model | strategy | eval/train (defaults) | eval/train (old) | "
             "evals (defaults / old) | selected by | best epoch (defaults / old) | "
             "test acc (defaults) | test acc (old) | Δ (pp) |", "|" + "---|" * 11]
    for r in rows:
        d, o = r["defaults"], r["old"] or {}
        delta = "—" if not o else f"{100 * (d['test_acc'] - o['test_acc']):+.1f}"
        old_acc = "—" if not o else f"{100 * o['test_acc']:.1f}"
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['strategy']} | {pct(d['ratio'])} | "
            f"{pct(o.get('ratio'))} | {d['evaluations']} / {o.get('evaluations', '—')} | "
            f"{d['selected_by']} | {d['best_epoch']} / {o.get('best_epoch', '—')} | "
            f"{100 * d['test_acc']:.1f} | "
            f"{old_acc} | {delta} |")
    worst = max((r["defaults"]["ratio"] or 0.0 for r in rows), default=0.0)
    lines += ["", f"Largest eval/train at the defaults: {pct(worst)}.", "", "Commands:", "",
              "    quietgnn bench --matrix benchmarks/eval_cost.yaml",
              "    python benchmarks/eval_cost_table.py", ""]
    (out / "eval-cost.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
