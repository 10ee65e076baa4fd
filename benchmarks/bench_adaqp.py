"""AdaQP against `halo`: halo traffic, accuracy, projected LAN epoch time, bit-widths, overlap.

    /work/venv/bin/python benchmarks/bench_adaqp.py                       # the default matrix
    /work/venv/bin/python benchmarks/bench_adaqp.py --datasets cora --configs small --seeds 0

P = 4 (METIS), GCN and SAGE, configs ``small`` (2 layers, hidden 64) and ``paper`` (3 layers,
hidden 256, LayerNorm, as in the AdaQP paper); strategies ``halo`` and ``adaqp`` (adaptive,
``time_model=lan``: on this loopback-only machine a start-up profile measures memory copies,
not a network, so the assignment uses the LAN tier the projection reports), plus an overlap
off/on pair at 8 bits. Every (dataset, config, seed) runs all its strategies in one set of 4
gloo processes (``spawn_function``; one compute thread each), with the same seed, epochs and
hyperparameters. Per run it records, per epoch and rank, the communicator's rounds and the
CPU time of the training step outside communication, and derives:

* halo bytes / epoch: ``halo_fwd + halo_bwd`` vs ``adaqp_fwd + adaqp_bwd`` (+ the
  assignment's ``adaqp_assign``), sent, summed over ranks, training phase;
* test accuracy at the best validation epoch (evaluation every epoch, fp32 messages);
* projected LAN epoch time (1 Gbit/s, 0.5 ms; :mod:`quietgnn.comm.network`): per round hops x
  latency + slowest rank's bytes / bandwidth, plus the slowest rank's compute -- no credit
  for overlap (an upper bound for adaqp);
* the bit-width histogram (rows sent per width over all epochs and ranks), and the overlap
  measurement: seconds the exchanges were in flight vs seconds spent blocked waiting.

Writes ``benchmarks/results/adaqp.json`` (raw per-run figures; reruns merge by run key) and
``benchmarks/results/adaqp.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = Path("/tmp/quietgnn-bench-adaqp")
CONFIGS = {"small": dict(layers=2, hidden=64, norm="none"),
           "paper": dict(layers=3, hidden=256, norm="layer")}
PYG = {"cora": ("planetoid", "Cora"), "citeseer": ("planetoid", "CiteSeer"),
       "computers": ("amazon", "Computers"), "cs": ("coauthor", "CS")}
STRATEGIES = {"halo": ("halo", {}),
              "adaqp": ("adaqp", {"bits": "adaptive", "time_model": "lan", "assign_cycle": 5}),
              "adaqp8-no-overlap": ("adaqp", {"bits": 8, "overlap": False}),
              "adaqp8-overlap": ("adaqp", {"bits": 8, "overlap": True})}
HALO_KINDS = {"halo_fwd", "halo_bwd", "adaqp_fwd", "adaqp_bwd", "adaqp_assign"}


def load_graph(name: str):
    """The dataset as a quietgnn Graph (``quietgnn.datasets`` if it has landed, else PyG on a
    copy of the shared folder; ``synthetic``: a seeded homophilous random graph)."""
    from quietgnn.graph import Graph
    try:
        from quietgnn.datasets import load_dataset
        return load_dataset(name, str(ROOT.parent / "shared" / "data" / PYG[name][0])
                            if name in PYG else None)
    except Exception:
        pass
    if name == "synthetic":
        g = torch.Generator().manual_seed(0)
        n, c, deg = 5000, 8, 10
        y = torch.randint(0, c, (n,), generator=g)
        src = torch.randint(0, n, (n * deg // 2,), generator=g)
        same = torch.rand(src.numel(), generator=g) < 0.8     # 80% intra-class edges
        pool = [torch.nonzero(y == k).flatten() for k in range(c)]
        dst = torch.randint(0, n, (src.numel(),), generator=g)
        for k in range(c):
            sel = same & (y[src] == k)
            dst[sel] = pool[k][torch.randint(0, pool[k].numel(), (int(sel.sum()),), generator=g)]
        x = torch.randn(n, 64, generator=g) * 2 + torch.nn.functional.one_hot(y, 64).float()
        return Graph.from_edge_index(torch.stack([src, dst]), x, y, num_classes=c,
                                     name="synthetic")
    import torch_geometric.datasets as D
    group, folder = PYG[name]
    tmp = CACHE / "data" / group
    if not (tmp / folder).exists():
        shutil.copytree(ROOT.parent / "shared" / "data" / group / folder, tmp / folder)
    if group == "planetoid":
        d = D.Planetoid(str(tmp), folder)[0]
        return Graph.from_edge_index(d.edge_index, d.x, d.y, num_classes=int(d.y.max()) + 1,
                                     train_mask=d.train_mask, val_mask=d.val_mask,
                                     test_mask=d.test_mask, name=name)
    d = (D.Amazon if group == "amazon" else D.Coauthor)(str(tmp), folder)[0]
    return Graph.from_edge_index(d.edge_index, d.x, d.y, num_classes=int(d.y.max()) + 1,
                                 name=name, split_seed=0)


def book_for(name: str, P: int) -> str:
    from quietgnn.partition.book import make_book
    path = CACHE / "books" / f"{name}-metis-p{P}"
    if not (path / "book.json").is_file():
        make_book(path, load_graph(name), "metis", P, seed=0)
    return str(path)


def _worker(comm, book, model_kw, seed, strategies, epochs):
    """One rank: every strategy in turn on this rank's part; per-epoch rounds and compute."""
    from quietgnn.nn import ModelConfig
    from quietgnn.partition import PartitionBook
    from quietgnn.strategies import get_strategy
    from quietgnn.strategies.base import TrainConfig, WorkerContext, options_from_dict
    torch.set_num_threads(1)
    part = PartitionBook.open(book).load_part(comm.rank, comm.world_size)
    out = {}
    for label, (name, opts) in strategies.items():
        torch.manual_seed(seed * 1000 + comm.rank)
        cls = get_strategy(name)
        ctx = WorkerContext(rank=comm.rank, world_size=comm.world_size, comm=comm, part=part,
                            model_cfg=ModelConfig(arch=model_kw["arch"], hidden=model_kw["hidden"],
                                                  layers=model_kw["layers"], dropout=0.5,
                                                  norm=model_kw["norm"]),
                            train_cfg=TrainConfig(epochs=epochs, lr=0.01, seed=seed),
                            log=lambda m: None)
        s = cls(ctx, options_from_dict(cls, dict(opts)))
        comm.epoch = -1
        comm.take_records()
        with comm.phase("setup"):
            s.setup()
        comm.take_records()
        rows = []
        for ep in range(epochs):
            comm.epoch = ep
            t0, c0 = time.perf_counter(), time.thread_time()
            with comm.phase("train"):
                res = s.train_epoch(ep)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            recs = comm.take_records()
            with comm.phase("eval"):
                acc = s.evaluate()
            comm.take_records()
            rows.append({"epoch": ep, "wall_s": wall,
                         "compute_s": max(0.0, cpu - sum(r.cpu_seconds for r in recs)),
                         "rounds": [[r.round, r.kind, r.phase, r.bytes_sent, r.bytes_recv,
                                     r.hops] for r in recs],
                         "bytes": {"train": {"sent": sum(r.bytes_sent for r in recs)}},
                         "extra": res.extra, "test_acc": acc["test"], "val_acc": acc["val"]})
        out[label] = rows
    return out


