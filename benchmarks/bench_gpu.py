"""Every strategy on a GPU, next to the same run on the CPU; ``centralized`` next to plain PyG.

    .venv/bin/python benchmarks/bench_gpu.py                 # the whole check, one GPU
    .venv/bin/python benchmarks/bench_gpu.py --graphs cora --epochs 5 --no-big   # a quick one

On a machine without a visible GPU it says so and exits 0, writing nothing. Where torch has
CUDA but quietgnn is not installed, run it from the checkout: ``PYTHONPATH=. python
benchmarks/bench_gpu.py``. The results are written after every group of runs (a run stopped
by a time limit keeps what it measured); a group that fails is run again a strategy at a time,
and a strategy that fails is a row of the table's "Failed" list, not the end of the run.

Cells: each strategy at its defaults (``tma`` averages once per pass, ``period_epochs 1``, so
an epoch is one pass for every strategy) at P = 1 and P = 2 ranks sharing GPU 0 (gloo, every
collective staged through host memory), and at P = #GPUs over NCCL where there are more; on
Cora and Computers (``../shared/data``; a synthetic graph of the same size stands in where the
data is absent, and the row says so); each cell trained on the GPU and, with the same seed,
parts and epochs, on the CPU (P ranks, ``--cpu-threads`` threads each). The CPU and GPU runs of
a cell must agree: test accuracy within a point, and every communicator record byte for byte.
Then a prepared synthetic graph of ``--big-edges`` undirected edges trains on the GPU with
``halo`` (full graph) and ``minibatch`` (sampled). Last, ``centralized`` against plain PyG
(``bench_pyg``'s runners: same model, epochs and GPU).

Per cell: test accuracy (best validation epoch), bytes sent per epoch (rank 0, training),
wall seconds per epoch (median, the set-up epoch excluded; the trainer synchronises the device
at each epoch's end), peak GPU memory (MiB, the ranks' maximum, the runs' own records) and
peak RSS.

Writes ``benchmarks/results/gpu/gpu.json`` (one record per cell) and ``gpu.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
STRATEGIES = ["centralized", "halo", "bns", "pipegcn", "adaqp", "grappa", "tma", "retexo",
              "minibatch", "sancus", "llcg"]
OPTIONS = {"tma": {"period_epochs": 1.0}}
STAND_IN = {"cora": (2708, 5, 1433, 7), "computers": (13752, 36, 767, 10)}   # n, degree, F, C


def _graph(name: str, data: Path):
    """(graph, where it came from): the dataset, or a synthetic graph of its size."""
    from quietgnn.datasets import load_dataset
    sub = {"cora": "planetoid", "computers": "amazon"}[name]
    if (data / sub).is_dir():
        return load_dataset(name, str(data / sub)), "dataset"
    from quietgnn.datasets.synthetic import SyntheticSpec, make_synthetic
    n, deg, f, c = STAND_IN[name]
    spec = SyntheticSpec(nodes=n, avg_degree=deg, feature_dim=f, classes=c)
    return make_synthetic(spec), "synthetic stand-in"


def _cells(comm, source, jobs, threads):
    """Every job on this rank's part of ``source`` (a graph, or a prepared directory)."""
    from _study import run_job
    from quietgnn.partition import PartitionBook, build_partitions, partition_nodes
    torch.set_num_threads(threads)
    out, parts_by = [], {}
    from quietgnn.config import load_config
    for job in jobs:
        cfg = load_config(None, {"strategy": job["strategy"], "options": job["options"],
                                 "partition": {"parts": comm.world_size}})
        if isinstance(source, str):
            part = PartitionBook.open(source).load_part(
                comm.rank, comm.world_size, stored=cfg.strategy_cls.reads_stored_part(cfg.options))
        else:
            method = cfg.partition_method
            if method not in parts_by:
                parts_by[method] = partition_nodes(source, method, comm.world_size, seed=0)
            part = build_partitions(source, parts_by[method], ranks=[comm.rank])[0]
        res = run_job(comm, part, job)
        import resource
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.append(res)
    return out


def _row(graph: str, origin: str, job: dict, P: int, device: str, backend: str, role: str,
         per_rank: list[dict]) -> dict:
    summary = per_rank[0]["summary"]
    epochs = [r for r in per_rank[0]["records"] if r["epoch"] >= 0]
    sent = [r["bytes"].get("train", {}).get("sent", 0) for r in epochs]
    return {"graph": graph, "source": origin, "strategy": job["strategy"], "parts": P,
            "device": device, "role": role, "backend": backend, "epochs": len(epochs),
            "test_acc": summary.get("test_acc"),
            "bytes_per_epoch": statistics.fmean(sent) if sent else 0.0,
            "wall_s_per_epoch": statistics.median(r["wall_s"] for r in epochs),
            # the run's own record: the most any rank's tensors held on the GPU
            "peak_gpu_mib": summary.get("peak_gpu_mb") or 0.0,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in per_rank),
            "records": [[r["epoch"], r["bytes"]] for r in per_rank[0]["records"]]}


