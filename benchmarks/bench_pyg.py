"""quietgnn ``centralized`` (CSR path) vs plain PyG, same model, data, epochs and threads.

    /work/venv/bin/python benchmarks/bench_pyg.py                  # all four datasets
    /work/venv/bin/python benchmarks/bench_pyg.py --datasets cora --epochs 50

For each dataset (Cora, CiteSeer, Computers, CS, loaded once by ``quietgnn.datasets``, so both
frameworks see the same graph, features and split) and each model (GCN, GraphSAGE):

* quietgnn: the ``centralized`` strategy (the code ``quietgnn train --strategy centralized``
  runs), driven in-process epoch by epoch;
* PyG: ``torch_geometric.nn.GCNConv`` / ``SAGEConv`` on ``edge_index`` (GCNConv with
  ``cached=True``, as in PyG's own GCN example, which favours PyG), the same stack:
  dropout -> conv -> ReLU -> dropout -> conv.

Both: 2 layers, hidden 64, dropout 0.5, Adam lr 0.01, weight decay 5e-4, 200 epochs
(``--epochs-for`` shortens the big datasets), one compute thread, one process. Timed: the
training step (forward, backward, optimizer step) of every epoch, wall and thread-CPU
seconds; evaluation every epoch, untimed; reported test accuracy at the best validation epoch. The two frameworks alternate per dataset x model in
one process, so machine noise hits both alike; the ratio is quietgnn / PyG (median epoch),
in wall seconds and in thread-CPU seconds (the latter is robust to a loaded machine).

Writes ``benchmarks/results/pyg.json`` and ``benchmarks/results/pyg.md``.
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


def quietgnn_runner(graph, arch: str, epochs: int, seed: int):
    """Yields (train seconds wall, cpu) per epoch and tracks best-val test accuracy."""
    import numpy as np
    from quietgnn.comm import Communicator
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import build_partitions
    from quietgnn.strategies import TrainConfig, WorkerContext, get_strategy
    part = build_partitions(graph, np.zeros(graph.num_nodes, dtype=np.int64))[0]
    cls = get_strategy("centralized")
    ctx = WorkerContext(rank=0, world_size=1, comm=Communicator(0, 1), part=part,
                        model_cfg=ModelConfig(arch=arch, hidden=64, layers=2, dropout=0.5),
                        train_cfg=TrainConfig(epochs=epochs, lr=0.01, weight_decay=5e-4,
                                              seed=seed), log=lambda m: None)
    torch.manual_seed(seed)
    s = cls(ctx, cls.Options())
    s.setup()
    return s.train_epoch, s.evaluate


def pyg_runner(graph, arch: str, epochs: int, seed: int):
    from torch_geometric.nn import GCNConv, SAGEConv
    n = graph.num_nodes
    dst = torch.repeat_interleave(torch.arange(n), graph.indptr[1:] - graph.indptr[:-1])
    edge_index = torch.stack([graph.indices, dst])      # source -> destination
    x, y = graph.x, graph.y
    torch.manual_seed(seed)
    if arch == "gcn":
        convs = torch.nn.ModuleList([GCNConv(x.shape[1], 64, cached=True),
                                     GCNConv(64, graph.num_classes, cached=True)])
    else:
        convs = torch.nn.ModuleList([SAGEConv(x.shape[1], 64), SAGEConv(64, graph.num_classes)])
    opt = torch.optim.Adam(convs.parameters(), lr=0.01, weight_decay=5e-4)

    def forward():
        h = x
        for i, conv in enumerate(convs):
            h = F.dropout(h, 0.5, convs.training)
            h = conv(h, edge_index)
            if i == 0:
                h = F.relu(h)
        return h

    def train_epoch(epoch):
        convs.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward()[graph.train_mask], y[graph.train_mask])
        loss.backward()
        opt.step()
        return loss

    def evaluate():
        convs.eval()
        with torch.no_grad():
            pred = forward().argmax(-1)
        return {k: float((pred[m] == y[m]).float().mean())
                for k, m in (("train", graph.train_mask), ("val", graph.val_mask),
                             ("test", graph.test_mask))}
    return train_epoch, evaluate


def measure(runner, graph, arch: str, epochs: int, seed: int) -> dict:
    train_epoch, evaluate = runner(graph, arch, epochs, seed)
    wall, cpu = [], []
    best_val, best_test = -1.0, float("nan")
    for ep in range(epochs):
        t0, c0 = time.perf_counter(), time.thread_time()
        train_epoch(ep)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        acc = evaluate()
        if acc["val"] > best_val:
            best_val, best_test = acc["val"], acc["test"]
    return {"epoch_s_median": statistics.median(wall), "epoch_s_mean": statistics.fmean(wall),
            "epoch_cpu_s_median": statistics.median(cpu), "test_acc": best_test,
            "val_acc": best_val}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,computers,cs")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--epochs-for", default="",
                    help="per-dataset epochs, e.g. computers=50,cs=50 (the big feature "
                         "matrices make 200 epochs too long on a shared 2-core machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--data", default=str(DATA), help="folder with planetoid/ amazon/ coauthor/")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from quietgnn.datasets import load_dataset
    import torch_geometric
    rows = []
    per_ds = {k: int(v) for k, v in (kv.split("=") for kv in args.epochs_for.split(",") if kv)}
    for ds in args.datasets.split(","):
        epochs = per_ds.get(ds, args.epochs)
        graph = load_dataset(ds, str(Path(args.data) / SUBDIR.get(ds, "")))
        for arch in args.models.split(","):
            # PyG first, then quietgnn, back to back on the same data
            pyg = measure(pyg_runner, graph, arch, epochs, args.seed)
            ours = measure(quietgnn_runner, graph, arch, epochs, args.seed)
            row = {"dataset": ds, "model": arch, "epochs": epochs, "nodes": graph.num_nodes,
                   "edges": graph.num_edges, "features": int(graph.x.shape[1]),
                   "quietgnn": ours, "pyg": pyg,
                   "ratio": ours["epoch_s_median"] / pyg["epoch_s_median"],
                   "cpu_ratio": ours["epoch_cpu_s_median"] / pyg["epoch_cpu_s_median"]}
            rows.append(row)
            print(f"{ds:10s} {arch:5s} quietgnn {1e3 * ours['epoch_s_median']:8.1f} ms "
                  f"acc {ours['test_acc']:.4f} | PyG {1e3 * pyg['epoch_s_median']:8.1f} ms acc "
                  f"{pyg['test_acc']:.4f} | ratio {row['ratio']:.2f} (CPU {row['cpu_ratio']:.2f})",
                  flush=True)
    meta = {"epochs": args.epochs, "seed": args.seed, "threads": 1, "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "when": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                time.gmtime()),
            "command": "python benchmarks/bench_pyg.py " + " ".join(argv or sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pyg.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = ["# quietgnn `centralized` vs PyG", "",
          f"{args.epochs} epochs (unless listed per row), 2 layers x 64, dropout 0.5, Adam lr "
          f"0.01 wd 5e-4, 1 thread, seed {args.seed}; torch {torch.__version__}, PyG "
          f"{torch_geometric.__version__}. "
          "Epoch time: median wall seconds of the training step (forward + backward + step). "
          "Accuracy: test at best validation epoch.", "",
          "| dataset | model | epochs | nodes | edges | quietgnn ms/epoch | PyG ms/epoch | ratio "
          "(quietgnn/PyG) | CPU-time ratio | quietgnn test acc | PyG test acc |", "|" + "---|" * 11]
    for r in rows:
        md.append(f"| {r['dataset']} | {r['model']} | {r['epochs']} | {r['nodes']} | "
                  f"{r['edges']} | "
                  f"{1e3 * r['quietgnn']['epoch_s_median']:.1f} | "
                  f"{1e3 * r['pyg']['epoch_s_median']:.1f} | {r['ratio']:.2f} | "
                  f"{r['cpu_ratio']:.2f} | "
                  f"{r['quietgnn']['test_acc']:.4f} | {r['pyg']['test_acc']:.4f} |")
    md += ["", f"Command: `{meta['command'].strip()}` ({meta['when']})", ""]
    (out / "pyg.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
