"""RandomTMA vs SuperTMA vs PSGD-PA (strategy ``tma``) against ``centralized`` and ``halo``.

    .venv/bin/python benchmarks/bench_tma.py                                  # default matrix
    .venv/bin/python benchmarks/bench_tma.py --datasets cora --parts 4 --seeds 0 --averages 2

What it measures, per dataset / P / architecture / seed:

* **accuracy**: best-validation test accuracy of the averaged model (rank 0 evaluates it on the
  whole graph after every average) for the three partitions: ``random`` (RandomTMA),
  ``supernode`` (SuperTMA, default K = max(16 P, N/50)) and ``metis`` (PSGD-PA), seed s on
  the partition dealt with seed s; tma's own defaults (local Adam lr, ``avg_bits``, period)
  unless ``--lr`` / ``--avg-bits`` / ``--period`` say otherwise; and of ``centralized`` (same
  model and weight decay, Adam lr 0.01 and, where tma's lr differs, at tma's lr too;
  ``--central-epochs`` full-graph epochs);
* **training bytes per epoch-equivalent** (all ranks' sent bytes in the train phase): tma runs
  in ``full`` mode, where one local step is one pass over the trainer's data, so one
  epoch-equivalent (every trainer one pass = the whole training set once) is one step: bytes
  per average / ``period_epochs``; ``halo`` (METIS): one epoch, measured on the same process
  group (``--mode minibatch``: tma's default mode, a pass is several sampled batches, the
  period still counts passes). The period is tma's default (``period_epochs``) unless
  ``--period`` says otherwise, and the table says which;
* **projected time to accuracy** on the LAN and WAN tiers of :mod:`quietgnn.comm.network`:
  every round costs ``hops * latency + slowest rank's max(sent, recv) / bandwidth``, plus the
  slowest rank's measured compute (thread CPU seconds); target = 98% of centralized's test
  accuracy (best validation epoch, same seed); tma reaches it at the first average whose
  model is there; ``halo`` uses centralized's accuracy curve (it is exact) with its own
  measured per-epoch compute and traffic;
* **failure**: P = 4 through the real launcher (``quietgnn.runtime.launcher.launch``), rank 2
  exits at the start of average ``averages // 2`` (``QUIETGNN_FAULT``), for random vs METIS
  partitions, with the unbroken run beside it: test accuracy and survivors at the end.

All tma runs of one dataset / P share one process group (``spawn_function``): process start-up
dominates on the shared 2-core machine. Writes ``benchmarks/results/tma/tma.json`` and ``tma.md``;
``--append`` adds rows to them (a matrix split over several invocations, each recorded).
"""

from __future__ import annotations

import argparse
import json
import math
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
ROOTS = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon", "cs": "coauthor"}
SYNTHETIC = {"nodes": 5000, "classes": 8, "feature_dim": 64}


def load_graph(name: str):
    """The project loader (shared read-only roots; Computers/CS: seeded 60/20/20 split)."""
    from quietgnn.datasets import load_dataset
    root = str(DATA / ROOTS[name]) if name in ROOTS else None
    return load_dataset(name, root, synthetic=SYNTHETIC)


# ---------------------------------------------------------------------- one process group
def _train_rounds(rec):
    """The training phase's rounds of a trainer record: [round, kind, phase, sent, recv, hops,
    seconds] each."""
    return [r for r in rec["rounds"] if r[2] == "train"]


def _model(arch):
    return {"arch": arch, "hidden": 64, "layers": 2, "dropout": 0.5}


