"""Grappa vs halo vs centralized: traffic, accuracy, projected time to accuracy, ablations.

    .venv/bin/python benchmarks/bench_grappa.py                 # the committed tables
    .venv/bin/python benchmarks/bench_grappa.py --quick         # smoke run (minutes)
    .venv/bin/python benchmarks/bench_grappa.py --groups cs:8 --append   # add a group

Runs through the Python API (``spawn_function``: P real gloo processes on 127.0.0.1, one per
rank, one compute thread each) with the same phase labelling as ``quietgnn train``; every
epoch's communicator records are kept so the network projection of
:mod:`quietgnn.analysis.projection` (``epoch_curve`` / ``time_to_accuracy``) replays them on the LAN
and WAN tiers. One spawn per (dataset, P) runs all of its cells one after another, to
amortise process start-up on the small shared machine. Datasets come from
``quietgnn.datasets.load_dataset`` (``synthetic``: 5,000-node DC-CSBM, 8 classes, 64
features; ``synthetic-N``: the same generator with N nodes, the bytes-scaling point).

Writes ``benchmarks/results/grappa/grappa.json`` (every run: per-epoch curve, bytes by kind, best
accuracies) and ``grappa.md`` (the tables).

Reported per run: test accuracy at the best validation epoch (global exact evaluation every
``eval_every`` epochs), training bytes per epoch (phase ``train``, sent, summed over ranks;
for halo split into halo rows and its gradient all-reduce), chunk-reload bytes per epoch
(phase ``data``, amortised over the run, and per reload), and projected time to reach 98% of
the centralized accuracy of the same seed (chunk reloads charged).
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
SHARED = ROOT.parent / "shared" / "data"


# ---------------------------------------------------------------------- data
ROOTS = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon", "cs": "coauthor"}
SYNTHETIC = {"nodes": 5000, "classes": 8, "feature_dim": 64}


def load_graph(name: str):
    """The project loader: Planetoid public split, Computers/CS seeded 60/20/20, synthetic
    DC-CSBM (``synthetic-N``: N nodes)."""
    from quietgnn.datasets import load_dataset
    if name.startswith("synthetic-"):
        return load_dataset("synthetic", synthetic=dict(SYNTHETIC, nodes=int(name.split("-")[1])))
    root = str(SHARED / ROOTS[name]) if name in ROOTS else None
    return load_dataset(name, root, synthetic=SYNTHETIC)


# ---------------------------------------------------------------------- one run
def _run_jobs(comm, graph, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every job on this rank's part of its own assignment, through the package's trainer
    (``_study``): the records ``quietgnn train`` writes."""
    from _study import run_job
    from quietgnn.partition import build_partitions
    torch.set_num_threads(1)
    return [{"rank": comm.rank, "records": run_job(
        comm, build_partitions(graph, j["parts"], ranks=[comm.rank])[0], j)["records"]}
        for j in jobs]


