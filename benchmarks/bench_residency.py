"""What enforced residency costs ``retexo``: the same runs with ``runtime.residency`` none and
features, on the same ``given`` sites, through ``quietgnn bench``'s ``run_matrix``.

    .venv/bin/python benchmarks/bench_residency.py            # the committed table
    .venv/bin/python benchmarks/bench_residency.py --datasets cora,citeseer --seeds 0,1,2

Sites (the ``given`` assignment, one per node, P = 4) come two ways, written under
``benchmarks/results/residency/sites/``: ``metis`` (sites that are communities: few remote
neighbours) and ``random`` (sites that cut most edges). Under ``features`` layer 0 aggregates
only the neighbours on its own site, so the cost grows with the cut. Writes
``benchmarks/results/residency/{results.jsonl, residency.json, residency.md}``: test accuracy,
training bytes per epoch, and the bytes that left the sites by class (every rank, every op).
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "residency"
DATA = ROOT.parent / "shared" / "data" / "planetoid"


def sites(dataset: str, method: str, parts: int) -> Path:
    """The ``given`` assignment file of ``dataset`` (``method``'s partition, written once)."""
    path = OUT / "sites" / f"{dataset}-{method}-p{parts}.npy"
    if not path.is_file():
        from quietgnn.datasets import load_dataset
        from quietgnn.partition import partition_nodes
        graph = load_dataset(dataset, str(DATA))
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.asarray(partition_nodes(graph, method, parts, seed=0), dtype=np.int16))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="cora")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--parts", type=int, default=4)
    args = ap.parse_args(argv)
    from quietgnn.analysis.matrix import RunSpec
    from quietgnn.analysis.runner import run_matrix
    specs = []
    for ds in args.datasets.split(","):
        for method in ("metis", "random"):
            f = sites(ds, method, args.parts).relative_to(ROOT)
            for level in ("none", "features"):
                for seed in (int(s) for s in args.seeds.split(",")):
                    specs.append(RunSpec(
                        dataset=ds, strategy="retexo", parts=args.parts, model="gcn", seed=seed,
                        label=f"retexo-{level}", dataset_label=f"{ds}-{method}-sites",
                        root=str(DATA), overrides={"partition.method": "given",
                                                   "partition.file": str(f),
                                                   "runtime.residency": level,
                                                   "train.epochs": 200}))
    results = [r.to_json() for r in run_matrix(specs, OUT, timeout_s=1800)]
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if r.get("status") != "ok":
            print(f"failed: {r['id']}: {r.get('error')}", file=sys.stderr)
            continue
        rows.setdefault((r["dataset"], r["strategy"]), []).append(r["summary"])
    table = []
    for (ds, label), runs in sorted(rows.items()):
        classes: dict[str, float] = {}
        for s in runs:
            for c, n in s["bytes_sent_by_class"].items():
                classes[c] = classes.get(c, 0) + n / len(runs)
        table.append({"sites": ds, "run": label, "seeds": len(runs),
                      "test_acc": st.mean(s["test_acc"] for s in runs),
                      "test_acc_sd": st.pstdev(s["test_acc"] for s in runs),
                      "train_bytes_per_epoch": st.mean(s["train_bytes_per_epoch"] for s in runs),
                      "bytes_sent_by_class": {c: round(n) for c, n in sorted(classes.items())}})
    (OUT / "residency.json").write_text(json.dumps(table, indent=1))
    lines = ["# retexo under enforced residency (P = %d, GCN 2 x 64, 200 rounds)" % args.parts,
             "", f"`.venv/bin/python benchmarks/bench_residency.py {' '.join(argv or sys.argv[1:])}`"
             .replace(" `", "`"), "",
             "| sites | residency | test acc (mean ± sd) | train KB/epoch | sent by class, whole "
             "run (KB) |", "|---|---|---|---|---|"]
    for t in table:
        by = ", ".join(f"{c} {n / 1e3:.1f}" for c, n in t["bytes_sent_by_class"].items())
        lines.append(f"| {t['sites']} | {t['run'].split('-', 1)[1]} | {t['test_acc']:.4f} ± "
                     f"{t['test_acc_sd']:.4f} | {t['train_bytes_per_epoch'] / 1e3:.1f} | {by} |")
    (OUT / "residency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