def _group(comm, graph, assignments, jobs, halo_parts, halo_jobs, epochs, period,
           avg_bits=32, tma_lr=0.0, mode="full"):
    """On every rank, through the package's trainer (``_study``): each tma job (variant,
    arch, seed) for ``epochs`` averages of ``period`` epoch-equivalents, evaluated after each,
    then ``halo`` for 3 epochs per arch. Returns per-average traffic / compute / accuracy."""
    from _study import run_job
    from quietgnn.partition import build_partitions
    torch.set_num_threads(1)
    out: dict[str, Any] = {"tma": [], "halo": []}
    parts_cache = {k: build_partitions(graph, a, ranks=[comm.rank])[0]
                   for k, a in assignments.items()}
    for variant, arch, seed in jobs:
        run = run_job(comm, parts_cache[(variant, seed)], {
            "strategy": "tma", "model": _model(arch), "eval_every": 1,
            # train.epochs counts passes: ``epochs`` averages of ``period`` passes each
            "train": {"epochs": max(1, round(epochs * period)), "lr": 0.01, "seed": seed},
            "options": {"mode": mode, "period_epochs": period, "eval_graph": "gather",
                        "avg_bits": avg_bits, "lr": tma_lr}})
        rows = []
        for rec in run["records"][1:]:
            rounds = _train_rounds(rec)
            rows.append({"sent": sum(r[3] for r in rounds), "recv": sum(r[4] for r in rounds),
                         "hops": max([r[5] for r in rounds] or [0]),
                         "compute_s": rec["compute_s"],
                         "val": rec["val_acc"], "test": rec["test_acc"],
                         "local_epochs": rec["extra"]["local_epochs"]})
        report = (run["summary"] or {}).get("strategy_report", {})
        out["tma"].append({"variant": variant, "arch": arch, "seed": seed, "rows": rows,
                           "model_floats": report.get("model_floats")})
    part = build_partitions(graph, halo_parts, ranks=[comm.rank])[0]
    for arch in halo_jobs:
        # evaluated once, after the last epoch (the trainer always does): not in these rows
        run = run_job(comm, part, {"strategy": "halo", "model": _model(arch), "eval_every": 3,
                                   "train": {"epochs": 3, "lr": 0.01}})
        out["halo"].append({"arch": arch, "rows": [
            {"sent": rec["bytes"].get("train", {}).get("sent", 0),
             "rounds": [(r[0], r[5], max(r[3], r[4])) for r in _train_rounds(rec)],
             "compute_s": rec["compute_s"]} for rec in run["records"][1:]]})
    return out


def centralized_curve(graph, arch: str, seed: int, steps: int,
                      lr: float = 0.01) -> list[dict[str, float]]:
    """Full-graph training in this process (the trainer, evaluated every step): per-step
    val/test accuracy and compute."""
    from _study import run_job
    from quietgnn.comm import Communicator
    from quietgnn.partition import build_partitions
    part = build_partitions(graph, torch.zeros(graph.num_nodes, dtype=torch.long))[0]
    run = run_job(Communicator(0, 1), part, {
        "strategy": "centralized", "model": _model(arch), "eval_every": 1,
        "train": {"epochs": steps, "lr": lr, "seed": seed}})
    return [{"compute_s": rec["compute_s"], "val": rec["val_acc"], "test": rec["test_acc"]}
            for rec in run["records"][1:]]


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
    """P = 4 through ``launch``: rank 2 exits at average ``epochs // 2``; random vs metis,
    each also unbroken."""
    from quietgnn.config import load_config
    from quietgnn.partition import make_book
    from quietgnn.runtime.books import dataset_identity_of
    from quietgnn.runtime.launcher import launch
    from quietgnn.runtime.plan import RunPlan
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
                "train": {"epochs": max(1, round(epochs * period)), "lr": 0.01, "seed": seed},
                "runtime": {"progress": False, "timeout_s": 120},
                "options": {"mode": "full", "period_epochs": period}})
            env = {"QUIETGNN_FAULT": f"rank=2,epoch={epochs // 2},action=exit"} if fault else {}
            t0 = time.perf_counter()
            run_dir = out_dir / f"{name}-{method}-{'fail' if fault else 'ok'}"
            plan = RunPlan(cfg=cfg, run_dir=run_dir,
                           dataset=dataset_identity_of(cfg), book=book, book_checked=True)
            s = launch(plan, env_extra=env)
            rep = s["strategy_report"]
            # The best-validation model is often reached before the kill; the final average
            # (over the survivors only) shows what losing a trainer costs.
            recs = [json.loads(ln) for ln in
                    (Path(s["run_dir"]) / "metrics" / "rank-0.jsonl").read_text().splitlines()]
            curve = [r["test_acc"] for r in recs if r.get("test_acc") is not None]
            res.append({"dataset": name, "arch": arch, "partition": method, "killed": fault,
                        "final_test_acc": curve[-1] if curve else None, "test_curve": curve,
                        "period": period, "averages": epochs, "seed": seed,
                        "survivors_per_average": rep["survivors_per_average"],
                        "test_acc": s["test_acc"], "survivors": rep["survivors"],
                        "lost": rep["lost"], "wall_s": time.perf_counter() - t0})
            print(f"  failure {name} {method} killed={fault}: test {s['test_acc']:.4f} "
                  f"survivors {rep['survivors']}", flush=True)
    return res


