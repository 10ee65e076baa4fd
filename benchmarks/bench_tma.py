"""RandomTMA vs SuperTMA vs PSGD-PA (strategy ``tma``) against ``centralized`` and ``halo``.

    /work/venv/bin/python benchmarks/bench_tma.py                       # default (scaled) matrix
    /work/venv/bin/python benchmarks/bench_tma.py --datasets cora --parts 4 --seeds 0 --quick

What it measures, per dataset / P / architecture / seed:

* **accuracy**: best-validation test accuracy of the averaged model (rank 0 evaluates it on the
  whole graph after every average) for the three partitions: ``random`` (RandomTMA),
  ``supernode`` (SuperTMA, default K = max(16 P, N/50)) and ``metis`` (PSGD-PA); and of
  ``centralized`` (same model, lr, weight decay, number of full-graph steps);
* **training bytes per epoch-equivalent** (all ranks' sent bytes in the train phase): for tma
  in ``full`` mode one local step is one pass over the trainer's data, so an epoch-equivalent
  is one step: bytes per average / ``period_steps``; for ``halo`` (METIS) one epoch, measured
  on the same process group;
* **projected time to accuracy** on the LAN and WAN tiers of :mod:`quietgnn.comm.network`:
  every round costs ``hops * latency + slowest rank's max(sent, recv) / bandwidth``, plus the
  slowest rank's measured compute (thread CPU seconds); target = 97% of centralized's best test
  accuracy; ``halo`` uses centralized's accuracy curve (it is exact) with its own measured
  per-epoch compute and traffic;
* **failure**: P = 4 through the real launcher, rank 2 exits halfway (``QUIETGNN_FAULT``), for
  random vs METIS partitions: test accuracy and survivors at the end.

All tma runs of one dataset / P share one process group (``spawn_function``): process start-up
dominates on the shared 2-core machine. Writes ``benchmarks/results/tma.json`` and ``tma.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
VARIANTS = [("random", "RandomTMA"), ("supernode", "SuperTMA"), ("metis", "PSGD-PA")]


# ---------------------------------------------------------------------- data
def load_graph(name: str):
    """The project loader when it is there, else PyG on a copy of the shared raw files."""
    try:
        from quietgnn.datasets import load_dataset   # noqa: F401
        root = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon",
                "cs": "coauthor"}.get(name)
        return load_dataset(name, str(DATA / root) if root else None,
                            synthetic={"nodes": 5000, "classes": 8, "feature_dim": 64})
    except ImportError:
        pass
    from quietgnn.graph import Graph
    if name == "synthetic":
        from quietgnn.datasets.synthetic import SyntheticSpec, make_synthetic
        return make_synthetic(SyntheticSpec(nodes=5000, classes=8, feature_dim=64))
    import torch_geometric.datasets as D
    src, cls, folder = {"cora": ("planetoid", D.Planetoid, "Cora"),
                        "citeseer": ("planetoid", D.Planetoid, "CiteSeer"),
                        "computers": ("amazon", D.Amazon, "Computers"),
                        "cs": ("coauthor", D.Coauthor, "CS")}[name]
    tmp = Path(tempfile.gettempdir()) / "quietgnn-bench-tma-data" / src
    if not (tmp / folder).exists():
        shutil.copytree(DATA / src / folder, tmp / folder)
    d = cls(str(tmp), folder)[0]
    masks = {}
    if hasattr(d, "train_mask") and d.train_mask is not None:
        masks = {"train_mask": d.train_mask, "val_mask": d.val_mask, "test_mask": d.test_mask}
    return Graph.from_edge_index(d.edge_index, d.x, d.y, name=name, **masks)


# ---------------------------------------------------------------------- one process group
def _phase_sum(recs, key):
    return sum(r.as_dict()[key] for r in recs)


def _group(comm, graph, assignments, jobs, halo_parts, halo_jobs, epochs, period):
    """On every rank: each tma job (variant, arch, seed) for ``epochs`` averages, then ``halo``
    for 3 epochs per arch. Returns per-epoch traffic / compute / accuracy."""
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    from quietgnn.strategies.halo import Halo
    from quietgnn.strategies.tma import TMA, TMAOptions
    torch.set_num_threads(1)
    out: dict[str, Any] = {"tma": [], "halo": []}
    parts_cache = {v: build_partitions(graph, a, ranks=[comm.rank])[0]
                   for v, a in assignments.items()}
    for variant, arch, seed in jobs:
        torch.manual_seed(seed * 1000 + comm.rank)
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm,
                            part=parts_cache[variant],
                            model_cfg=ModelConfig(arch=arch, hidden=64, layers=2, dropout=0.5),
                            train_cfg=TrainConfig(epochs=epochs, lr=0.01, seed=seed))
        s = TMA(ctx, TMAOptions(mode="full", period_steps=period, eval_graph="gather"))
        with comm.phase("setup"):
            s.setup()
        comm.take_records()
        rows = []
        for e in range(epochs):
            comm.epoch = e
            c0 = time.thread_time()
            with comm.phase("train"):
                s.train_epoch(e)
            cpu = time.thread_time() - c0
            recs = comm.take_records()
            with comm.phase("eval"):
                acc = s.evaluate()
            comm.take_records()
            rows.append({"sent": _phase_sum(recs, "bytes_sent"),
                         "recv": _phase_sum(recs, "bytes_recv"),
                         "hops": max([r.hops for r in recs] or [0]),
                         "compute_s": max(0.0, cpu - _phase_sum(recs, "cpu_seconds")),
                         "val": acc["val"], "test": acc["test"]})
        s.chan.close()
        out["tma"].append({"variant": variant, "arch": arch, "seed": seed, "rows": rows,
                           "model_floats": s.model_numel()})
    part = build_partitions(graph, halo_parts, ranks=[comm.rank])[0]
    for arch in halo_jobs:
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                            model_cfg=ModelConfig(arch=arch, hidden=64, layers=2, dropout=0.5),
                            train_cfg=TrainConfig(epochs=3, lr=0.01))
        h = Halo(ctx)
        with comm.phase("setup"):
            h.setup()
        comm.take_records()
        rows = []
        for e in range(3):
            c0 = time.thread_time()
            with comm.phase("train"):
                h.train_epoch(e)
            cpu = time.thread_time() - c0
            recs = comm.take_records()
            rows.append({"sent": _phase_sum(recs, "bytes_sent"),
                         "rounds": [(r.round, r.hops, max(r.bytes_sent, r.bytes_recv))
                                    for r in recs],
                         "compute_s": max(0.0, cpu - _phase_sum(recs, "cpu_seconds"))})
        out["halo"].append({"arch": arch, "rows": rows})
    return out


def centralized_curve(graph, arch: str, seed: int, steps: int) -> list[dict[str, float]]:
    """Full-graph training in this process: per-step val/test accuracy and compute."""
    from quietgnn.comm import Communicator
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions
    from quietgnn.strategies.base import TrainConfig, WorkerContext
    from quietgnn.strategies.centralized import Centralized
    torch.manual_seed(seed * 1000)
    part = build_partitions(graph, torch.zeros(graph.num_nodes, dtype=torch.long))[0]
    ctx = WorkerContext(rank=0, world_size=1, comm=Communicator(0, 1), part=part,
                        model_cfg=ModelConfig(arch=arch, hidden=64, layers=2, dropout=0.5),
                        train_cfg=TrainConfig(epochs=steps, lr=0.01, seed=seed))
    s = Centralized(ctx)
    s.setup()
    rows = []
    for e in range(steps):
        c0 = time.thread_time()
        s.train_epoch(e)
        cpu = time.thread_time() - c0
        acc = s.evaluate()
        rows.append({"compute_s": cpu, "val": acc["val"], "test": acc["test"]})
    return rows


def best_test(rows):
    best = max(range(len(rows)), key=lambda i: (rows[i]["val"], -i))
    return rows[best]["test"]


# ---------------------------------------------------------------------- projection
def tma_time_to(rows_by_rank, tier, target):
    """Projected seconds until the averaged model first reaches ``target`` test accuracy."""
    cum = 0.0
    for e in range(len(rows_by_rank[0])):
        rs = [r[e] for r in rows_by_rank]
        crit = max(max(r["sent"], r["recv"]) for r in rs)
        cum += max(r["compute_s"] for r in rs) + tier.seconds(max(r["hops"] for r in rs), crit)
        if rs[0]["test"] >= target:
            return cum
    return None


def halo_time_to(halo_by_rank, central, tier, target):
    """halo = centralized's accuracy curve at halo's measured per-epoch cost (median epoch)."""
    per_epoch = []
    for e in range(len(halo_by_rank[0]["rows"])):
        rounds: dict[int, list] = {}
        for h in halo_by_rank:
            for rnd, hops, b in h["rows"][e]["rounds"]:
                cur = rounds.setdefault(rnd, [0, 0])
                cur[0], cur[1] = max(cur[0], hops), max(cur[1], b)
        comm_s = sum(tier.seconds(h_, b) for h_, b in rounds.values())
        per_epoch.append(max(h["rows"][e]["compute_s"] for h in halo_by_rank) + comm_s)
    cost = sorted(per_epoch)[len(per_epoch) // 2]
    for i, row in enumerate(central):
        if row["test"] >= target:
            return cost * (i + 1)
    return None


# ---------------------------------------------------------------------- failure (launcher)
def failure_runs(graph, name, arch, epochs, period, out_dir: Path, seed=0):
    """P = 4 through ``launch``: rank 2 exits at epoch ``epochs // 2``; random vs metis."""
    from quietgnn.config import load_config
    from quietgnn.partition import make_book
    from quietgnn.runtime.launcher import launch
    res = []
    for method in ("random", "metis"):
        for fault in (False, True):
            book = out_dir / f"{name}-{method}-book"
            if not (book / "book.json").is_file():
                make_book(book, graph, method, 4, seed=0)
            cfg = load_config(None, {
                "strategy": "tma", "dataset": {"name": name},
                "partition": {"parts": 4, "book": str(book), "method": method},
                "model": {"arch": arch, "hidden": 64, "layers": 2, "dropout": 0.5},
                "train": {"epochs": epochs, "lr": 0.01, "seed": seed},
                "runtime": {"progress": False, "timeout_s": 120},
                "options": {"mode": "full", "period_steps": period}})
            env = {"QUIETGNN_FAULT": f"rank=2,epoch={epochs // 2},action=exit"} if fault else {}
            t0 = time.perf_counter()
            s = launch(cfg, out_dir / f"{name}-{method}-{'fail' if fault else 'ok'}", book,
                       env_extra=env)
            rep = s["strategy_report"]
            res.append({"dataset": name, "arch": arch, "partition": method, "killed": fault,
                        "test_acc": s["test_acc"], "survivors": rep["survivors"],
                        "lost": rep["lost"], "wall_s": time.perf_counter() - t0})
            print(f"  failure {name} {method} killed={fault}: test {s['test_acc']:.4f} "
                  f"survivors {rep['survivors']}", flush=True)
    return res


