"""RETEXO vs halo vs centralized: training bytes over a run, accuracy gap, projected time to
accuracy on the WAN and edge tiers.

    .venv/bin/python benchmarks/bench_retexo.py                  # the committed tables
    .venv/bin/python benchmarks/bench_retexo.py --quick          # smoke run (a few minutes)
    .venv/bin/python benchmarks/bench_retexo.py --tables-only    # redraw retexo.md from json

Two kinds of runs, one compute thread per process:

* **accuracy** (P = 1, in this process): ``centralized`` and ``retexo`` for every dataset, model
  and seed, evaluated every epoch. RETEXO at P ranks computes what it computes at P = 1 (global
  degrees, summed gradients; ``tests/test_retexo.py`` checks P = 1, 2, 4 against a
  single-process reference) except for the dropout masks, which each rank draws for its own
  nodes; so the seed statistics come from the cheap runs, and the distributed seed-0 runs are
  further samples of the same distribution.
* **traffic / time** (P ranks, ``spawn_function``: real gloo processes on 127.0.0.1, seed 0):
  ``retexo`` and ``halo`` trained for the *same number of rounds* (epochs), METIS partitions,
  evaluated every ``--eval-every`` epochs. Bytes do not depend on the seed (fixed message
  sizes). Every communicator record is kept, so :mod:`quietgnn.analysis.projection` replays the run on
  the LAN / WAN / edge tiers (alpha-beta model + slowest rank's compute per epoch).

Training bytes = phase ``train``, sent, summed over ranks and epochs (evaluation excluded for
both). RETEXO runs ``rounds_per_layer = epochs / layers`` rounds per layer. Accuracy = test
accuracy of the final RETEXO model (every layer's best-validation parameters); centralized and
halo: test accuracy at the best validation epoch. Time to accuracy (TTA): projected seconds of
training until the test accuracy first reaches ``--tta-frac`` x the centralized mean (seeds);
RETEXO's curve before its last layer is the stage model (layer k with its head), which is a
usable classifier. Writes ``benchmarks/results/retexo/retexo.json`` and ``retexo.md``; resumable: runs
already in the JSON are skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# the schedule of the public RETEXO code (aashishkolluri/retexo-distributed, its node
# classification configs): 200 rounds per layer, a fresh Adam at lr 0.003 for each
PAPER_ROUNDS, PAPER_LR = 200, 0.003
ROOTS = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon", "cs": "coauthor"}


def load_graph(name: str):
    from quietgnn.datasets import load_dataset
    sub = ROOTS.get(name)
    return load_dataset(name, str(ROOT.parent / "shared" / "data" / sub) if sub else None)


# ---------------------------------------------------------------------- one run
def _run_group(comm, graph, parts, jobs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every job on this rank's part, through the package's trainer (``_study``)."""
    from _study import run_jobs
    from quietgnn.partition import build_partitions
    return [run["records"] for run in
            run_jobs(comm, build_partitions(graph, parts, ranks=[comm.rank])[0], jobs)]


