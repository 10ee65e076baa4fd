"""`minibatch` vs `centralized` accuracy and bytes per epoch vs `halo` (issue 8).

For Amazon Computers and Coauthor CS (``load_dataset``: random 60/20/20 split, seed 0):

* ``centralized``: full-batch GraphSAGE (2 layers, hidden 64, dropout 0.5, Adam lr 0.01,
  wd 5e-4), best-validation test accuracy;
* ``minibatch``: the same model, P ranks (gloo processes), METIS partitions, fanouts 25,10,
  batch 512, bulk k = 4, replicated topology; best-validation test accuracy (global exact
  evaluation);
* bytes per epoch (train phase, summed over ranks, per rank mean) of ``minibatch`` and of
  ``halo`` with the same P and partitions; setup bytes (topology replication) reported apart.

Run: ``/work/venv/bin/python benchmarks/bench_minibatch.py [--datasets computers,cs]``
Writes ``benchmarks/results/minibatch.{json,md}``. The machine is small and shared: epochs are
scaled down (see the table) and times are indicative only.
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

from bench_sampling import load_real  # noqa: E402
from quietgnn.comm import Communicator  # noqa: E402
from quietgnn.nn import ModelConfig  # noqa: E402
from quietgnn.partition import build_partitions, partition_nodes  # noqa: E402
from quietgnn.runtime.launcher import spawn_function  # noqa: E402
from quietgnn.strategies.base import TrainConfig, WorkerContext  # noqa: E402
from quietgnn.strategies.halo import Halo  # noqa: E402
from quietgnn.strategies.minibatch import MiniBatch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODEL = dict(arch="sage", hidden=64, layers=2, dropout=0.5)


def _run(comm, graph, parts, strategy, opts, epochs, eval_every):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                        model_cfg=ModelConfig(**MODEL),
                        train_cfg=TrainConfig(seed=0, lr=0.01, weight_decay=5e-4))
    s = MiniBatch(ctx, MiniBatch.Options(**opts)) if strategy == "minibatch" else Halo(ctx)
    t0 = time.perf_counter()
    with comm.phase("setup"):
        s.setup()
    setup_bytes = sum(r.bytes_sent for r in comm.take_records())
    best = {"val": -1.0, "test": float("nan"), "epoch": -1}
    train_bytes, kinds, t_train = [], {}, 0.0
    curve = []
    for e in range(epochs):
        comm.epoch = e
        t1 = time.perf_counter()
        with comm.phase("train"):
            res = s.train_epoch(e)
        t_train += time.perf_counter() - t1
        recs = comm.take_records()
        train_bytes.append(sum(r.bytes_sent for r in recs))
        for r in recs:
            kinds[r.kind] = kinds.get(r.kind, 0) + r.bytes_sent
        if (e + 1) % eval_every == 0 or e == epochs - 1:
            with comm.phase("eval"):
                acc = s.evaluate()
            comm.take_records()
            curve.append((e, res.loss, acc["val"], acc["test"]))
            if acc["val"] > best["val"]:
                best = {"val": acc["val"], "test": acc["test"], "epoch": e}
    return {"best": best, "setup_bytes": setup_bytes, "train_bytes_per_epoch":
            float(np.mean(train_bytes)), "bytes_by_kind_per_epoch":
            {k: v / epochs for k, v in kinds.items()}, "train_s": t_train,
            "wall_s": time.perf_counter() - t0, "steps_per_epoch": res.steps, "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="computers,cs")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--central-epochs", default="computers:100,cs:40")
    ap.add_argument("--mb-epochs", default="computers:10,cs:5")
    ap.add_argument("--bytes-parts", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--out", default="minibatch")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cep = dict((k, int(v)) for k, v in (x.split(":") for x in args.central_epochs.split(",")))
    mep = dict((k, int(v)) for k, v in (x.split(":") for x in args.mb_epochs.split(",")))
    opts = {"fanouts": "25,10", "batch_size": args.batch_size, "bulk": 4}
    out = []
    for name in args.datasets.split(","):
        g = load_real(name)
        if g is None:
            print(f"{name}: data not found, skipped")
            continue
        zero = np.zeros(g.num_nodes, dtype=np.int64)
        central = _run(Communicator(0, 1), g, zero, "centralized", None, cep[name], 5)
        print(name, "centralized", central["best"], f"{central['wall_s']:.0f}s", flush=True)
        parts = partition_nodes(g, "metis", args.parts, seed=0)
        mb = spawn_function(_run, args.parts, args=(g, parts, "minibatch", opts, mep[name], 1),
                            timeout_s=3000, comm_timeout_s=600)
        print(name, "minibatch", mb[0]["best"], f"{mb[0]['wall_s']:.0f}s", flush=True)
        P = args.bytes_parts
        parts_b = partition_nodes(g, "metis", P, seed=0)
        mb_b = spawn_function(_run, P, args=(g, parts_b, "minibatch", opts, 1, 1),
                              timeout_s=3000, comm_timeout_s=600)
        halo_b = spawn_function(_run, P, args=(g, parts_b, "halo", None, 1, 1), timeout_s=3000, comm_timeout_s=600)
        row = {"dataset": name, "nodes": g.num_nodes, "edges": g.num_edges,
               "features": g.num_features, "model": MODEL, "minibatch_options": opts,
               "centralized": {"epochs": cep[name], **central["best"],
                               "wall_s": central["wall_s"]},
               "minibatch": {"P": args.parts, "epochs": mep[name], **mb[0]["best"],
                             "steps_per_epoch": mb[0]["steps_per_epoch"],
                             "wall_s": max(r["wall_s"] for r in mb), "curve": mb[0]["curve"]},
               "delta_test_points": 100 * (mb[0]["best"]["test"] - central["best"]["test"]),
               "bytes": {"P": P,
                         "minibatch_train_per_epoch_per_rank":
                             float(np.mean([r["train_bytes_per_epoch"] for r in mb_b])),
                         "halo_train_per_epoch_per_rank":
                             float(np.mean([r["train_bytes_per_epoch"] for r in halo_b])),
                         "minibatch_setup_per_rank":
                             float(np.mean([r["setup_bytes"] for r in mb_b])),
                         "minibatch_by_kind_rank0": mb_b[0]["bytes_by_kind_per_epoch"],
                         "halo_by_kind_rank0": halo_b[0]["bytes_by_kind_per_epoch"]}}
        out.append(row)
        print(json.dumps(row["bytes"]), flush=True)
        write(out, args)


def write(out: list, args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1))
    md = ["# `minibatch` vs `centralized` (accuracy) and vs `halo` (bytes)", "",
          f"`python benchmarks/bench_minibatch.py {' '.join(sys.argv[1:])}` -- GraphSAGE 2x64, "
          f"fanouts 25,10, batch {args.batch_size}, bulk 4, replicated topology; random 60/20/20 split (seed 0); best-validation test "
          "accuracy; epochs scaled down for a shared 2-core machine.", "",
          "| dataset | centralized test (epochs) | minibatch test (P, epochs, steps/epoch) | "
          "delta (points) |", "|---|---:|---:|---:|"]
    for r in out:
        c, m = r["centralized"], r["minibatch"]
        md.append(f"| {r['dataset']} | {100 * c['test']:.2f} ({c['epochs']}) | "
                  f"{100 * m['test']:.2f} (P={m['P']}, {m['epochs']}, {m['steps_per_epoch']}) | "
                  f"{r['delta_test_points']:+.2f} |")
    md += ["", "Bytes sent per rank per training epoch (P = 4, METIS):", "",
           "| dataset | minibatch | halo | minibatch / halo | minibatch setup (topology) |",
           "|---|---:|---:|---:|---:|"]
    for r in out:
        b = r["bytes"]
        md.append(f"| {r['dataset']} | {b['minibatch_train_per_epoch_per_rank'] / 1e6:.2f} MB | "
                  f"{b['halo_train_per_epoch_per_rank'] / 1e6:.2f} MB | "
                  f"{b['minibatch_train_per_epoch_per_rank'] / b['halo_train_per_epoch_per_rank']:.2f} | "
                  f"{b['minibatch_setup_per_rank'] / 1e6:.2f} MB |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)


if __name__ == "__main__":
    main()
