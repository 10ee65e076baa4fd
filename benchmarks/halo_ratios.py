"""Byte ratios of every strategy against the strong `halo` (static inputs fetched once) and
the vanilla one (inputs re-sent every epoch), per headline cell.

Reads the headline runs (`benchmarks/results/headline`, `headline-tma`, `headline-big`: the
later file wins for a cell, as in the README) and the halo-baseline runs
(`quietgnn bench --matrix benchmarks/halo_baseline.yaml`), writes
`benchmarks/results/halo-baseline/ratios.{json,md}` and, through `quietgnn report`, the time to
accuracy of every strategy against the strong `halo` (`halo-baseline/report/report.md`). Only training bytes are compared: the
other strategies' training traffic does not depend on the halo change. Setup bytes (the once-
only fetch) are read from the runs' setup records.

    python benchmarks/halo_ratios.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"
HEADLINE = ["headline", "headline-tma", "headline-big"]
OUT = ROOT / "halo-baseline"


def _cells(study: str, per_run: bool = False) -> dict[tuple[str, str, str], dict]:
    """Every finished run of a study's matrix (``results.jsonl``), or with ``per_run`` of its
    per-run result files (``results/<id>.json``: also those of an invocation stopped before it
    rewrote ``results.jsonl``; only for a study whose folder holds no superseded runs)."""
    out = {}
    if per_run:
        recs = [json.loads(f.read_text()) for f in sorted((ROOT / study / "results").glob("*.json"))]
    else:
        recs = [json.loads(x) for x in (ROOT / study / "results.jsonl").read_text().splitlines()]
    for r in recs:
        if r.get("status") == "ok" and r.get("summary"):
            out[(r["dataset"], r["model"], r["strategy"])] = r
    return out


def _setup_sent(run: dict) -> int:
    total = 0
    for f in (Path(run["run_dir"]) / "metrics").glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("epoch") == -1:
                total += rec["bytes"].get("setup", {}).get("sent", 0)
    return total


def main() -> int:
    cells: dict = {}
    for study in HEADLINE:
        cells.update(_cells(study))
    base = _cells("halo-baseline", per_run=True)
    # a strategy re-run here (adaqp, whose data flow changed) replaces its headline cell
    cells.update({k: v for k, v in base.items() if k[2] not in ("halo", "halo-vanilla")})
    rows, md = [], []
    md.append("| dataset | model | strategy | train bytes/epoch | vs strong `halo` | vs vanilla "
              "`halo` | test acc |")
    md.append("|---|---|---|---|---|---|---|")
    for (ds, model, strat), r in sorted(base.items()):
        if strat != "halo":
            continue
        strong = r["summary"]["train_bytes_per_epoch"]
        van = base.get((ds, model, "halo-vanilla"))
        vanilla = van["summary"]["train_bytes_per_epoch"] if van else None
        entries = [("halo (strong)", r), ("halo-vanilla", van),
                   ("centralized", base.get((ds, model, "centralized")))]
        entries += [(s, c) for (d, m, s), c in sorted(cells.items())
                    if d == ds and m == model and s not in ("halo", "halo-vanilla",
                                                            "centralized")]
        for name, c in entries:
            if c is None:
                continue
            b = c["summary"]["train_bytes_per_epoch"]
            row = {"dataset": ds, "model": model, "strategy": name, "train_bytes_per_epoch": b,
                   "vs_strong_halo": strong / b if b else None,
                   "vs_vanilla_halo": vanilla / b if b and vanilla else None,
                   "test_acc": c["summary"]["test_acc"], "eval_bytes": c["summary"]["eval_bytes"],
                   "source": c["run_dir"]}
            if name == "halo (strong)":
                row["setup_bytes"] = _setup_sent(c)
            rows.append(row)
            fmt = (lambda v: "—" if v is None else f"{v:.1f}×")
            md.append(f"| {ds} | {model} | {name} | {b / 1e6:.2f} MB | "
                      f"{fmt(row['vs_strong_halo']) if b else '—'} | "
                      f"{fmt(row['vs_vanilla_halo']) if b else '—'} | "
                      f"{100 * row['test_acc']:.1f} |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ratios.json").write_text(json.dumps(rows, indent=1))
    head = ["# Training bytes against the strong and the vanilla `halo`", "",
            "Produced by `python benchmarks/halo_ratios.py` from `benchmarks/results/"
            "{headline,headline-tma,headline-big,halo-baseline}/results.jsonl`. "
            "`vs strong halo` = halo's bytes per epoch-equivalent / the strategy's (> 1: the "
            "strategy sends fewer). Strong `halo`'s once-only setup fetch of the input rows "
            "is in `ratios.json` (`setup_bytes`).", ""]
    (OUT / "ratios.md").write_text("\n".join(head + md) + "\n")
    print("\n".join(md))
    # time to accuracy against the strong halo: one report over the new halo / vanilla halo /
    # centralized runs and the headline runs of every other strategy
    files = sorted(str(p) for p in (OUT / "results").glob("*.json"))
    for (ds, model, strat), c in sorted(cells.items()):
        if strat not in ("halo", "centralized") and (ds, model, "halo") in base \
                and (ds, model, strat) not in base:
            f = Path(c["run_dir"]).parent.parent / "results" / f"{c['id']}.json"
            if f.is_file():
                files.append(str(f))
    subprocess.run([sys.executable, "-m", "quietgnn", "report", *files, "--out",
                    str(OUT / "report")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
