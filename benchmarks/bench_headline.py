"""The headline comparison: every registered strategy, four datasets, P = 4, GCN and SAGE.

    /work/venv/bin/python benchmarks/bench_headline.py            # bench (resumable) + report
    /work/venv/bin/python benchmarks/bench_headline.py --epochs 20 --out /tmp/quick

Equivalent to the two commands a user would type (what the README shows)::

    quietgnn bench --matrix benchmarks/headline.yaml --strategies <all registered>
    quietgnn report benchmarks/results/headline/results.jsonl --out benchmarks/results/headline/report

The matrix (datasets, hyperparameters) is ``benchmarks/headline.yaml``; the strategy list is
taken from the registry at run time, so strategies that land later join with no edit.
Already finished runs are skipped (delete ``results/<id>.json`` to rerun one). Writes
``benchmarks/results/headline/headline.json`` and ``headline.md`` (copies of the
report) next to the per-run results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", default="benchmarks/headline.yaml")
    ap.add_argument("--strategies", help="comma-separated (default: every registered strategy)")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--datasets")
    ap.add_argument("--out", default="benchmarks/results/headline")
    args = ap.parse_args(argv)
    # paths (and the dataset roots in the YAML) are relative to the repository root, so the
    # commands recorded in the report are the ones a user types there
    os.chdir(ROOT)
    from quietgnn.analysis import bench, report
    from quietgnn.strategies import available_strategies
    strategies = args.strategies or ",".join(available_strategies())
    cmd = ["--matrix", args.matrix, "--strategies", strategies, "--out", args.out]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if args.datasets:
        cmd += ["--datasets", args.datasets]
    print("quietgnn bench " + " ".join(cmd), flush=True)
    rc = bench.cli_main(cmd)   # non-zero when some run failed: still report the rest
    out = Path(args.out)
    rep = ["--out", str(out / "report"), str(out / "results.jsonl")]
    print("quietgnn report " + " ".join(rep), flush=True)
    report.cli_main(rep)
    # same report beside the study's runs, image links pointing into the report folder
    data = json.loads((out / "report" / "report.json").read_text())
    md = (out / "report" / "report.md").read_text().replace("](", "](report/")
    (out / f"{out.name}.md").write_text(md + "\n" + "\n".join(
        ["Commands:", "", "    quietgnn bench " + " ".join(cmd),
         "    quietgnn report " + " ".join(rep), ""]))
    data["commands"] = ["quietgnn bench " + " ".join(cmd), "quietgnn report " + " ".join(rep)]
    (out / f"{out.name}.json").write_text(json.dumps(data, indent=1, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