# ---------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,synthetic,computers")
    ap.add_argument("--parts", default="4,8")
    ap.add_argument("--archs", default="gcn,sage")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--averages", type=int, default=40, help="averaging rounds (tma epochs)")
    ap.add_argument("--period", type=int, default=5, help="local full-graph steps per average")
    ap.add_argument("--failure-datasets", default="cora,citeseer")
    ap.add_argument("--p8-datasets", default="cora,citeseer",
                    help="datasets also run at P = 8 (all when empty)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--append", action="store_true",
                    help="add to the rows already in <out>/tma.json (runs split over sessions)")
    ap.add_argument("--skip-failures", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)     # like every worker: one compute thread
    from quietgnn.comm.network import TIERS
    from quietgnn.partition import partition_nodes
    from quietgnn.runtime.launcher import spawn_function
    datasets = [d for d in args.datasets.split(",") if d]
    archs = args.archs.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    steps = args.averages * args.period
    tiers = {k: TIERS[k] for k in ("lan", "wan")}
    table, failures, prev_cmds = [], [], []
    if args.append and (Path(args.out) / "tma.json").is_file():
        prev = json.loads((Path(args.out) / "tma.json").read_text())
        table, failures = prev["table"], prev["failures"]
        prev_cmds = prev.get("commands", [prev["command"]])
    args.prev_commands = prev_cmds
    t_all = time.perf_counter()
    for ds in datasets:
        graph = load_graph(ds)
        print(f"{ds}: {graph.num_nodes} nodes, {graph.num_edges} edges", flush=True)
        central = {(a, s): centralized_curve(graph, a, s, steps) for a in archs for s in seeds}
        for P in [int(p) for p in args.parts.split(",")]:
            if P == 8 and args.p8_datasets and ds not in args.p8_datasets.split(","):
                continue
            t0 = time.perf_counter()
            assignments = {v: partition_nodes(graph, v, P, seed=0) for v, _ in VARIANTS}
            jobs = [(v, a, s) for a in archs for s in seeds for v, _ in VARIANTS]
            res = spawn_function(_group, P, args=(graph, assignments, jobs, assignments["metis"],
                                                  archs, args.averages, args.period),
                                 timeout_s=3000, comm_timeout_s=300)
            for a in archs:
                halo_by_rank = [r["halo"][archs.index(a)] for r in res]
                halo_bytes = sorted(sum(h["rows"][e]["sent"] for h in halo_by_rank)
                                    for e in range(3))[1]
                for s in seeds:
                    c = central[(a, s)]
                    c_acc = best_test(c)
                    target = 0.97 * max(r["test"] for r in c)
                    row = {"dataset": ds, "P": P, "arch": a, "seed": s, "centralized": c_acc,
                           "halo_bytes_per_epoch": halo_bytes, "target": target,
                           "halo_tta": {k: halo_time_to(halo_by_rank, c, t, target)
                                        for k, t in tiers.items()}}
                    for v, label in VARIANTS:
                        i = jobs.index((v, a, s))
                        rows_by_rank = [r["tma"][i]["rows"] for r in res]
                        per_avg = [sum(r[e]["sent"] for r in rows_by_rank)
                                   for e in range(args.averages)]
                        bpe = (sum(per_avg) / len(per_avg)) / args.period
                        row[label] = {
                            "test_acc": best_test(rows_by_rank[0]),
                            "bytes_per_epoch_equiv": bpe,
                            "halo_over_tma_bytes": halo_bytes / bpe if bpe else None,
                            "tta": {k: tma_time_to(rows_by_rank, t, target)
                                    for k, t in tiers.items()}}
                    table.append(row)
                    print("  " + _line(row), flush=True)
            print(f"  ({ds} P={P}: {time.perf_counter() - t0:.0f}s)", flush=True)
            save(args, argv, steps, table, failures, t_all)   # partial results survive a kill
        if ds in args.failure_datasets.split(",") and not args.skip_failures:
            with tempfile.TemporaryDirectory() as tmp:
                failures += failure_runs(graph, ds, "gcn", args.averages, args.period, Path(tmp))
            save(args, argv, steps, table, failures, t_all)
    print(render(save(args, argv, steps, table, failures, t_all)))
    return 0