def summarise(job: dict[str, Any], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    from quietgnn.analysis.projection import epoch_curve
    from quietgnn.comm.network import TIERS
    metrics = {r["rank"]: r["records"] for r in per_rank}
    curve = epoch_curve(metrics).to_json(columns=False)
    rows = curve["epochs"]
    best = max((r for r in rows if r["val_acc"] is not None), key=lambda r: r["val_acc"])
    n = len(rows)
    kinds: dict[str, int] = {}
    for recs in metrics.values():
        for rec in recs[1:]:
            for k, v in rec["bytes_by_kind"].items():
                kinds[k] = kinds.get(k, 0) + v
    return {
        "label": job["label"], "dataset": job["dataset"], "strategy": job["strategy"],
        "parts": job["P"], "model": job["model"]["arch"], "layers": job["model"]["layers"],
        "seed": job["seed"], "options": job["options"], "epochs": n,
        "test_acc": best["test_acc"], "val_acc": best["val_acc"], "best_epoch": best["epoch"],
        "train_bytes_per_epoch": sum(r["train_bytes"] for r in rows) / n,
        "data_bytes_per_epoch": sum(r["data_bytes"] for r in rows) / n,
        "reloads": sum(1 for r in rows if r["data_bytes"] > 0),
        "setup_bytes": curve["setup"]["bytes"],
        "bytes_by_kind_per_epoch": {k: v / n for k, v in sorted(kinds.items())},
        "compute_s_per_epoch": sum(r["compute_s"] for r in rows) / n,
        "curve": [{k: r[k] for k in ("epoch", "compute_s", "hops", "crit_bytes", "test_acc")}
                  for r in rows],
        "tiers": {t: {"bandwidth": TIERS[t].bandwidth, "latency": TIERS[t].latency}
                  for t in ("lan", "wan")},
    }


def tta(run: dict[str, Any], tier: str, target: float) -> float | None:
    from quietgnn.analysis.projection import time_to_accuracy
    from quietgnn.comm.network import TIERS
    got = time_to_accuracy({"epochs": run["curve"]}, TIERS[tier], target)
    return None if got is None else got.cum_s


# ---------------------------------------------------------------------- the matrix
def _big(dataset: str) -> bool:
    return dataset in ("computers", "cs") or dataset.startswith("synthetic-")


def _epochs(dataset: str, cfg) -> int:
    return cfg.epochs_big if _big(dataset) else cfg.epochs


def _eval_every(dataset: str, cfg) -> int:
    return cfg.eval_every_big if _big(dataset) else cfg.eval_every


def _seeds(dataset: str, layers: int, P: int, cfg) -> list[int]:
    """The budget: every seed on the small graphs, one seed on the big ones and at 4 layers
    on P = 8."""
    if _big(dataset) or (layers == 4 and P == 8):
        return [0]
    return list(range(cfg.seeds))


def _layers(dataset: str, P: int, cfg) -> list[int]:
    if dataset.startswith("synthetic-") or dataset in cfg.shallow_only:
        return [2]
    return [2] if (_big(dataset) and P == 8) else [2, 4]


def _archs(dataset: str, cfg) -> list[str]:
    return ["gcn"] if dataset in cfg.gcn_only else ["gcn", "sage"]


def _job(label, dataset, strategy, P, parts, arch, layers, seed, options, cfg):
    return {"label": label, "dataset": dataset, "strategy": strategy, "P": P, "parts": parts,
            "seed": seed, "options": options or {},
            "model": {"arch": arch, "layers": layers, "hidden": 64, "dropout": 0.5},
            "train": {"epochs": _epochs(dataset, cfg), "lr": 0.01, "weight_decay": 5e-4,
                      "seed": seed},
            "eval_every": _eval_every(dataset, cfg)}


#: ablations (GCN, 2 layers, P = 4): label -> grappa options on top of the default run
ABLATIONS = {"grappa lam=0": {"lam": 0.0},
             "grappa lam=0.5": {"lam": 0.5},
             "grappa no-repart": {"repart_every": 0},
             "grappa lam=0 no-repart": {"lam": 0.0, "repart_every": 0},
             "grappa batch-level": {"weighting": "batch"},
             "grappa batch-level lam=0.5": {"weighting": "batch", "lam": 0.5},
             "grappa minibatch": {"mode": "minibatch", "batch_size": 256, "fanouts": [25, 10]},
             "grappa minibatch batch-level": {"mode": "minibatch", "batch_size": 256,
                                              "fanouts": [25, 10], "weighting": "batch"}}
#: the mini-batch reference: distributed sampling with remote feature fetches (METIS)
MINIBATCH_REF = {"fanouts": "25,10", "batch_size": 256, "topology": "replicated"}


def make_jobs(dataset: str, graph, P: int, cfg: argparse.Namespace) -> list[dict[str, Any]]:
    from quietgnn.partition import partition_nodes
    parts = {"metis": partition_nodes(graph, "metis", P, seed=0),
             "random": partition_nodes(graph, "random", P, seed=0)}
    rep = max(1, _epochs(dataset, cfg) // 10)
    jobs = []
    for arch in _archs(dataset, cfg):
        for layers in _layers(dataset, P, cfg):
            for seed in _seeds(dataset, layers, P, cfg):
                jobs.append(_job("halo", dataset, "halo", P, parts["metis"], arch, layers,
                                 seed, {}, cfg))
                jobs.append(_job("grappa", dataset, "grappa", P, parts["random"], arch, layers,
                                 seed, {"repart_every": rep}, cfg))
                if cfg.rank:   # the same run with the compressed gradient all-reduce
                    jobs.append(_job(_low_label(cfg), dataset, "grappa", P,
                                     parts["random"], arch, layers, seed,
                                     {"repart_every": rep, "grad_rank": cfg.rank,
                                      "grad_bits": cfg.rank_bits}, cfg))
    if dataset in cfg.ablate and P == 4:
        for seed in range(cfg.seeds):
            for lab, opts in ABLATIONS.items():
                jobs.append(_job(lab, dataset, "grappa", P, parts["random"], "gcn", 2, seed,
                                 dict({"repart_every": rep}, **opts), cfg))
            jobs.append(_job("minibatch (reference)", dataset, "minibatch", P, parts["metis"],
                             "gcn", 2, seed, dict(MINIBATCH_REF), cfg))
    return jobs


def _low_label(cfg) -> str:
    return f"grappa r{cfg.rank}" + (f" {cfg.rank_bits}-bit" if cfg.rank_bits < 32 else "")


def centralized_jobs(dataset: str, graph, cfg) -> list[dict[str, Any]]:
    parts = np.zeros(graph.num_nodes, dtype=np.int64)
    jobs = []
    for arch in _archs(dataset, cfg):
        for layers in _layers(dataset, 4, cfg):
            for seed in _seeds(dataset, layers, 4, cfg):
                jobs.append(_job("centralized", dataset, "centralized", 1, parts, arch, layers,
                                 seed, {}, cfg))
    return jobs


def run_matrix(cfg, save, prev: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs (dataset, P) groups in the order given, after the runs in ``prev`` (``--append``);
    ``save(runs)`` after each group, so an interrupted matrix still leaves its finished
    tables behind. Centralized references run once per dataset (skipped if ``prev`` has
    them)."""
    from quietgnn.comm import Communicator
    from quietgnn.runtime.spawn import spawn_function
    out_runs: list[dict[str, Any]] = list(prev)
    loaded: tuple[str, Any] = ("", None)
    for dataset, P in cfg.groups:
        if loaded[0] != dataset:
            loaded = (dataset, load_graph(dataset))
            graph = loaded[1]
            print(f"[{dataset}] {graph.num_nodes} nodes, {graph.num_edges} edges", flush=True)
            have = {(r["model"], r["layers"], r["seed"]) for r in out_runs
                    if r["dataset"] == dataset and r["strategy"] == "centralized"}
            for job in centralized_jobs(dataset, graph, cfg):
                key = (job["model"]["arch"], job["model"]["layers"], job["seed"])
                if key not in have:
                    res = _run_jobs(Communicator(0, 1), graph, [job])
                    out_runs.append(summarise(job, res))
            save(out_runs)
        graph = loaded[1]
        jobs = make_jobs(dataset, graph, P, cfg)
        t0 = time.time()
        per_rank = spawn_function(_run_jobs, P, args=(graph, jobs), timeout_s=cfg.timeout,
                                  comm_timeout_s=600)
        for i, job in enumerate(jobs):
            out_runs.append(summarise(job, [r[i] for r in per_rank]))
        print(f"  {dataset} P={P}: {len(jobs)} runs in {time.time() - t0:.0f}s", flush=True)
        save(out_runs)
    return out_runs


# ---------------------------------------------------------------------- tables
def _mean(xs):
    xs = [x for x in xs if x is not None]
    return st.mean(xs) if xs else None


def _fmt(x, pct=False, nd=1):
    if x is None:
        return "n/a"
    return f"{100 * x:.{nd}f}" if pct else f"{x:.{nd}f}"


def _bytes(b):
    for u, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.2f} {u}"
    return f"{b:.0f} B"


def _kind(r: dict[str, Any], *kinds: str) -> float:
    return sum(v for k, v in r["bytes_by_kind_per_epoch"].items() if k in kinds)


def _low_rank_table(idx, keys, lab, cent, tta_mean) -> list[str]:
    """grappa with the low-rank gradient all-reduce (``lab`` = 'grappa rR') against exact
    grappa, halo and centralized on the same seeds."""
    r, _, bits = lab[len("grappa r"):].partition(" ")
    b = f", both all-reduces quantized at {bits} (comm/qreduce.py)" if bits else ""
    lines = ["", f"## Compressed gradient all-reduce: `{lab}`", "",
             f"The same runs with options.grad_rank = {r} (comm/lowrank.py: each large weight "
             f"matrix's gradient as rank-{r} factors, error feedback; two all-reduces per "
             f"step{b})."
             f" Accuracy: test at the best validation epoch, mean over the seeds; bytes: "
             f"training phase, sent, summed over ranks, per epoch.", "",
             f"| dataset | model | L | P | seeds | centralized | halo | grappa | {lab} | "
             f"{lab} - centr. | {lab} - grappa | halo B/ep | grappa B/ep | {lab} B/ep | "
             f"halo / {lab} | TTA WAN halo / {lab} (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds, m, L, P in keys:
        lr = idx.get((ds, m, L, P, lab), [])
        if not lr:
            continue
        seeds = {x["seed"] for x in lr}
        same = lambda rs: [x for x in rs if x["seed"] in seeds]   # noqa: E731
        h, g = same(idx.get((ds, m, L, P, "halo"), [])), same(idx[(ds, m, L, P, "grappa")])
        c = [x for x in (cent(ds, m, L, sd) for sd in sorted(seeds)) if x]
        ca, ha, ga, la = (_mean([x["test_acc"] for x in rs]) for rs in (c, h, g, lr))
        hb, gb, lb = (_mean([x["train_bytes_per_epoch"] for x in rs]) for rs in (h, g, lr))
        d = lambda a, b: None if a is None or b is None else a - b   # noqa: E731
        lines.append(
            f"| {ds} | {m} | {L} | {P} | {len(lr)} | {_fmt(ca, True)} | {_fmt(ha, True)} | "
            f"{_fmt(ga, True)} | {_fmt(la, True)} | {_fmt(d(la, ca), True)} | "
            f"{_fmt(d(la, ga), True)} | {_bytes(hb) if hb else 'n/a'} | {_bytes(gb)} | "
            f"{_bytes(lb)} | {'1/%.0f' % (hb / lb) if hb else 'n/a'} | "
            f"{_fmt(tta_mean(h, 'wan'), nd=2)} / {_fmt(tta_mean(lr, 'wan'), nd=2)} |")
    return lines


def tables(runs: list[dict[str, Any]], cfg) -> str:
    idx: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        idx.setdefault((r["dataset"], r["model"], r["layers"], r["parts"], r["label"]), []) \
            .append(r)

    def cent(ds, m, L, seed):
        for r in idx.get((ds, m, L, 1, "centralized"), []):
            if r["seed"] == seed:
                return r
        return None

    def tta_mean(rs, tier):
        vals = []
        for r in rs:
            cr = cent(r["dataset"], r["model"], r["layers"], r["seed"])
            vals.append(tta(r, tier, 0.98 * cr["test_acc"]) if cr else None)
        return None if not vals or any(v is None for v in vals) else _mean(vals)

    lines = ["# Grappa benchmark", "",
             f"Epochs: {cfg.epochs} (Cora/CiteSeer/synthetic, evaluation every "
             f"{cfg.eval_every}), {cfg.epochs_big} (Computers/CS/synthetic-N, evaluation every "
             f"{cfg.eval_every_big}); repart_every = epochs/10 (so a run sees several "
             f"rotations; the spec's default is 50); hidden 64, dropout 0.5, Adam lr 0.01, wd "
             f"5e-4, full-graph steps. Seeds 0..n-1, n in the `seeds` column (the matrix ran "
             f"in several invocations, listed at the end). halo on METIS, grappa on "
             f"random chunks (lam 1, node-level coverage weights). Accuracy = test at the best "
             f"validation epoch, mean over seeds. Bytes: sent per epoch, summed over ranks. "
             f"Time to accuracy (TTA): projected seconds to reach 98% of centralized (same "
             f"seed; mean over seeds, n/a if a seed never got there), alpha-beta model of "
             f"quietgnn.comm.network (LAN 1 Gbit/s 0.5 ms, WAN 100 Mbit/s 20 ms) over the "
             f"recorded rounds + slowest rank's compute; grappa's chunk reloads (phase data) "
             f"are charged.", "",
             "## Accuracy and time to accuracy", "",
             "| dataset | model | L | P | seeds | centralized | halo | grappa | grappa - centr. "
             "| TTA LAN halo / grappa (s) | TTA WAN halo / grappa (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({k[:4] for k in idx if k[4] == "grappa"})
    low = sorted({r["label"] for r in runs if r["options"].get("grad_rank")})
    for ds, m, L, P in keys:
        h, g = idx.get((ds, m, L, P, "halo"), []), idx[(ds, m, L, P, "grappa")]
        c = [x for x in (cent(ds, m, L, r["seed"]) for r in g) if x]
        ca, ha, ga = (_mean([x["test_acc"] for x in rs]) for rs in (c, h, g))
        lines.append(
            f"| {ds} | {m} | {L} | {P} | {len(g)} | {_fmt(ca, True)} | {_fmt(ha, True)} | "
            f"{_fmt(ga, True)} | {_fmt(None if ga is None or ca is None else ga - ca, True)} | "
            f"{_fmt(tta_mean(h, 'lan'), nd=2)} / {_fmt(tta_mean(g, 'lan'), nd=2)} | "
            f"{_fmt(tta_mean(h, 'wan'), nd=2)} / {_fmt(tta_mean(g, 'wan'), nd=2)} |")
    lines += ["", "TTA n/a: the run never reached 98% of centralized within its epochs.", "",
              "## Training bytes per epoch", "",
              "halo's training bytes = its halo rows (forward features/activations, backward "
              "gradients) + one gradient all-reduce; grappa's = one gradient all-reduce of the "
              "same size per step (+ nothing else in full-graph mode). So halo / grappa = "
              "1 + rows / all-reduce: the 1/50 goal needs halo rows >= 49x the model's "
              "all-reduce, which depends on the graph's size and cut against the model's size, "
              "not on grappa. Reload: the rotating chunk's structure + features (phase data), "
              "amortised over the run (repart_every = epochs/10), and per reload (at the "
              "spec's default repart_every = 50 it is 1/50 of that per epoch).", "",
              "| dataset | model | L | P | halo rows B/ep | all-reduce B/ep | grappa train B/ep "
              "| halo / grappa (train) | grappa reload B/ep | B per reload | halo / grappa "
              "(train + reload) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds, m, L, P in keys:
        h, g = idx.get((ds, m, L, P, "halo"), []), idx[(ds, m, L, P, "grappa")]
        if not h:
            continue
        hr = _mean([_kind(x, "train/halo_fwd", "train/halo_bwd") for x in h])
        hg = _mean([_kind(x, "train/grad_allreduce") for x in h])
        hb = _mean([x["train_bytes_per_epoch"] for x in h])
        gb = _mean([x["train_bytes_per_epoch"] for x in g])
        gd = _mean([x["data_bytes_per_epoch"] for x in g])
        per_reload = _mean([x["data_bytes_per_epoch"] * x["epochs"] / x["reloads"]
                            for x in g if x.get("reloads")])
        lines.append(f"| {ds} | {m} | {L} | {P} | {_bytes(hr)} | {_bytes(hg)} | {_bytes(gb)} | "
                     f"1/{hb / gb:.1f} | {_bytes(gd)} | "
                     f"{_bytes(per_reload) if per_reload else 'n/a'} | "
                     f"1/{hb / (gb + gd):.1f} |")
    for lab in low:
        lines += _low_rank_table(idx, keys, lab, cent, tta_mean)
    lines += ["", "## Ablations (GCN, 2 layers, P = 4)", "",
              "`grappa` = lam 1, node-level, full graph, repartitioning on. Mean over the "
              "variant's seeds; deltas against grappa and centralized on the same seeds. "
              "`minibatch (reference)` is the `minibatch` strategy (METIS, replicated topology,"
              " remote feature fetches) with grappa minibatch's fanouts and batch size: what a "
              "mini-batch system without isolation sends.", "",
              "| dataset | variant | seeds | test acc | delta vs grappa | delta vs centralized | "
              "train B/ep | reload B/ep |",
              "|---|---|---|---|---|---|---|---|"]
    abl = sorted({(k[0], k[4]) for k in idx if k[3] == 4 and k[1] == "gcn" and k[2] == 2 and
                  (k[4].startswith("grappa ") or k[4] == "minibatch (reference)")})
    for ds, lab in abl:
        var = idx[(ds, "gcn", 2, 4, lab)]
        seeds = {x["seed"] for x in var}   # compare like with like: the variant's seeds only
        ga = _mean([x["test_acc"] for x in idx[(ds, "gcn", 2, 4, "grappa")]
                    if x["seed"] in seeds])
        va = _mean([x["test_acc"] for x in var])
        ca = _mean([x["test_acc"] for x in idx.get((ds, "gcn", 2, 1, "centralized"), [])
                    if x["seed"] in seeds])
        lines.append(f"| {ds} | {lab} | {len(var)} | {_fmt(va, True)} | "
                     f"{_fmt(None if ga is None else va - ga, True)} | "
                     f"{_fmt(None if ca is None else va - ca, True)} | "
                     f"{_bytes(_mean([x['train_bytes_per_epoch'] for x in var]))} | "
                     f"{_bytes(_mean([x['data_bytes_per_epoch'] for x in var]))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default="cora:4,synthetic:4,citeseer:4,cora:8,synthetic:8,"
                    "citeseer:8,computers:4,computers:8,cs:4,cs:8,synthetic-50000:4",
                    help="dataset:P pairs, run in this order")
    ap.add_argument("--ablate", default="cora,synthetic")
    ap.add_argument("--shallow-only", default="", help="datasets run at 2 layers only")
    ap.add_argument("--gcn-only", default="", help="datasets run with GCN only")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--epochs-big", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--eval-every-big", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=20000)
    ap.add_argument("--rank", type=int, default=0,
                    help="also run every grappa cell with options.grad_rank RANK (low-rank "
                         "gradient all-reduce), labelled 'grappa rRANK [B-bit]'")
    ap.add_argument("--rank-bits", type=int, default=32,
                    help="with --rank: options.grad_bits of those runs (8/4/2; 32 = fp32)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep the runs already in <out>/<name>.json and add these groups")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grappa"))
    ap.add_argument("--tables-only", action="store_true", help="rebuild the markdown from json")
    cfg = ap.parse_args(argv)
    if cfg.quick:
        cfg.groups, cfg.epochs, cfg.seeds = "cora:4", 20, 1
    cfg.groups = [(g.split(":")[0], int(g.split(":")[1])) for g in cfg.groups.split(",")]
    cfg.ablate = cfg.ablate.split(",")
    cfg.shallow_only, cfg.gcn_only = cfg.shallow_only.split(","), cfg.gcn_only.split(",")
    # --out is the study's folder: <out>/<name>.json and <name>.md (benchmarks/results/<study>/)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = ".venv/bin/python benchmarks/bench_grappa.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    prev, commands, settings = [], [], ("epochs", "epochs_big", "seeds", "eval_every",
                                        "eval_every_big")
    if (cfg.append or cfg.tables_only) and (out / f"{out.name}.json").is_file():
        saved = json.loads((out / f"{out.name}.json").read_text())
        prev, commands = saved["runs"], saved.get("commands", [saved["command"]])
        for k in settings:      # the tables describe the settings the runs were made with
            if k not in saved["config"] or getattr(cfg, k) == saved["config"][k]:
                continue
            if cfg.tables_only:
                setattr(cfg, k, saved["config"][k])
            else:
                print(f"note: --{k.replace('_', '-')} {getattr(cfg, k)} differs from the saved "
                      f"runs' {saved['config'][k]}", flush=True)
    if not cfg.tables_only:
        commands = commands + [cmd.strip()]

    def save(runs):
        md = tables(runs, cfg) + "\nCommands (in order; later ones add groups):\n\n" + \
            "".join(f"    {c}\n" for c in commands)
        (out / f"{out.name}.md").write_text(md)
        (out / f"{out.name}.json").write_text(json.dumps(
            {"command": commands[-1] if commands else cmd, "commands": commands,
             "config": {k: v for k, v in vars(cfg).items()}, "runs": runs},
            indent=1, default=str))
        return md

    runs = prev if cfg.tables_only else run_matrix(cfg, save, prev)
    print(save(runs))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
