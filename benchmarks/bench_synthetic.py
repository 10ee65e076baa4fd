"""The synthetic family's knobs, measured (#47): how hard each makes the graph, and how much of
the accuracy lives in the edges a partition cuts.

Every row is one spec: the ``hard`` preset (the default of ``quietgnn prepare synthetic``), the
``easy`` one (the field defaults), and the hard preset with one knob moved. Three `centralized`
GCN runs per spec, same model and epochs, on three graphs with the same nodes, features and
split:

* *graph*: the graph as generated - what an exact strategy (``halo`` and its kin) reaches;
* *cut*: only the edges inside a random 4-way partition kept (three quarters of the edges
  gone) - what a strategy that never looks across parts would reach;
* *features*: no edges at all - an MLP's view.

``graph - features`` is what the edges are worth, ``graph - cut`` what ignoring the
cross-partition ones costs. Run (one process at a time; ~20 s a run at the default size)::

    python benchmarks/bench_synthetic.py                    # -> benchmarks/results/synthetic/
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

import quietgnn
from quietgnn.datasets.synthetic import PRESETS, SyntheticSpec, make_synthetic
from quietgnn.graph import Graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _study import write_report  # noqa: E402

#: (label, the knobs set over the hard preset); the first two rows are the presets themselves
ROWS: list[tuple[str, dict]] = [
    ("hard (prepare's default)", {}),
    ("easy (the field defaults)", {"easy": True}),
    ("homophily 0.8", {"homophily": 0.8}),
    ("homophily 0.4", {"homophily": 0.4}),
    ("feature_noise 2", {"feature_noise": 2.0}),
    ("feature_noise 4", {"feature_noise": 4.0}),
    ("signal_fraction 1 (all)", {"signal_fraction": 1.0}),
    ("signal_fraction 1/16", {"signal_fraction": 0.0625}),
    ("class_imbalance 0", {"class_imbalance": 0.0}),
    ("class_imbalance 1.5", {"class_imbalance": 1.5}),
    ("degree_skew 0 (none)", {"degree_skew": 0.0}),
    ("avg_degree 5", {"avg_degree": 5.0}),
]


def _keep_edges(g: Graph, keep: torch.Tensor, name: str) -> Graph:
    """``g`` with only the stored edges where ``keep`` holds (features, labels, split kept)."""
    dst = g.edge_dst()
    return Graph.from_edge_index(torch.stack([g.indices[keep], dst[keep]]), g.x, g.y,
                                 train_mask=g.train_mask, val_mask=g.val_mask,
                                 test_mask=g.test_mask, num_classes=g.num_classes, name=name)


def _run(g: Graph, epochs: int, work: str, label: str) -> dict:
    r = quietgnn.train(g, strategy="centralized", epochs=epochs, out=work, run_name=label,
                       overwrite=True, seed=0)
    s = r.summary
    return {"test_acc": s.test_acc, "val_acc": s.val_acc, "best_epoch": s.best_epoch}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--only", default="", help="comma-separated row numbers (0-based)")
    ap.add_argument("--out", default="benchmarks/results/synthetic")
    args = ap.parse_args()
    out = Path(args.out)
    rows = [r for i, r in enumerate(ROWS) if not args.only or str(i) in args.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="quietgnn-synthetic-") as work:
        for label, knobs in rows:
            base = {} if knobs.get("easy") else dict(PRESETS["hard"])
            spec = SyntheticSpec(**{**base, **{k: v for k, v in knobs.items() if k != "easy"},
                                    "nodes": args.nodes})
            g = make_synthetic(spec)
            # a seed of its own: the generator's seed 0 drew the labels with the same call, and
            # a partition that follows the labels would keep the same-class edges
            part = torch.randint(0, 4, (g.num_nodes,),
                                 generator=torch.Generator().manual_seed(20261127))
            inside = part[g.indices] == part[g.edge_dst()]
            row = {"label": label, "spec": asdict(spec), "homophily": g.meta["homophily"],
                   "largest_class": round(float(torch.bincount(g.y).max()) / g.num_nodes, 3),
                   "cut_fraction": round(1 - float(inside.double().mean()), 3)}
            for name, graph in (("graph", g), ("cut", _keep_edges(g, inside, "cut")),
                                ("features", _keep_edges(g, torch.zeros_like(inside), "none"))):
                row[name] = _run(graph, args.epochs, work, name)
                print(f"{label}: {name} {row[name]['test_acc']:.4f}", file=sys.stderr, flush=True)
            results.append(row)
    lines = ["# The synthetic family: what each knob does (#47)", "",
             f"`python benchmarks/bench_synthetic.py --nodes {args.nodes} --epochs "
             f"{args.epochs}`. `centralized` GCN (the default model: 2 layers, hidden 64), "
             f"{args.epochs} epochs, seed 0, test accuracy at the best validation epoch, on "
             f"{args.nodes:,} nodes. *graph*: the graph as generated; *cut*: only the edges "
             "inside a random 4-way partition; *features*: no edges. Each row is the `hard` "
             "preset (avg_degree 20, homophily 0.6, feature_noise 3, signal_fraction 0.25: 16 "
             "of 64 columns, class_imbalance 0.5, degree_skew 2.5) with one knob moved, except "
             "`easy`.", "",
             "| spec | edge homophily | largest class | graph | cut | features | "
             "graph − cut | graph − features |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        g, c, f = (r[k]["test_acc"] for k in ("graph", "cut", "features"))
        lines.append(f"| {r['label']} | {r['homophily']:.3f} | {r['largest_class']:.3f} | "
                     f"{g:.3f} | {c:.3f} | {f:.3f} | {100 * (g - c):+.1f} | "
                     f"{100 * (g - f):+.1f} |")
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "synthetic.md", lines, out / "synthetic.json",
                 {"command": " ".join(sys.argv), "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