def summarize(per_rank: list[list[dict]]) -> dict:
    from quietgnn.comm.network import TIERS, epoch_curve, project
    curve = epoch_curve({k: recs for k, recs in enumerate(per_rank)})
    lan = project(curve, TIERS["lan"])
    r0 = per_rank[0]
    best = max(range(len(r0)), key=lambda e: (r0[e]["val_acc"], -e))
    halo_bytes = [sum(rd[3] for rk in per_rank for rd in rk[e]["rounds"] if rd[1] in HALO_KINDS)
                  for e in range(len(r0))]
    hist: dict[str, int] = {}
    span = wait = codec = 0.0
    for rk in per_rank:
        for row in rk:
            ex = row.get("extra") or {}
            for b, n in (ex.get("bits_hist") or {}).items():
                hist[b] = hist.get(b, 0) + n
            span += ex.get("exch_span_s", 0.0)
            wait += ex.get("exch_wait_s", 0.0)
            codec += ex.get("codec_s", 0.0)
    E = len(r0)
    return {"test_acc": r0[best]["test_acc"], "best_epoch": best,
            "halo_bytes_per_epoch": statistics.mean(halo_bytes),
            "train_bytes_per_epoch": statistics.mean(c["train_bytes"] for c in curve["epochs"]),
            "lan_epoch_s": statistics.mean(p["time_s"] for p in lan),
            "lan_comm_s": statistics.mean(p["comm_s"] for p in lan),
            "compute_s": statistics.mean(p["compute_s"] for p in lan),
            "wall_s": statistics.mean(max(rk[e]["wall_s"] for rk in per_rank) for e in range(E)),
            "bits_hist": hist, "exch_span_s": span / E / len(per_rank),
            "exch_wait_s": wait / E / len(per_rank), "codec_s": codec / E / len(per_rank)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer,synthetic")
    ap.add_argument("--configs", default="small")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--strategies", default="halo,adaqp")
    ap.add_argument("--parts", type=int, default=4)
    args = ap.parse_args(argv)
    from quietgnn.runtime.launcher import spawn_function
    RESULTS.mkdir(parents=True, exist_ok=True)
    jpath = RESULTS / "adaqp.json"
    data = json.loads(jpath.read_text()) if jpath.exists() else {"runs": {}}
    strategies = {k: STRATEGIES[k] for k in args.strategies.split(",")}
    for ds in args.datasets.split(","):
        book = book_for(ds, args.parts)
        for cfg in args.configs.split(","):
            for arch in args.models.split(","):
                for seed in [int(s) for s in args.seeds.split(",")]:
                    t0 = time.perf_counter()
                    res = spawn_function(_worker, args.parts, timeout_s=3600, args=(
                        book, dict(arch=arch, **CONFIGS[cfg]), seed, strategies, args.epochs))
                    for label in strategies:
                        key = f"{ds}|{cfg}|{arch}|{label}|{seed}|{args.epochs}"
                        data["runs"][key] = summarize([r[label] for r in res])
                    print(f"{ds} {cfg} {arch} seed {seed}: {time.perf_counter() - t0:.0f}s "
                          + " ".join(f"{k}={data['runs'][f'{ds}|{cfg}|{arch}|{k}|{seed}|{args.epochs}']['test_acc']:.3f}"
                                     for k in strategies), flush=True)
                    data["command"] = "python benchmarks/bench_adaqp.py " + " ".join(
                        sys.argv[1:] if argv is None else argv)
                    jpath.write_text(json.dumps(data, indent=1))
    (RESULTS / "adaqp.md").write_text(report(data))
    return 0


def _fmt_b(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


def report(data: dict) -> str:
    groups: dict[tuple, dict[str, list]] = {}
    for key, r in data["runs"].items():
        ds, cfg, arch, label, seed, epochs = key.split("|")
        groups.setdefault((ds, cfg, arch, epochs), {}).setdefault(label, []).append(r)
    lines = ["# AdaQP vs halo (P = 4, METIS)", "",
             "Produced by `benchmarks/bench_adaqp.py` on the shared 2-core machine (4 gloo "
             "processes, one compute thread each; the machine was loaded by other work, so "
             "measured seconds are noisy -- ratios come from the same run). `halo B/ep`: halo "
             "rows sent per epoch summed over ranks (adaqp: quantized rows + assignment "
             "traffic). `LAN ep`: projected epoch time at 1 Gbit/s, 0.5 ms (no credit for "
             "overlap). Accuracy: test accuracy at the best validation epoch, mean over seeds.",
             "",
             "| dataset | config | model | epochs | seeds | halo acc | adaqp acc | delta (pts) | "
             "halo B/ep | adaqp B/ep | bytes ratio | LAN ep halo | LAN ep adaqp | LAN ratio | "
             "adaqp widths (2/4/8 bit %) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (ds, cfg, arch, ep), g in sorted(groups.items()):
        if "halo" not in g or "adaqp" not in g:
            continue
        h, a = g["halo"], g["adaqp"]
        m = lambda rs, k: statistics.mean(r[k] for r in rs)  # noqa: E731
        hist: dict[str, int] = {}
        for r in a:
            for b, n in r["bits_hist"].items():
                hist[b] = hist.get(b, 0) + n
        tot = sum(hist.values()) or 1
        widths = " / ".join(f"{100 * hist.get(b, 0) / tot:.0f}" for b in ("2", "4", "8"))
        lines.append(
            f"| {ds} | {cfg} | {arch} | {ep} | {len(a)} | {m(h, 'test_acc'):.4f} | "
            f"{m(a, 'test_acc'):.4f} | {100 * (m(a, 'test_acc') - m(h, 'test_acc')):+.2f} | "
            f"{_fmt_b(m(h, 'halo_bytes_per_epoch'))} | {_fmt_b(m(a, 'halo_bytes_per_epoch'))} | "
            f"{m(h, 'halo_bytes_per_epoch') / m(a, 'halo_bytes_per_epoch'):.2f}x | "
            f"{1e3 * m(h, 'lan_epoch_s'):.1f} ms | {1e3 * m(a, 'lan_epoch_s'):.1f} ms | "
            f"{m(h, 'lan_epoch_s') / m(a, 'lan_epoch_s'):.2f}x | {widths} |")
    ov = [(k, g) for k, g in sorted(groups.items())
          if "adaqp8-overlap" in g and "adaqp8-no-overlap" in g]
    if ov:
        lines += ["", "## Overlap (8 bits, overlap off vs on)", "",
                  "Per rank and epoch: `in flight` = seconds from starting an exchange to "
                  "having its data, `blocked` = seconds of that spent waiting in `wait()` "
                  "(the rest ran concurrently with central-row computation), `step` = measured "
                  "wall seconds of the training step (slowest rank).", "",
                  "| dataset | config | model | off: in flight / blocked / step | "
                  "on: in flight / blocked / step | hidden (on) |", "|---|---|---|---|---|---|"]
        for (ds, cfg, arch, ep), g in ov:
            f = lambda r: (f"{1e3 * r['exch_span_s']:.1f} / {1e3 * r['exch_wait_s']:.1f} / "  # noqa: E731
                           f"{1e3 * r['wall_s']:.0f} ms")
            off, on = g["adaqp8-no-overlap"][0], g["adaqp8-overlap"][0]
            hid = 1 - on["exch_wait_s"] / on["exch_span_s"] if on["exch_span_s"] else 0.0
            lines.append(f"| {ds} | {cfg} | {arch} | {f(off)} | {f(on)} | {100 * hid:.0f}% |")
    lines += ["", f"Command: `{data.get('command', '')}` (results merged over invocations; "
              f"the JSON holds every run)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