def _group(source, name, origin, strategies, P, device, role, epochs, threads, timeout, keep):
    """``keep(rows)``: the rows of ``strategies`` trained in one process group; where the group
    fails, each strategy again in a group of its own (each kept as it ends: a run stopped by a
    time limit keeps them), so that one failure costs one row (an ``error``)."""
    from quietgnn.runtime.devices import place
    from quietgnn.runtime.spawn import spawn_function
    jobs = [{"strategy": s, "options": OPTIONS.get(s, {}), "model": {},
             "train": {"epochs": epochs}, "eval_every": 1} for s in strategies
            if P == 1 or s != "centralized"]
    t0 = time.perf_counter()
    try:
        per_rank = spawn_function(_cells, P, args=(source, jobs, threads), timeout_s=timeout,
                                  reuse=False, device=device)
    except Exception as exc:  # noqa: BLE001 - one row per strategy says what failed
        if len(jobs) == 1:
            return keep([{"graph": name, "source": origin, "strategy": jobs[0]["strategy"],
                          "parts": P, "device": device, "role": role,
                          "error": str(exc).strip().splitlines()[-1][:500]}])
        print(f"{name} P={P} {role}: the group failed, each strategy alone", flush=True)
        for j in jobs:
            _group(source, name, origin, [j["strategy"]], P, device, role, epochs, threads,
                   timeout, keep)
        return None
    backend = place(device, "auto", 0, P).backend
    rows = [_row(name, origin, j, P, device, backend, role, [r[i] for r in per_rank])
            for i, j in enumerate(jobs)]
    print(f"{name} P={P} {role} ({device}): {len(jobs)} strategies in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return keep(rows)


def _prepare_big(edges: int, out: Path) -> str:
    """A prepared synthetic graph of about ``edges`` undirected edges in 2 parts (reused)."""
    d = out / f"synthetic-{edges:.0e}"
    if not (d / "book.json").is_file():
        nodes = edges // 10                    # average degree 20
        subprocess.run([sys.executable, "-m", "quietgnn", "prepare", "--dataset", "synthetic",
                        "--synthetic.nodes", str(nodes), "--synthetic.avg_degree", "20",
                        "--parts", "2", "--out", str(d)], check=True)
    return str(d)


def _pyg(graphs: dict, epochs: int) -> list[dict]:
    """``centralized`` and plain PyG on the GPU, epochs interleaved (bench_pyg)."""
    from bench_pyg import pyg_runner, quietgnn_runner, run_together
    rows = []
    for name, (graph, origin) in graphs.items():
        for arch in ("gcn", "sage"):
            makers = {"quietgnn": lambda: quietgnn_runner(graph, arch, epochs, 0, "cuda")}
            for mode in ("edge_index", "adj_t"):
                makers[f"pyg_{mode}"] = (lambda m=mode: pyg_runner(graph, arch, epochs, 0, m,
                                                                   "cuda"))
            runs = run_together(makers, epochs, 0, "cuda")
            rows.append({"graph": name, "source": origin, "model": arch, "epochs": epochs,
                         **{k: {"epoch_s": v["epoch_s_median"], "test_acc": v["test_acc"]}
                            for k, v in runs.items()}})
    return rows


def render(data: dict) -> list[str]:
    meta, rows = data["meta"], data["rows"]
    md = ["# Every strategy on a GPU", "",
          f"{meta['gpu']} ({meta['gpus']} visible), torch {meta['torch']}; CPU runs: "
          f"{meta['cpu_threads']} thread(s) per rank. {meta['epochs']} epochs per cell (one "
          "pass each), seed 0, the same parts on both devices. Seconds: median wall seconds "
          "per training epoch (set-up excluded). Records: every communicator record of the "
          "GPU run equals the CPU run's.", "",
          "| graph | strategy | P | backend | test acc CPU | test acc GPU | bytes/epoch | "
          "s/epoch CPU | s/epoch GPU | speed-up | records | GPU peak MiB |", "|" + "---|" * 12]
    by = {(r["graph"], r["strategy"], r["parts"], r["role"]): r for r in rows}
    for (g, s, P, role), gpu in by.items():
        if role != "gpu" or "error" in gpu:
            continue
        cpu = by.get((g, s, P, "cpu"))
        cpu = None if cpu is None or "error" in cpu else cpu
        acc_c = f"{cpu['test_acc']:.3f}" if cpu else "-"
        sec_c = f"{cpu['wall_s_per_epoch']:.3f}" if cpu else "-"
        speed = f"{cpu['wall_s_per_epoch'] / gpu['wall_s_per_epoch']:.1f}x" if cpu else "-"
        same = "-" if not cpu else ("equal" if cpu["records"] == gpu["records"] else
                                    # its bit widths follow measured times: two CPU runs differ
                                    "differ (timed widths)" if s == "adaqp" else "DIFFER")
        label = g if gpu["source"] == "dataset" else f"{g} ({gpu['source']})"
        md.append(f"| {label} | {s} | {P} | "
                  f"{gpu['backend']} | {acc_c} | {gpu['test_acc']:.3f} | "
                  f"{gpu['bytes_per_epoch']:,.0f} | {sec_c} | {gpu['wall_s_per_epoch']:.3f} | "
                  f"{speed} | {same} | {gpu['peak_gpu_mib']:.0f} |")
    failed = [r for r in rows if "error" in r]
    if failed:
        md += ["", "## Failed", ""] + [f"- {r['graph']} `{r['strategy']}` P = {r['parts']} "
                                        f"on the {r['role'].upper()}: {r['error']}"
                                        for r in failed]
    if data.get("pyg"):
        md += ["", "## `centralized` against plain PyG on the GPU", "",
               "| graph | model | quietgnn s/epoch | PyG edge_index | PyG adj_t | ratio vs best "
               "PyG | quietgnn acc | PyG acc (adj_t) |", "|" + "---|" * 8]
        for r in data["pyg"]:
            q, e, a = r["quietgnn"], r["pyg_edge_index"], r["pyg_adj_t"]
            best = min(e["epoch_s"], a["epoch_s"])
            md.append(f"| {r['graph']} | {r['model']} | {q['epoch_s']:.4f} | "
                      f"{e['epoch_s']:.4f} | {a['epoch_s']:.4f} | {q['epoch_s'] / best:.2f} | "
                      f"{q['test_acc']:.3f} | {a['test_acc']:.3f} |")
    for run in meta.get("runs", [meta]):   # a table merged from several runs lists each
        md += ["", f"Command: `{run['command']}` ({run['when']}, {run['elapsed_s']:.0f} s)"]
    md += [""] + [f"- {n}" for n in meta.get("notes", [])] + [""]
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cora,computers")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--parts", default="1,2", help="ranks sharing GPU 0 (and P = #GPUs over "
                    "NCCL where there are more than 2)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--cpu-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--big-edges", type=float, default=1e7)
    ap.add_argument("--big-epochs", type=int, default=3, help="epochs on the big graph")
    ap.add_argument("--no-big", action="store_true", help="skip the prepared big graph")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per group of runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"))
    ap.add_argument("--data", default=str(DATA),
                    help="the datasets' folder (default ../shared/data)")
    ap.add_argument("--prepared", default=None, help="where the big graph is prepared "
                    "(default OUT/prepared; kept and reused)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the script on a CPU: the 'GPU' runs use the CPU, no PyG part")
    args = ap.parse_args(argv)
    gpu = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print(f"bench_gpu: no CUDA device is visible (torch {torch.__version__}); nothing to "
              f"measure here. Run it on a machine with a GPU.")
        return 0
    import warnings
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    t_start, out = time.perf_counter(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_gpu = torch.cuda.device_count() if gpu == "cuda" else 1
    strategies = args.strategies.split(",")
    meta = {"gpu": torch.cuda.get_device_name(0) if gpu == "cuda" else "dry run (CPU)",
            "gpus": n_gpu, "torch": torch.__version__,
            "python": platform.python_version(), "epochs": args.epochs,
            "cpu_threads": args.cpu_threads,
            "command": "python benchmarks/bench_gpu.py " + " ".join(argv or sys.argv[1:])}
    data: dict = {"meta": meta, "rows": [], "pyg": []}

    def save() -> None:
        # after every group: a run stopped by its time limit keeps what it measured
        meta.update(when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    elapsed_s=time.perf_counter() - t_start)
        (out / "gpu.json").write_text(json.dumps(data, indent=1))
        (out / "gpu.md").write_text("\n".join(render(data)))

    def keep(rows: list[dict]) -> None:
        data["rows"].extend(rows)
        save()

    graphs = {g: _graph(g, Path(args.data)) for g in args.graphs.split(",")}
    sizes = sorted({int(p) for p in args.parts.split(",")} | ({n_gpu} if n_gpu > 2 else set()))
    for name, (graph, origin) in graphs.items():
        for P in sizes:
            for device, role in ((gpu, "gpu"), ("cpu", "cpu")):
                threads = args.cpu_threads // P if role == "cpu" else 1
                _group(graph, name, origin, strategies, P, device, role, args.epochs,
                       max(1, threads), args.timeout, keep)
    if gpu == "cuda":
        data["pyg"] = _pyg(graphs, args.epochs)
        save()
    if not args.no_big:
        big = _prepare_big(int(args.big_edges), Path(args.prepared or out / "prepared"))
        _group(big, f"synthetic {args.big_edges:.0e} edges", "prepared", ["halo", "minibatch"],
               2, gpu, "gpu", args.big_epochs, 1, args.timeout, keep)
    print("\n".join(render(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
