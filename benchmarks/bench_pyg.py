"""quietgnn ``centralized`` vs plain PyG, same model, data, epochs and threads.

    .venv/bin/python benchmarks/bench_pyg.py                  # Cora, CiteSeer, Computers, CS
    .venv/bin/python benchmarks/bench_pyg.py --datasets cora --epochs 50 --seeds 1

For each dataset (Cora, CiteSeer, Computers, CS, loaded once by ``quietgnn.datasets``, so both
frameworks see the same graph, features and split) and each model (GCN, GraphSAGE):

* quietgnn: the ``centralized`` strategy (the code ``quietgnn train --strategy centralized``
  runs), driven in-process epoch by epoch;
* PyG, in both of its ways of passing the graph, so it is compared at its best:
  ``edge_index`` (gather-scatter message passing, PyG's default and its examples') and
  ``adj_t`` (the transposed adjacency as a ``torch.sparse`` CSR tensor: one sparse-dense
  product per layer, PyG's documented fast path). ``GCNConv(cached=True)`` (normalisation
  computed once), ``SAGEConv`` with mean aggregation; the same stack:
  dropout -> conv -> ReLU -> dropout -> conv.

Both: 2 layers, hidden 64, dropout 0.5 (also on the input features), Adam lr 0.01, weight
decay 5e-4, one compute thread, one process, torch and PyG from the same environment.

Timing: the three runners train *interleaved*, one epoch each in turn (each with its own RNG
state, so every run draws the dropout masks it would draw alone), so load on the shared
machine hits all of them alike. Timed: the training step of every epoch (forward, backward,
optimizer step), wall and thread-CPU seconds; evaluation after every epoch, untimed. The
ratio is quietgnn / best PyG mode (median epoch), in wall seconds and thread-CPU seconds.

Accuracy: test accuracy at the best validation epoch, full-graph evaluation for both, over
``--seeds`` seeds (seed 0 from the timing round; further seeds train quietgnn and the faster
PyG mode only).

Writes ``benchmarks/results/pyg/pyg.json`` and ``pyg.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SUBDIR = {"cora": "planetoid", "citeseer": "planetoid", "computers": "amazon", "cs": "coauthor"}
PYG_MODES = ("edge_index", "adj_t")


def _sync(device: str) -> None:
    if device == "cuda":   # a GPU epoch ends when its kernels do
        torch.cuda.synchronize()


def quietgnn_runner(graph, arch: str, epochs: int, seed: int, device: str = "cpu"):
    """(train_epoch, evaluate, info) of the ``centralized`` strategy."""
    import numpy as np
    from quietgnn.comm import Communicator
    from quietgnn.nn import ModelConfig, SparseFeatures
    from quietgnn.partition import build_partitions
    from quietgnn.strategies import TrainConfig, WorkerContext, get_strategy
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    cls = get_strategy("centralized")
    ctx = WorkerContext(rank=0, world_size=1, comm=Communicator(0, 1, device=device), part=part,
                        device=torch.device(device),
                        model_cfg=ModelConfig(arch=arch, hidden=64, layers=2, dropout=0.5),
                        train_cfg=TrainConfig(epochs=epochs, lr=0.01, weight_decay=5e-4,
                                              seed=seed), log=lambda m: None)
    torch.manual_seed(seed)
    s = cls(ctx, cls.Options())
    s.setup()
    info = {"input_features": "sparse" if isinstance(s.x, SparseFeatures) else "dense"}
    return s.train_epoch, s.evaluate, info


def pyg_runner(graph, arch: str, epochs: int, seed: int, mode: str = "adj_t",
               device: str = "cpu"):
    from torch_geometric.nn import GCNConv, SAGEConv
    n = graph.num_nodes
    if mode == "edge_index":
        dst = torch.repeat_interleave(torch.arange(n), graph.indptr[1:] - graph.indptr[:-1])
        adj = torch.stack([graph.indices, dst])      # source -> destination
    elif mode == "adj_t":
        # row v lists v's in-neighbours: quietgnn's destination-indexed CSR *is* adj_t
        adj = torch.sparse_csr_tensor(graph.indptr, graph.indices, torch.ones(graph.num_edges),
                                      (n, n))
    else:
        raise ValueError(f"PyG mode {mode!r}; expected one of {PYG_MODES}")
    adj, x, y = adj.to(device), graph.x.to(device), graph.y.to(device)
    masks = {k: getattr(graph, f"{k}_mask").to(device) for k in ("train", "val", "test")}
    torch.manual_seed(seed)
    if arch == "gcn":
        convs = torch.nn.ModuleList([GCNConv(x.shape[1], 64, cached=True),
                                     GCNConv(64, graph.num_classes, cached=True)])
    else:
        convs = torch.nn.ModuleList([SAGEConv(x.shape[1], 64), SAGEConv(64, graph.num_classes)])
    convs = convs.to(device)
    opt = torch.optim.Adam(convs.parameters(), lr=0.01, weight_decay=5e-4)

    def forward():
        h = x
        for i, conv in enumerate(convs):
            h = F.dropout(h, 0.5, convs.training)
            h = conv(h, adj)
            if i == 0:
                h = F.relu(h)
        return h

    def train_epoch(epoch):
        convs.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward()[masks["train"]], y[masks["train"]])
        loss.backward()
        opt.step()
        return loss

    def evaluate():
        convs.eval()
        with torch.no_grad():
            pred = forward().argmax(-1)
        return {k: float((pred[m] == y[m]).float().mean()) for k, m in masks.items()}
    return train_epoch, evaluate, {"mode": mode}


class Run:
    """One training run, stepped an epoch at a time with its own RNG state."""

    def __init__(self, name: str, make, seed: int, device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.name, self.device = name, device
        self.train_epoch, self.evaluate, self.info = make()
        self.rng = torch.random.get_rng_state()
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.best_val, self.best_test = -1.0, float("nan")

    def step(self, epoch: int) -> None:
        torch.random.set_rng_state(self.rng)
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.thread_time()
        self.train_epoch(epoch)
        _sync(self.device)
        self.wall.append(time.perf_counter() - t0)
        self.cpu.append(time.thread_time() - c0)
        acc = self.evaluate()
        self.rng = torch.random.get_rng_state()
        if acc["val"] > self.best_val:
            self.best_val, self.best_test = acc["val"], acc["test"]

    def summary(self) -> dict:
        return {"epoch_s_median": statistics.median(self.wall),
                "epoch_s_mean": statistics.fmean(self.wall),
                "epoch_cpu_s_median": statistics.median(self.cpu),
                "test_acc": self.best_test, "val_acc": self.best_val, **self.info}


def run_together(makers: dict, epochs: int, seed: int, device: str = "cpu") -> dict[str, dict]:
    runs = [Run(name, make, seed, device) for name, make in makers.items()]
    for ep in range(epochs):
        for r in runs:
            r.step(ep)
    return {r.name: r.summary() for r in runs}


def _mean_std(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def compare(graph, arch: str, epochs: int, seeds: list[int]) -> dict:
    def makers(seed: int, modes) -> dict:
        out = {"quietgnn": lambda: quietgnn_runner(graph, arch, epochs, seed)}
        for m in modes:
            out[f"pyg_{m}"] = (lambda m=m: pyg_runner(graph, arch, epochs, seed, m))
        return out

    timed = run_together(makers(seeds[0], PYG_MODES), epochs, seeds[0])
    best = min(PYG_MODES, key=lambda m: timed[f"pyg_{m}"]["epoch_cpu_s_median"])
    accs = {"quietgnn": [timed["quietgnn"]["test_acc"]], "pyg": [timed[f"pyg_{best}"]["test_acc"]]}
    for seed in seeds[1:]:
        more = run_together(makers(seed, [best]), epochs, seed)
        accs["quietgnn"].append(more["quietgnn"]["test_acc"])
        accs["pyg"].append(more[f"pyg_{best}"]["test_acc"])
    q, p = timed["quietgnn"], timed[f"pyg_{best}"]
    return {"timing_seed": seeds[0], "seeds": seeds, "pyg_best_mode": best, "runs": timed,
            "ratio": q["epoch_s_median"] / p["epoch_s_median"],
            "cpu_ratio": q["epoch_cpu_s_median"] / p["epoch_cpu_s_median"],
            "test_acc": {k: dict(zip(("mean", "std"), _mean_std(v)), per_seed=v)
                         for k, v in accs.items()}}


def render(data: dict) -> list[str]:
    meta, rows = data["meta"], data["rows"]
    md = ["# quietgnn `centralized` vs PyG", "",
          f"2 layers x 64, dropout 0.5, Adam lr 0.01 wd 5e-4, 1 thread; torch {meta['torch']}, "
          f"PyG {meta['torch_geometric']}, Python {meta['python']}. Epoch time: median of the "
          "training step (forward + backward + optimizer step) over all epochs of seed "
          f"{meta['seeds'][0]}, the three runs interleaved epoch by epoch in one process. "
          "PyG is timed with `edge_index` and with `adj_t` (torch.sparse CSR); the ratio is "
          "against the faster of the two. Accuracy: test accuracy at the best validation "
          f"epoch, mean +- std over seeds {meta['seeds']}.", "",
          "| dataset | model | epochs | nodes | edges | features (density) | quietgnn ms/epoch | "
          "PyG edge_index ms | PyG adj_t ms | ratio vs best PyG (wall) | ratio (CPU time) | "
          "quietgnn test acc | PyG test acc |", "|" + "---|" * 13]
    for r in rows:
        c = r["runs"]
        acc = r["test_acc"]
        md.append(
            f"| {r['dataset']} | {r['model']} | {r['epochs']} | {r['nodes']:,} | {r['edges']:,} | "
            f"{r['features']} ({r['density']:.3f}, {c['quietgnn']['input_features']}) | "
            f"{1e3 * c['quietgnn']['epoch_s_median']:.1f} | "
            f"{1e3 * c['pyg_edge_index']['epoch_s_median']:.1f} | "
            f"{1e3 * c['pyg_adj_t']['epoch_s_median']:.1f} | {r['ratio']:.2f} | "
            f"{r['cpu_ratio']:.2f} | {acc['quietgnn']['mean']:.4f} +- {acc['quietgnn']['std']:.4f} | "
            f"{acc['pyg']['mean']:.4f} +- {acc['pyg']['std']:.4f} |")
    md += ["", f"Command: `{meta['command'].strip()}` ({meta['when']})", ""]
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,computers,cs")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--epochs-for", default="computers=100,cs=50",
                    help="per-dataset epochs (the big dense feature matrices make PyG's epochs "
                         "slow on a shared 2-core machine)")
    ap.add_argument("--seeds", default="0,1,2", help="seeds for accuracy (the first is timed)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pyg"))
    ap.add_argument("--data", default=str(DATA), help="folder with planetoid/ amazon/ coauthor/")
    ap.add_argument("--render-only", action="store_true", help="redraw pyg.md from pyg.json")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.render_only:
        md = render(json.loads((out / "pyg.json").read_text()))
        (out / "pyg.md").write_text("\n".join(md))
        print("\n".join(md))
        return 0
    torch.set_num_threads(1)
    import warnings
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    from quietgnn.datasets import load_dataset
    import torch_geometric
    seeds = [int(s) for s in args.seeds.split(",")]
    per_ds = {k: int(v) for k, v in (kv.split("=") for kv in args.epochs_for.split(",") if kv)}
    rows = []
    meta = {"epochs": args.epochs, "epochs_for": per_ds, "seeds": seeds, "threads": 1,
            "torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "command": "python benchmarks/bench_pyg.py " + " ".join(argv or sys.argv[1:])}
    out.mkdir(parents=True, exist_ok=True)
    for ds in args.datasets.split(","):
        epochs = per_ds.get(ds, args.epochs)
        graph = load_dataset(ds, str(Path(args.data) / SUBDIR.get(ds, "")))
        density = float((graph.x != 0).sum()) / graph.x.numel()
        for arch in args.models.split(","):
            t0 = time.perf_counter()
            res = compare(graph, arch, epochs, seeds)
            row = {"dataset": ds, "model": arch, "epochs": epochs, "nodes": graph.num_nodes,
                   "edges": graph.num_edges, "features": int(graph.x.shape[1]),
                   "density": density, **res, "elapsed_s": time.perf_counter() - t0}
            rows.append(row)
            c = res["runs"]
            print(f"{ds:10s} {arch:5s} quietgnn {1e3 * c['quietgnn']['epoch_s_median']:8.1f} ms"
                  f" | PyG edge_index {1e3 * c['pyg_edge_index']['epoch_s_median']:8.1f} ms, "
                  f"adj_t {1e3 * c['pyg_adj_t']['epoch_s_median']:8.1f} ms | ratio "
                  f"{row['ratio']:.2f} (CPU {row['cpu_ratio']:.2f}) | acc "
                  f"{res['test_acc']['quietgnn']['mean']:.4f} vs "
                  f"{res['test_acc']['pyg']['mean']:.4f}", flush=True)
            # written after every row: a long run that is stopped keeps what it measured
            meta["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            data = {"meta": meta, "rows": rows}
            (out / "pyg.json").write_text(json.dumps(data, indent=1))
            (out / "pyg.md").write_text("\n".join(render(data)))
    print("\n".join(render({"meta": meta, "rows": rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