def summarise(job: dict[str, Any], metrics: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    from quietgnn.analysis.projection import epoch_curve
    curve = epoch_curve(metrics).to_json(columns=False)
    rows = curve["epochs"]
    evald = [r for r in rows if r["val_acc"] is not None]
    best = max(evald, key=lambda r: r["val_acc"])
    kinds: dict[str, int] = {}
    for recs in metrics.values():
        for rec in recs[1:]:
            for k, v in rec["bytes_by_kind"].items():
                kinds[k] = kinds.get(k, 0) + v
    return {k: job[k] for k in ("key", "dataset", "label", "strategy", "P", "seed",
                                "options")} | {
        "model": job["model"]["arch"], "epochs": len(rows),
        "test_best": best["test_acc"], "val_best": best["val_acc"], "best_epoch": best["epoch"],
        "test_final": evald[-1]["test_acc"], "val_final": evald[-1]["val_acc"],
        "train_bytes": sum(r["train_bytes"] for r in rows),
        "eval_bytes": sum(r["eval_bytes"] for r in rows),
        "setup_bytes": curve["setup"]["bytes"], "bytes_by_kind": dict(sorted(kinds.items())),
        "compute_s": sum(r["compute_s"] for r in rows),
        "curve": [{k: r[k] for k in ("epoch", "compute_s", "hops", "crit_bytes", "test_acc")}
                  for r in rows]}


# ---------------------------------------------------------------------- the matrix
def make_job(cfg, dataset: str, label: str, arch: str, P: int, seed: int) -> dict[str, Any]:
    """``label``: a strategy name, ``retexo-logits`` (the logit-passing variant) or
    ``retexo-paper`` (the schedule the RETEXO code prescribes: PAPER_ROUNDS rounds per layer at
    Adam lr PAPER_LR, every other setting as for the others)."""
    epochs = cfg.epochs_big if dataset in cfg.big else cfg.epochs
    strategy = label.split("-")[0]
    lr = 0.01
    if label == "retexo-paper":
        epochs, lr = PAPER_ROUNDS * cfg.layers, PAPER_LR
    opts = {"rounds_per_layer": epochs // cfg.layers} if strategy == "retexo" else {}
    if label == "retexo-logits":
        opts["embed"] = "logits"
    return {"key": f"{dataset}|{label}|{arch}|P{P}|s{seed}", "dataset": dataset,
            "label": label, "strategy": strategy, "P": P, "seed": seed, "options": opts,
            "eval_every": 1 if P == 1 else cfg.eval_every,
            "model": {"arch": arch, "layers": cfg.layers, "hidden": 64, "dropout": 0.5,
                      "heads": 4},
            "train": {"epochs": epochs, "lr": lr, "weight_decay": 5e-4, "seed": seed}}


def run_matrix(cfg, runs: dict[str, Any], save) -> None:
    from _study import run_job
    from quietgnn.comm import Communicator
    from quietgnn.partition import build_partitions, partition_nodes
    from quietgnn.runtime.spawn import spawn_function
    for dataset in cfg.datasets:
        graph = None
        seeds = cfg.seeds_big if dataset in cfg.big else cfg.seeds
        todo = [make_job(cfg, dataset, s, a, 1, seed) for a in cfg.models
                for seed in range(seeds) for s in ("centralized", "retexo")]
        if dataset in cfg.logits_on:
            todo += [make_job(cfg, dataset, "retexo-logits", "gcn", 1, seed)
                     for seed in range(seeds)]
        if dataset in cfg.paper_on:
            todo += [make_job(cfg, dataset, "retexo-paper", a, 1, seed) for a in cfg.models
                     for seed in range(seeds)]
        for job in [j for j in todo if j["key"] not in runs]:
            if graph is None:
                graph = load_graph(dataset)
                print(f"[{dataset}] {graph.num_nodes} nodes, {graph.num_edges} edges, "
                      f"{graph.num_features} features", flush=True)
                part1 = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
            t0 = time.time()
            runs[job["key"]] = summarise(job, {0: run_job(Communicator(0, 1), part1, job)["records"]})
            print(f"  {job['key']}: {time.time() - t0:.0f}s", flush=True)
            save(runs)
        if cfg.accuracy_only:
            continue
        for P in [p for p in cfg.parts if p <= 8 or dataset in cfg.p32]:
            jobs = [make_job(cfg, dataset, s, a, P, 0) for a in cfg.models
                    for s in ("retexo", "halo")]
            if dataset in cfg.logits_on:
                jobs.append(make_job(cfg, dataset, "retexo-logits", "gcn", P, 0))
            jobs = [j for j in jobs if j["key"] not in runs]
            if not jobs:
                continue
            graph = graph if graph is not None else load_graph(dataset)
            parts = partition_nodes(graph, "metis", P, seed=0)
            t0 = time.time()
            per_rank = spawn_function(_run_group, P, args=(graph, parts, jobs),
                                      timeout_s=cfg.timeout, comm_timeout_s=600)
            for i, job in enumerate(jobs):
                runs[job["key"]] = summarise(job, {r: per_rank[r][i] for r in range(P)})
            print(f"  {dataset} P={P}: {len(jobs)} runs in {time.time() - t0:.0f}s", flush=True)
            save(runs)


# ---------------------------------------------------------------------- tables
def _mean(xs):
    xs = [x for x in xs if x is not None]
    return st.mean(xs) if xs else None


def _pct(x, signed=False):
    return "n/a" if x is None else (f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}")


def _sd(xs):
    return f" ± {100 * st.stdev(xs):.1f}" if len(xs) > 1 else ""


def _bytes(b):
    for u, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.2f} {u}"
    return f"{b:.0f} B"


def _tta(run, tier: str, target: float):
    from quietgnn.analysis.projection import time_to_accuracy
    from quietgnn.comm.network import TIERS
    got = time_to_accuracy({"epochs": run["curve"]}, TIERS[tier], target)
    return None if got is None else got.cum_s


def _s(x):
    return "never" if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.2f}")


