"""`minibatch` vs `centralized` accuracy and bytes per epoch vs `halo` (issue 8).

For Amazon Computers and Coauthor CS (``load_dataset``: random 60/20/20 split, seed 0):

* ``centralized``: full-batch GraphSAGE (2 layers, hidden 64, dropout 0.5, Adam, weight
  decay 5e-4), one optimizer step per epoch, evaluated every ``--central-eval-every`` epochs;
* ``minibatch``: the same model and optimizer settings, P ranks (gloo processes), METIS
  partitions, fanouts 25,10, batch 512, bulk k = 4, replicated topology; one step per
  minibatch; global exact evaluation every ``--mb-eval-every`` epochs;
* both report the test accuracy at the best validation evaluation; the learning rate is the
  same for both (``--lr``), the epoch budgets differ (a full-batch epoch is one step, a
  minibatch epoch is ``|train| / batch`` steps) and are chosen so that both curves have
  flattened (the curves are in the JSON);
* bytes per epoch (train phase, per rank mean) of ``minibatch`` and of ``halo`` with the
  same P and partitions; setup bytes (topology replication) reported apart.

Run (the exact commands of the committed results are in ``minibatch.md``)::

    python benchmarks/bench_minibatch.py --datasets computers --out minibatch-computers
    python benchmarks/bench_minibatch.py --datasets cs --out minibatch-cs
    python benchmarks/bench_minibatch.py --merge minibatch-computers,minibatch-cs

Writes ``benchmarks/results/minibatch/<out>.{json,md}``. The machine is small and shared: wall times
are indicative only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _study import run_job  # noqa: E402
from bench_sampling import load_real  # noqa: E402
from quietgnn.comm import Communicator  # noqa: E402
from quietgnn.partition import build_partitions, partition_nodes  # noqa: E402
from quietgnn.runtime.spawn import spawn_function  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "minibatch"
MODEL = dict(arch="sage", hidden=64, layers=2, dropout=0.5)
WD = 5e-4


def _run(comm, graph, parts, strategy, opts, epochs, eval_every, lr):
    """One configuration on this rank's part, through the package's trainer (``_study``)."""
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    t0 = time.perf_counter()
    run = run_job(comm, part, {"strategy": strategy, "options": opts or {}, "model": MODEL,
                               "eval_every": eval_every,
                               "train": {"epochs": epochs, "lr": lr, "weight_decay": WD,
                                         "seed": 0}})
    setup, recs = run["records"][0], run["records"][1:]
    kinds: dict[str, float] = {}
    for r in recs:
        for k, v in r["bytes_by_kind"].items():
            if k.startswith("train/"):
                kinds[k[len("train/"):]] = kinds.get(k[len("train/"):], 0) + v
    curve = [(r["epoch"], r["loss"], r["val_acc"], r["test_acc"]) for r in recs
             if r["val_acc"] is not None]
    e, _, val, test = max(curve, key=lambda c: (c[2], -c[0]))    # the first of equals
    return {"best": {"val": val, "test": test, "epoch": e},
            "setup_bytes": sum(b["sent"] for b in setup["bytes"].values()),
            "train_bytes_per_epoch": float(np.mean([r["bytes"].get("train", {}).get("sent", 0)
                                                    for r in recs])),
            "bytes_by_kind_per_epoch": {k: v / epochs for k, v in kinds.items()},
            "train_s": sum(r["wall_s"] - r["eval_s"] for r in recs),
            "wall_s": time.perf_counter() - t0, "steps_per_epoch": recs[-1]["steps"],
            "curve": curve}


def _per(spec: str) -> dict[str, int]:
    return dict((k, int(v)) for k, v in (x.split(":") for x in spec.split(",")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="computers,cs")
    ap.add_argument("--parts", type=int, default=2, help="ranks of the accuracy run")
    ap.add_argument("--central-epochs", default="computers:1500,cs:400")
    ap.add_argument("--mb-epochs", default="computers:100,cs:40")
    ap.add_argument("--central-eval-every", type=int, default=10)
    ap.add_argument("--mb-eval-every", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01, help="Adam, both strategies")
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--bytes-parts", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--bulk", type=int, default=4)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: central, mb, "
                    "bytes (rows then keep the values of the existing JSON, if any)")
    ap.add_argument("--out", default="minibatch")
    ap.add_argument("--merge", default="", help="comma list of result names (e.g. "
                    "minibatch-computers,minibatch-cs) to combine into --out; runs nothing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.merge:
        rows = [r for name in args.merge.split(",")
                for r in json.loads((RESULTS / f"{name}.json").read_text())]
        write(rows, args)
        return
    cep, mep = _per(args.central_epochs), _per(args.mb_epochs)
    skip = set(filter(None, args.skip.split(",")))
    opts = {"fanouts": args.fanouts, "batch_size": args.batch_size, "bulk": args.bulk}
    old_path = RESULTS / f"{args.out}.json"
    old = {r["dataset"]: r for r in json.loads(old_path.read_text())} if old_path.exists() \
        else {}
    out = []
    cmd = "python benchmarks/bench_minibatch.py " + " ".join(sys.argv[1:])
    for name in args.datasets.split(","):
        g = load_real(name)
        if g is None:
            print(f"{name}: data not found, skipped")
            continue
        prev = old.get(name, {})
        row = {"dataset": name, "nodes": g.num_nodes, "edges": g.num_edges,
               "features": g.num_features, "train_nodes": int(g.train_mask.sum()),
               "model": MODEL, "weight_decay": WD, "minibatch_options": opts}
        if "central" in skip and "centralized" in prev:
            row["centralized"] = prev["centralized"]
        else:
            zero = np.zeros(g.num_nodes, dtype=np.int64)
            # halo on one rank: the whole graph, nothing crosses (what this column has run)
            c = _run(Communicator(0, 1), g, zero, "halo", None, cep[name],
                     args.central_eval_every, args.lr)
            row["centralized"] = {"epochs": cep[name], "lr": args.lr, **c["best"],
                                  "wall_s": c["wall_s"], "curve": c["curve"], "command": cmd}
        print(name, "centralized", row["centralized"]["test"], flush=True)
        if "mb" in skip and "minibatch" in prev:
            row["minibatch"] = prev["minibatch"]
        else:
            parts = partition_nodes(g, "metis", args.parts, seed=0)
            mb = spawn_function(_run, args.parts, args=(g, parts, "minibatch", opts, mep[name],
                                                        args.mb_eval_every, args.lr),
                                timeout_s=20000, comm_timeout_s=600)
            row["minibatch"] = {"P": args.parts, "epochs": mep[name], "lr": args.lr,
                                **mb[0]["best"], "steps_per_epoch": mb[0]["steps_per_epoch"],
                                "wall_s": max(r["wall_s"] for r in mb),
                                "curve": mb[0]["curve"], "command": cmd}
        print(name, "minibatch", row["minibatch"]["test"], flush=True)
        row["delta_test_points"] = 100 * (row["minibatch"]["test"] -
                                          row["centralized"]["test"])
        if "bytes" in skip and "bytes" in prev:
            row["bytes"] = prev["bytes"]
        else:
            P = args.bytes_parts
            parts_b = partition_nodes(g, "metis", P, seed=0)
            mb_b = spawn_function(_run, P, args=(g, parts_b, "minibatch", opts, 1, 1, args.lr),
                                  timeout_s=3000, comm_timeout_s=600)
            halo_b = spawn_function(_run, P, args=(g, parts_b, "halo", None, 1, 1, args.lr),
                                    timeout_s=3000, comm_timeout_s=600)
            row["bytes"] = {
                "P": P, "command": cmd, "steps_per_epoch": mb_b[0]["steps_per_epoch"],
                "minibatch_train_per_epoch_per_rank":
                    float(np.mean([r["train_bytes_per_epoch"] for r in mb_b])),
                "halo_train_per_epoch_per_rank":
                    float(np.mean([r["train_bytes_per_epoch"] for r in halo_b])),
                "minibatch_setup_per_rank": float(np.mean([r["setup_bytes"] for r in mb_b])),
                "halo_setup_per_rank": float(np.mean([r["setup_bytes"] for r in halo_b])),
                "minibatch_by_kind_per_rank": _mean_kinds(mb_b),
                "halo_by_kind_per_rank": _mean_kinds(halo_b)}
            print(json.dumps(row["bytes"]), flush=True)
        out.append(row)
        write(out, args)


def _mean_kinds(results: list[dict]) -> dict[str, float]:
    keys = sorted({k for r in results for k in r["bytes_by_kind_per_epoch"]})
    return {k: float(np.mean([r["bytes_by_kind_per_epoch"].get(k, 0.0) for r in results]))
            for k in keys}


def write(out: list, args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    (RESULTS / f"{args.out}.md").write_text(render(out))
    print(render(out), flush=True)


def render(out: list) -> str:
    md = ["# `minibatch` vs `centralized` (accuracy) and vs `halo` (bytes)", "",
          f"GraphSAGE {MODEL['layers']}x{MODEL['hidden']} (dropout {MODEL['dropout']}), Adam "
          f"with weight decay {WD}, the same learning rate for both strategies; random 60/20/20 "
          "split (seed 0); test accuracy at the best validation evaluation. `centralized` is "
          "full-batch (one step per epoch), `minibatch` takes one step per minibatch "
          "(steps/epoch in the table) with global exact evaluation.", "",
          "| dataset | centralized test (epochs, best at) | minibatch test (P, fanouts, batch, "
          "bulk; epochs x steps, best at) | delta (points) |", "|---|---:|---:|---:|"]
    for r in out:
        c, m, o = r["centralized"], r["minibatch"], r["minibatch_options"]
        md.append(f"| {r['dataset']} | {100 * c['test']:.2f} ({c['epochs']}, {c['epoch'] + 1}) |"
                  f" {100 * m['test']:.2f} (P={m['P']}, {o['fanouts']}, {o['batch_size']}, "
                  f"{o['bulk']}; {m['epochs']} x {m['steps_per_epoch']}, {m['epoch'] + 1}) | "
                  f"{r['delta_test_points']:+.2f} |")
    md += ["", "Commands:", ""]
    for r in out:
        for key in ("centralized", "minibatch", "bytes"):
            md.append(f"- {r['dataset']} {key}: `{r[key].get('command', '?')}`")
    md += ["", "Bytes sent per rank per training epoch (METIS partitions; setup apart):", "",
           "| dataset | P | minibatch | halo | minibatch / halo | minibatch: feature rows + ids "
           "| minibatch: gradients | minibatch setup (topology) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in out:
        b = r["bytes"]
        k = b["minibatch_by_kind_per_rank"]
        feat = sum(v for kk, v in k.items() if kk.startswith("feature_fetch"))
        grad = sum(v for kk, v in k.items() if kk.startswith("grad"))
        md.append(f"| {r['dataset']} | {b['P']} | "
                  f"{b['minibatch_train_per_epoch_per_rank'] / 1e6:.2f} MB | "
                  f"{b['halo_train_per_epoch_per_rank'] / 1e6:.2f} MB | "
                  f"{b['minibatch_train_per_epoch_per_rank'] / b['halo_train_per_epoch_per_rank']:.2f} | "
                  f"{feat / 1e6:.2f} MB | {grad / 1e6:.2f} MB | "
                  f"{b['minibatch_setup_per_rank'] / 1e6:.2f} MB |")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