# ---------------------------------------------------------------------- main
def main(argv=None) -> int:
    from quietgnn.strategies.tma import TMAOptions
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,synthetic,computers,cs")
    ap.add_argument("--parts", default="4,8")
    ap.add_argument("--archs", default="gcn,sage")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--averages", type=int, default=3, help="averaging rounds (tma epochs)")
    ap.add_argument("--period", type=float, default=TMAOptions().period_epochs,
                    help="epoch-equivalents per average (default: tma's default)")
    ap.add_argument("--central-epochs", type=int, default=200)
    ap.add_argument("--avg-bits", type=int, default=TMAOptions().avg_bits, choices=(2, 4, 8, 32),
                    help="tma's avg_bits (default: tma's default; 32: exact averages)")
    ap.add_argument("--lr", type=float, default=TMAOptions().lr,
                    help="tma's local Adam lr (options.lr; default: tma's default, the "
                         "paper's 1e-3; 0 = train.lr 0.01). centralized runs at 0.01 and, "
                         "when this differs, at this lr too")
    ap.add_argument("--mode", default="full", choices=("full", "minibatch"),
                    help="tma's local steps: 'full' (one step = one pass; the matrix's "
                         "setting) or 'minibatch' (tma's default: neighbour-sampled batches)")
    ap.add_argument("--failure-datasets", default="cora,synthetic")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tma"))
    ap.add_argument("--append", action="store_true",
                    help="add to the rows already in <out>/tma.json (runs split over sessions)")
    ap.add_argument("--skip-failures", action="store_true")
    ap.add_argument("--render-only", action="store_true", help="redraw tma.md from tma.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)     # like every worker: one compute thread
    if args.render_only:
        data = json.loads((Path(args.out) / "tma.json").read_text())
        (Path(args.out) / "tma.md").write_text(render(data))
        print(render(data))
        return 0
    from quietgnn.comm.network import TIERS
    from quietgnn.partition import partition_nodes
    from quietgnn.runtime.spawn import spawn_function
    datasets = [d for d in args.datasets.split(",") if d]
    archs = args.archs.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    period = int(args.period) if float(args.period).is_integer() else args.period
    tiers = {k: TIERS[k] for k in ("lan", "wan")}
    table, failures, prev_cmds, prev_wall = [], [], [], 0.0
    if args.append and (Path(args.out) / "tma.json").is_file():
        prev = json.loads((Path(args.out) / "tma.json").read_text())
        table, failures = prev["table"], prev["failures"]
        prev_cmds, prev_wall = prev.get("commands", [prev["command"]]), prev.get("wall_s", 0.0)
    args.prev_commands, args.prev_wall = prev_cmds, prev_wall
    t_all = time.perf_counter()
    for ds in datasets:
        graph = load_graph(ds)
        print(f"{ds}: {graph.num_nodes} nodes, {graph.num_edges} edges", flush=True)
        central = {(a, s): centralized_curve(graph, a, s, args.central_epochs)
                   for a in archs for s in seeds}
        # the paper's local lr is not the project's: report centralized at both
        central_lr = {k: centralized_curve(graph, k[0], k[1], args.central_epochs, lr=args.lr)
                      for k in central} if args.lr not in (0.0, 0.01) else {}
        for P in [int(p) for p in args.parts.split(",") if p]:
            t0 = time.perf_counter()
            # Seed s deals its own partition (partition seed s): a SuperTMA / RandomTMA
            # run's randomness is mostly *which* nodes a trainer gets (on Cora at P = 8 one
            # deal against another moves test accuracy by ~2 points), so a mean over seeds
            # must average over deals too, not repeat one. halo: METIS, seed 0.
            assignments = {(v, s): partition_nodes(graph, v, P, seed=s)
                           for v, _ in VARIANTS for s in seeds}
            jobs = [(v, a, s) for a in archs for s in seeds for v, _ in VARIANTS]
            halo_parts = partition_nodes(graph, "metis", P, seed=0)
            res = spawn_function(_group, P, args=(graph, assignments, jobs, halo_parts,
                                                  archs, args.averages, period,
                                                  args.avg_bits, args.lr, args.mode),
                                 timeout_s=20000, comm_timeout_s=1200)
            for a in archs:
                halo_by_rank = [r["halo"][archs.index(a)] for r in res]
                halo_bytes = sorted(sum(h["rows"][e]["sent"] for h in halo_by_rank)
                                    for e in range(3))[1]
                for s in seeds:
                    c = central[(a, s)]
                    c_acc = best_test(c)
                    target = 0.98 * c_acc
                    row = {"dataset": ds, "P": P, "arch": a, "seed": s, "centralized": c_acc,
                           "central_epochs": args.central_epochs, "period": period,
                           "averages": args.averages, "avg_bits": args.avg_bits,
                           "partition_seed": s, "mode": args.mode,
                           "tma_lr": args.lr or 0.01,
                           "centralized_tma_lr": best_test(central_lr[(a, s)])
                           if central_lr else None,
                           "halo_bytes_per_epoch": halo_bytes, "target": target,
                           "halo_tta": {k: halo_time_to(halo_by_rank, c, t, target)
                                        for k, t in tiers.items()}}
                    for v, label in VARIANTS:
                        i = jobs.index((v, a, s))
                        rows_by_rank = [r["tma"][i]["rows"] for r in res]
                        per_avg = [sum(r[e]["sent"] for r in rows_by_rank)
                                   for e in range(args.averages)]
                        bpe = (sum(per_avg) / len(per_avg)) / period
                        row[label] = {
                            "test_acc": best_test(rows_by_rank[0]),
                            "test_per_average": [r["test"] for r in rows_by_rank[0]],
                            "bytes_per_average": sum(per_avg) / len(per_avg),
                            "bytes_per_epoch_equiv": bpe,
                            "halo_over_tma_bytes": halo_bytes / bpe if bpe else None,
                            "compute_s_per_average": [max(r[e]["compute_s"]
                                                          for r in rows_by_rank)
                                                      for e in range(args.averages)],
                            "tta": {k: tma_time_to(rows_by_rank, t, target)
                                    for k, t in tiers.items()}}
                    table.append(row)
                    print("  " + _line(row), flush=True)
            print(f"  ({ds} P={P}: {time.perf_counter() - t0:.0f}s)", flush=True)
            save(args, argv, table, failures, t_all)   # partial results survive a kill
        if ds in args.failure_datasets.split(",") and not args.skip_failures:
            with tempfile.TemporaryDirectory() as tmp:
                failures += failure_runs(graph, ds, "gcn", args.averages, period, Path(tmp))
            save(args, argv, table, failures, t_all)
    print(render(save(args, argv, table, failures, t_all)))
    return 0


def save(args, argv, table, failures, t_all) -> dict:
    cmd = ".venv/bin/python benchmarks/bench_tma.py " + " ".join(argv or sys.argv[1:])
    settings = {k: v for k, v in vars(args).items() if k not in ("prev_commands", "prev_wall")}
    data = {"command": cmd.strip(), "commands": args.prev_commands + [cmd.strip()],
            "settings": settings, "table": table, "failures": failures,
            "wall_s": args.prev_wall + time.perf_counter() - t_all}
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


def _mean(xs):
    return sum(xs) / len(xs)


def _default_period():
    from quietgnn.strategies.tma import TMAOptions
    return TMAOptions().period_epochs


def _bits_note(rows) -> list[str]:
    bits = sorted({r.get("avg_bits", 32) for r in rows})
    lrs = sorted({r.get("tma_lr", 0.01) for r in rows})
    out = ["", f"tma's local Adam lr (`options.lr`): {', '.join(map(str, lrs))}; "
               f"`centralized` at lr 0.01, and in the column `central. (tma lr)` at tma's lr "
               f"(the same 200 epochs) where that differs."]
    if bits != [32]:
        out += ["", f"**Averages quantized**: `avg_bits` = {', '.join(map(str, bits))} (each "
                    f"trainer's progress since the last average, stochastically rounded)."]
    return out


def render(data) -> str:
    rows = data["table"]
    lines = ["# tma: RandomTMA / SuperTMA / PSGD-PA", "",
             "Commands (in order; later ones append rows):", "",
             *[f"    {c}" for c in data.get("commands", [data["command"]])], "",
             "Full-graph local steps (one step = one pass over the trainer's share = one "
             "epoch-equivalent), except where the period says `(minibatch)` (`--mode "
             "minibatch`, tma's default mode: neighbour-sampled batches of 512 seeds, so a pass "
             "is ceil(local training nodes / 512) steps; bytes still per pass); `period` = "
             "epoch-equivalents per average (tma's default is "
             f"{_default_period()}), `avgs` = averages. GCN/SAGE, 2 layers, hidden 64, "
             "dropout 0.5, Adam, wd 5e-4, clip 1.0; centralized: the same model "
             "trained full-graph for the stated epochs. Accuracy = test accuracy at the best "
             "validation point (tma: after "
             "each average; centralized: every epoch). Bytes: sent, summed over ranks, training "
             "phase only; halo on METIS (its bytes/epoch include its own gradient all-reduce).",
             *_bits_note(rows),
             "", "## Accuracy (test, %), mean over seeds", "",
             "| dataset | P | model | seeds | period x avgs | centralized | central. (tma lr) "
             "| RandomTMA | SuperTMA | PSGD-PA | random - central. | super - central. |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list] = {}
    for r in rows:
        per = r.get("period") if r.get("mode", "full") == "full" else \
            f"{r.get('period')} (minibatch)"
        groups.setdefault((r["dataset"], r["P"], r["arch"], per, r.get("averages")),
                          []).append(r)
    for (ds, P, arch, per, avgs), rs in groups.items():
        acc = {lab: _mean([r[lab]["test_acc"] for r in rs]) for _, lab in VARIANTS}
        c = _mean([r["centralized"] for r in rs])
        c_lr = [r.get("centralized_tma_lr") for r in rs]
        c_lr = "-" if None in c_lr else f"{100 * _mean(c_lr):.1f}"
        lines.append(f"| {ds} | {P} | {arch} | {len(rs)} | {per} x {avgs} | {100 * c:.1f} | "
                     f"{c_lr} | "
                     + " | ".join(f"{100 * acc[lab]:.1f}" for _, lab in VARIANTS)
                     + f" | {100 * (acc['RandomTMA'] - c):+.1f} | "
                       f"{100 * (acc['SuperTMA'] - c):+.1f} |")
    lines += ["", "## Training bytes per epoch-equivalent", "",
              "| dataset | P | model | period | halo B/epoch | TMA B/average | TMA B/epoch-eq | "
              "halo / TMA | period needed for 1/200 |", "|---|---|---|---|---|---|---|---|---|"]
    for (ds, P, arch, per, avgs), rs in groups.items():
        r = rs[0]                                  # bytes do not depend on the seed
        hb, ab = r["halo_bytes_per_epoch"], r["RandomTMA"]["bytes_per_average"]
        bpe = r["RandomTMA"]["bytes_per_epoch_equiv"]
        lines.append(f"| {ds} | {P} | {arch} | {per} | {hb / 1e6:.3f} MB | {ab / 1e6:.3f} MB | "
                     f"{bpe / 1e3:.2f} kB | {hb / bpe:.0f}x | {math.ceil(200 * ab / hb)} |")
    lines += ["", "## Projected time to 98% of centralized's test accuracy (s), mean over "
              "seeds ('never': some seed did not get there)", "",
              "| dataset | P | model | tier | halo | RandomTMA | SuperTMA | PSGD-PA |",
              "|---|---|---|---|---|---|---|---|"]
    for (ds, P, arch, per, avgs), rs in groups.items():
        for tier in ("lan", "wan"):
            def m(vals):
                return None if any(v is None for v in vals) else _mean(vals)
            cells = [m([r["halo_tta"][tier] for r in rs])] + \
                [m([r[lab]["tta"][tier] for r in rs]) for _, lab in VARIANTS]
            lines.append(f"| {ds} | {P} | {arch} | {tier} | "
                         + " | ".join(_fmt_t(x) for x in cells) + " |")
    if data["failures"]:
        lines += ["", "## Losing 1 of 4 trainers (real launcher; rank 2 exits at the start of "
                  "average avgs // 2)", "",
                  "| dataset | model | partition | period x avgs | killed | survivors per average "
                  "| best-val test acc (%) | final test acc (%) |",
                  "|---|---|---|---|---|---|---|---|"]
        for f in data["failures"]:
            lines.append(f"| {f['dataset']} | {f['arch']} | {f['partition']} | "
                         f"{f.get('period')} x {f.get('averages')} | "
                         f"{'yes' if f['killed'] else 'no'} | "
                         f"{f.get('survivors_per_average', f['survivors'])} | "
                         f"{100 * f['test_acc']:.1f} | "
                         + (f"{100 * f['final_test_acc']:.1f} |"
                            if f.get("final_test_acc") is not None else "- |"))
    lines.append("")
    lines.append(f"Total benchmark wall time: {data['wall_s']:.0f}s (shared, loaded 2-core "
                 f"machine).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