def tables(runs: dict[str, Any], cfg) -> str:
    def get(ds, strat, arch, P, seed=None):
        return [r for r in runs.values() if (r["dataset"], r["label"], r["model"], r["P"]) ==
                (ds, strat, arch, P) and (seed is None or r["seed"] == seed)]

    combos = sorted({(r["dataset"], r["model"]) for r in runs.values()},
                    key=lambda t: (cfg.datasets.index(t[0]) if t[0] in cfg.datasets else 99,
                                   t[1]))
    per_ds = []
    for ds in dict.fromkeys(d for d, _ in combos):
        cen = [r for r in runs.values() if r["dataset"] == ds and r["label"] == "centralized"]
        per_ds.append(f"{ds} {max(r['epochs'] for r in cen)} epochs x "
                      f"{len({r['seed'] for r in cen})} seed(s)" if cen else ds)
    L = ["# RETEXO benchmark", "",
         "2-layer models, hidden 64 (GAT: 4 heads), dropout 0.5, Adam lr 0.01, weight decay "
         "5e-4, for every strategy. Epochs (= rounds) and accuracy seeds per dataset: "
         f"{'; '.join(per_ds)} (fewer where the shared 2-core CPU budget forced it). RETEXO: "
         "rounds_per_layer = epochs / 2, so it runs as many rounds as halo runs epochs. "
         "Traffic/time runs use seed 0 (bytes do not depend on the seed). Partitions: METIS. "
         "One compute thread per process.", "",
         "## Accuracy (test, %)", "",
         "centralized: at the best validation epoch; RETEXO: the final model (every layer's "
         "best-validation parameters). Mean ± std over seeds at P = 1. RETEXO at P ranks "
         "computes what it computes at P = 1 except for the dropout masks, which each rank "
         "draws for its own nodes: the seed-0 runs at P = 4/8/32 are further samples, not "
         "copies.", "",
         f"Last column: retexo with the schedule of the paper's code, {PAPER_ROUNDS} rounds "
         f"per layer at lr {PAPER_LR} (P = 1, same seeds; n/a: not run).", "",
         "| dataset | model | centralized | retexo | gap (retexo - centr.) | within 1.5? | "
         "retexo seed 0 at P = 1 / 4 / 8 / 32 | halo seed 0, P = 4 | retexo, paper schedule "
         "(gap) |",
         "|---|---|---|---|---|---|---|---|---|"]
    for ds, arch in combos:
        c = [r["test_best"] for r in get(ds, "centralized", arch, 1)]
        x = [r["test_final"] for r in get(ds, "retexo", arch, 1)]
        if not c or not x:
            continue
        gap = _mean(x) - _mean(c)
        dist = " / ".join(_pct((get(ds, "retexo", arch, P, 0) or [{}])[0].get("test_final"))
                          for P in (1, 4, 8, 32))
        h = get(ds, "halo", arch, 4, 0)
        pp = [r["test_final"] for r in get(ds, "retexo-paper", arch, 1)]
        paper = f"{_pct(_mean(pp))}{_sd(pp)} ({_pct(_mean(pp) - _mean(c), True)})" if pp else \
            "n/a"
        L.append(f"| {ds} | {arch} | {_pct(_mean(c))}{_sd(c)} | {_pct(_mean(x))}{_sd(x)} | "
                 f"{_pct(gap, True)} | {'yes' if gap >= -0.015 else '**no**'} | {dist} | "
                 f"{_pct(h[0]['test_best']) if h else 'n/a'} | {paper} |")
    L += ["", "## Training bytes over a run (sent, all ranks)", "",
          "Same number of rounds for both. RETEXO = `embed_fwd` (one boundary exchange per "
          "layer) + `grad_allreduce` (one per round, gradients of one layer) + `val_counts` "
          "(one float per layer).", "",
          "| dataset | model | P | rounds | halo | retexo | halo / retexo | >= 50x? | "
          "retexo embed | retexo grads | halo: halo rows / grads |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds, arch in combos:
        for P in cfg.parts:
            h, x = get(ds, "halo", arch, P, 0), get(ds, "retexo", arch, P, 0)
            if not h or not x:
                continue
            h, x = h[0], x[0]
            k, hk = x["bytes_by_kind"], h["bytes_by_kind"]
            ratio = h["train_bytes"] / max(1, x["train_bytes"])
            rows_h = hk.get("train/halo_fwd", 0) + hk.get("train/halo_bwd", 0)
            L.append(f"| {ds} | {arch} | {P} | {x['epochs']} | {_bytes(h['train_bytes'])} | "
                     f"{_bytes(x['train_bytes'])} | {ratio:.1f}x | "
                     f"{'yes' if ratio >= 50 else '**no**'} | "
                     f"{_bytes(k.get('train/embed_fwd', 0))} | "
                     f"{_bytes(k.get('train/grad_allreduce', 0))} | "
                     f"{_bytes(rows_h)} / {_bytes(hk.get('train/grad_allreduce', 0))} |")
    L += ["", "## Logit-passing variant (GCN): layer 0 passes its C class logits instead of "
          "the hidden embedding", "",
          "| dataset | retexo (hidden) | retexo-logits | P | embed bytes hidden / logits | "
          "train bytes hidden / logits |", "|---|---|---|---|---|---|"]
    for ds in [d for d in cfg.datasets if d in cfg.logits_on]:
        hid = [r["test_final"] for r in get(ds, "retexo", "gcn", 1)]
        lo = [r["test_final"] for r in get(ds, "retexo-logits", "gcn", 1)]
        for P in cfg.parts:
            x, y = get(ds, "retexo", "gcn", P, 0), get(ds, "retexo-logits", "gcn", P, 0)
            if not (hid and lo and x and y):
                continue
            e = [r[0]["bytes_by_kind"].get("train/embed_fwd", 0) for r in (x, y)]
            L.append(f"| {ds} | {_pct(_mean(hid))}{_sd(hid)} | {_pct(_mean(lo))}{_sd(lo)} | "
                     f"{P} | {_bytes(e[0])} / {_bytes(e[1])} | {_bytes(x[0]['train_bytes'])} / "
                     f"{_bytes(y[0]['train_bytes'])} |")
    fracs = " and ".join(f"{100 * f:.0f}%" for f in cfg.tta_frac)
    L += ["", f"## Projected time to {fracs} of centralized accuracy (seconds of training)", "",
          "quietgnn.comm.network: per epoch, slowest rank's compute + sum over rounds of hops x "
          "latency + slowest rank's bytes / bandwidth. LAN 1 Gbit/s 0.5 ms, WAN 100 Mbit/s "
          "20 ms, edge 10 Mbit/s 50 ms. Seed 0; evaluation every "
          f"{cfg.eval_every} epochs (so TTA resolves to that many epochs).", "",
          "| dataset | model | P | target | LAN halo / retexo | WAN halo / retexo | "
          "edge halo / retexo | WAN speed-up | edge speed-up |",
          "|---|---|---|---|---|---|---|---|---|"]
    for ds, arch in combos:
        c = _mean([r["test_best"] for r in get(ds, "centralized", arch, 1)])
        if c is None:
            continue
        for P, frac in [(P, f) for P in cfg.parts for f in cfg.tta_frac]:
            h, x = get(ds, "halo", arch, P, 0), get(ds, "retexo", arch, P, 0)
            if not h or not x:
                continue
            target = frac * c
            t = {(tier, n): _tta(r[0], tier, target) for tier in ("lan", "wan", "edge")
                 for n, r in (("h", h), ("x", x))}
            sp = {tier: (f"{t[(tier, 'h')] / t[(tier, 'x')]:.1f}x"
                         if t[(tier, "h")] and t[(tier, "x")] else "n/a") for tier in
                  ("wan", "edge")}
            L.append(f"| {ds} | {arch} | {P} | {_pct(target)} | "
                     f"{_s(t[('lan', 'h')])} / {_s(t[('lan', 'x')])} | "
                     f"{_s(t[('wan', 'h')])} / {_s(t[('wan', 'x')])} | "
                     f"{_s(t[('edge', 'h')])} / {_s(t[('edge', 'x')])} | {sp['wan']} | "
                     f"{sp['edge']} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,synthetic,computers,cs")
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--parts", default="4,8,32")
    ap.add_argument("--p32", default="cora", help="datasets that also run at P > 8")
    ap.add_argument("--big", default="computers,cs", help="datasets run with --epochs-big")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--epochs-big", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seeds-big", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--logits-on", default="cora,synthetic",
                    help="datasets that also run the logit-passing variant (GCN)")
    ap.add_argument("--paper-on", default="",
                    help="datasets that also run retexo with the paper's schedule at P = 1 "
                         f"({PAPER_ROUNDS} rounds per layer, lr {PAPER_LR})")
    ap.add_argument("--accuracy-only", action="store_true",
                    help="only the P = 1 accuracy runs (no traffic / time runs)")
    ap.add_argument("--redo", default="",
                    help="labels (e.g. retexo,retexo-logits) whose stored runs on --datasets "
                         "are dropped and run again (after a change to the strategy)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--tta-frac", default="0.9,0.95",
                    help="time-to-accuracy targets as fractions of the centralized accuracy")
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--quick", action="store_true", help="cora, gcn, P=4, 1 seed, 40 epochs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "retexo"))
    ap.add_argument("--tables-only", action="store_true")
    cfg = ap.parse_args(argv)
    if cfg.quick:
        cfg.datasets, cfg.models, cfg.parts, cfg.seeds, cfg.epochs = "cora", "gcn", "4", 1, 40
        if cfg.out == ap.get_default("out"):
            cfg.out = "/tmp/bench-retexo-quick"
    for k in ("datasets", "models", "p32", "big", "logits_on", "paper_on", "redo"):
        setattr(cfg, k, [v for v in getattr(cfg, k).split(",") if v])
    cfg.parts = [int(p) for p in cfg.parts.split(",")]
    cfg.tta_frac = [float(f) for f in str(cfg.tta_frac).split(",")]
    # --out is the study's folder: <out>/<name>.json and <name>.md (benchmarks/results/<study>/)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{out.name}.json"
    saved = json.loads(js.read_text()) if js.exists() else {}
    runs: dict[str, Any] = saved.get("runs", {})
    if not cfg.tables_only:
        runs = {k: r for k, r in runs.items()
                if not (r["label"] in cfg.redo and r["dataset"] in cfg.datasets)}
    commands = saved.get("commands", [])
    cmd = "python benchmarks/bench_retexo.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if not cfg.tables_only and commands[-1:] != [cmd]:   # a resumed run is one invocation
        commands.append(cmd)

    def save(runs):
        js.write_text(json.dumps({"commands": commands, "config": vars(cfg), "runs": runs},
                                 indent=1, default=str))
        md = tables(runs, cfg) + "\nProduced by: " + "; then ".join(
            f"`{c}`" for c in commands) + "\n"
        (out / f"{out.name}.md").write_text(md)
        return md

    if not cfg.tables_only:
        run_matrix(cfg, runs, save)
    print(save(runs))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    sys.exit(main())