def save(args, argv, steps, table, failures, t_all) -> dict:
    cmd = "/work/venv/bin/python benchmarks/bench_tma.py " + " ".join(argv or sys.argv[1:])
    settings = {k: v for k, v in vars(args).items() if k != "prev_commands"}
    data = {"command": cmd.strip(), "commands": args.prev_commands + [cmd.strip()],
            "settings": settings, "steps": steps, "table": table,
            "failures": failures, "wall_s": time.perf_counter() - t_all}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tma.json").write_text(json.dumps(data, indent=1))
    (out / "tma.md").write_text(render(data))
    return data


def _line(row):
    return (f"{row['dataset']} P={row['P']} {row['arch']} s{row['seed']}: central "
            f"{row['centralized']:.4f} | " + " | ".join(
                f"{label} {row[label]['test_acc']:.4f} ({row[label]['halo_over_tma_bytes']:.0f}x "
                f"fewer bytes)" for _, label in VARIANTS))


def _fmt_t(x):
    return "never" if x is None else f"{x:.2f}"


def render(data) -> str:
    lines = ["# tma: RandomTMA / SuperTMA / PSGD-PA", "",
             "Commands (in order; later ones append rows):", "",
             *[f"    {c}" for c in data.get("commands", [data["command"]])], "",
             f"Full-graph local steps; {data['settings']['averages']} averages x "
             f"{data['settings']['period']} steps = {data['steps']} steps per trainer "
             f"(centralized: {data['steps']} full-graph steps). GCN/SAGE, 2 layers, hidden 64, "
             f"dropout 0.5, Adam lr 0.01, wd 5e-4, clip 1.0. Accuracy = best-validation test "
             f"accuracy.", "",
             "## Accuracy (test, %) and training bytes per epoch-equivalent", "",
             "| dataset | P | model | seed | centralized | RandomTMA | SuperTMA | PSGD-PA | "
             "halo bytes/epoch | TMA bytes/epoch-eq | halo / TMA | steps/average for 1/200 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["table"]:
        b = r["RandomTMA"]["bytes_per_epoch_equiv"]
        lines.append(
            f"| {r['dataset']} | {r['P']} | {r['arch']} | {r['seed']} | "
            f"{100 * r['centralized']:.1f} | " + " | ".join(
                f"{100 * r[label]['test_acc']:.1f}" for _, label in VARIANTS) +
            f" | {r['halo_bytes_per_epoch'] / 1e6:.3f} MB | {b / 1e6:.4f} MB | "
            f"{r['RandomTMA']['halo_over_tma_bytes']:.0f}x | "
            f"{math.ceil(200 * b * data['settings']['period'] / r['halo_bytes_per_epoch'])} |")
    lines += ["", "## Projected time to 97% of centralized's best test accuracy (s)", "",
              "| dataset | P | model | seed | tier | halo | RandomTMA | SuperTMA | PSGD-PA |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in data["table"]:
        for tier in ("lan", "wan"):
            lines.append(f"| {r['dataset']} | {r['P']} | {r['arch']} | {r['seed']} | {tier} | "
                         f"{_fmt_t(r['halo_tta'][tier])} | " + " | ".join(
                             _fmt_t(r[label]["tta"][tier]) for _, label in VARIANTS) + " |")
    if data["failures"]:
        lines += ["", "## Losing 1 of 4 trainers halfway (real launcher, rank 2 exits)", "",
                  "| dataset | model | partition | killed | survivors at end | test acc (%) |",
                  "|---|---|---|---|---|---|"]
        for f in data["failures"]:
            lines.append(f"| {f['dataset']} | {f['arch']} | {f['partition']} | "
                         f"{'yes' if f['killed'] else 'no'} | {f['survivors']} | "
                         f"{100 * f['test_acc']:.1f} |")
    lines.append("")
    lines.append(f"Total benchmark wall time: {data['wall_s']:.0f}s (shared, loaded machine).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
