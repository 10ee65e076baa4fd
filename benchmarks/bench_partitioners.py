"""Edge cut of the partitioners: METIS (in memory) against the streaming ones (`ldg`, `hash`)
and `random`, on the shared datasets and synthetic graphs, at P = 4 and 8.

    .venv/bin/python benchmarks/bench_partitioners.py

Per graph and P: the fraction of (stored) edges cut, node balance (largest part / mean),
total halo rows (what `halo` exchanges per layer) and the partitioner's seconds (one run;
a noisy 2-core machine). `ldg` is what out-of-core `quietgnn prepare` uses by default; it runs
here in memory, which gives the same assignment (tests/test_prepare_stream.py).

Writes ``benchmarks/results/partitioners/partitioners.{json,md}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
GRAPHS = [("cora", "planetoid"), ("citeseer", "planetoid"), ("computers", "amazon"),
          ("cs", "coauthor")]
METHODS = ["metis", "ldg", "hash", "random"]


def main() -> int:
    from quietgnn.datasets import load_dataset
    from quietgnn.datasets.synthetic import SyntheticSpec
    from quietgnn.partition import partition_nodes, partition_stats
    graphs = [(n, lambda n=n, r=r: load_dataset(n, DATA / r)) for n, r in GRAPHS
              if (DATA / r).is_dir()]
    for nodes in (100_000, 1_000_000):
        spec = SyntheticSpec(nodes=nodes, avg_degree=20.0, feature_dim=8)
        graphs.append((f"synthetic-{nodes:.0e}".replace("+0", ""),
                       lambda s=spec: load_dataset("synthetic", synthetic=s)))
    rows = []
    for name, load in graphs:
        g = load()
        for P in (4, 8):
            for m in METHODS:
                t0 = time.perf_counter()
                parts = partition_nodes(g, m, P, seed=0)
                secs = time.perf_counter() - t0
                st = partition_stats(g, parts)
                rows.append({"graph": name, "nodes": g.num_nodes, "edges": g.num_edges,
                             "parts": P, "method": m, "edge_cut_fraction": st["edge_cut_fraction"],
                             "balance": st["balance"], "halo_total": st["halo_total"],
                             "seconds": secs})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del g
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    out = ROOT / "benchmarks" / "results" / "partitioners"
    out.mkdir(parents=True, exist_ok=True)
    (out / "partitioners.json").write_text(json.dumps(
        {"commit": commit, "when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}, indent=1))
    md = ["# Partitioners: edge cut, balance, halo", "",
          "Edge cut = fraction of stored edges whose endpoints are in different parts; halo = "
          "total halo rows over all parts (what `halo` exchanges per layer); balance = largest "
          "part / mean. `ldg`: streamed Linear Deterministic Greedy, 5 passes in id order "
          "(the out-of-core default); `hash`: part from the node id alone.", "",
          "| graph | nodes | stored edges | P | " + " | ".join(
              f"{m} cut / halo / balance" for m in METHODS) + " |",
          "|---|---|---|---|" + "---|" * len(METHODS)]
    keys = sorted({(r["graph"], r["nodes"], r["edges"], r["parts"]) for r in rows},
                  key=lambda k: (k[1], k[0], k[3]))
    for gname, n, e, P in keys:
        cells = []
        for m in METHODS:
            r = next(r for r in rows if r["graph"] == gname and r["parts"] == P
                     and r["method"] == m)
            cells.append(f"{100 * r['edge_cut_fraction']:.1f} % / {r['halo_total']:,} / "
                         f"{r['balance']:.3f}")
        md.append(f"| {gname} | {n:,} | {e:,} | {P} | " + " | ".join(cells) + " |")
    md += ["", f"Command: `python benchmarks/bench_partitioners.py` ({time.strftime('%Y-%m-%d')}"
               f", commit {commit})", ""]
    (out / "partitioners.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
