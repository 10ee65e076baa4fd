"""Sampling throughput of the bulk sampler (issue 8, docs/methods.md section 5).

Measures, on one run of this script (the machine is shared and noisy: compare ratios within
one run only):

1. single-rank sampled edges per second (SEPS) for bulk sizes k in {1, 4, 16, 64} on
   synthetic power-law graphs (~1e6 and ~1e7 directed edges) and on Amazon Computers and
   Coauthor CS; GraphSAGE fanouts 15,10,5 (uniform rows), plus LADIES on the real graphs;
   a fixed total of minibatches per k (so k=1 makes 64 calls, k=64 one call);
2. PyG NeighborLoader on the same graphs/fanouts -- only if ``pyg_lib`` or ``torch_sparse``
   imports (recorded as not run otherwise);
3. distributed sampling with P = 4 gloo processes on this machine: the 1.5D sampler with
   c in {1, 2} (and the replicated topology, which needs no communication), k in {1, 16}:
   time per minibatch and sampling bytes per rank.

Run: ``/work/venv/bin/python benchmarks/bench_sampling.py [--quick]``
Writes ``benchmarks/results/sampling.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quietgnn.graph import Graph, csr_from_edges  # noqa: E402
from quietgnn.sampling import NeighborSampler  # noqa: E402
from quietgnn.sampling.ladies import LadiesSampler  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHARED = Path(os.environ.get("QUIETGNN_SHARED_DATA", ROOT.parent / "shared" / "data"))


def power_law_csr(n: int, avg_degree: float, gamma: float = 2.5, seed: int = 0):
    """Chung-Lu style undirected power-law graph (expected degrees ~ Pareto(gamma)) as a
    destination-indexed CSR: ~n * avg_degree directed edges after de-duplication."""
    g = torch.Generator().manual_seed(seed)
    theta = (1 - torch.rand(n, generator=g, dtype=torch.float64)) ** (-1 / (gamma - 1))
    theta = theta.clamp(max=n ** 0.5)
    m = int(n * avg_degree / 2 * 1.05)
    src = torch.multinomial(theta.float(), m, replacement=True, generator=g)
    dst = torch.multinomial(theta.float(), m, replacement=True, generator=g)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return csr_from_edges(torch.cat([src, dst]), torch.cat([dst, src]), n)


def load_real(name: str) -> Graph | None:
    """Computers / CS (random 60/20/20 split, seed 0) through ``load_dataset`` (which copies
    the read-only shared folder to its cache)."""
    from quietgnn.datasets import load_dataset
    if not SHARED.exists():
        return None
    return load_dataset(name, root=str(SHARED), split_seed=0)


def seps(sampler, n: int, batch: int, k: int, total: int, seed: int = 0) -> dict:
    """Sample ``total`` minibatches of ``batch`` random targets in calls of k."""
    g = torch.Generator().manual_seed(seed)
    edges, t_all = 0, 0.0
    for c in range(total // k):
        targets = torch.cat([torch.randperm(n, generator=g)[:batch] for _ in range(k)])
        off = torch.arange(k + 1, dtype=torch.int64) * batch
        ids = torch.arange(k) + c * k
        t0 = time.perf_counter()
        bulk = sampler.sample(targets, off, ids)
        t_all += time.perf_counter() - t0
        edges += bulk.num_sampled_edges()
    return {"k": k, "sampled_edges": edges, "seconds": t_all, "seps": edges / t_all,
            "ms_per_minibatch": 1e3 * t_all / total}


def pyg_available() -> str | None:
    for mod in ("pyg_lib", "torch_sparse"):
        if importlib.util.find_spec(mod) is not None:
            return mod
    return None


# ---------------------------------------------------------------------- distributed
def _dist_work(comm, indptr, indices, parts, fanouts, batch, ks, total, modes):
    torch.set_num_threads(1)
    from quietgnn.graph import Graph as G
    from quietgnn.partition import build_partitions
    from quietgnn.sampling.dist import Sampler15D
    n = indptr.numel() - 1
    graph = G(indptr, indices, torch.zeros(n, 1), torch.zeros(n, dtype=torch.int64),
              torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool),
              torch.zeros(n, dtype=torch.bool), 1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    out = []
    for mode, c in modes:
        if mode == "replicated":
            sampler = NeighborSampler(indptr, indices, fanouts, seed=0)
        else:
            sampler = Sampler15D(comm, part, fanouts, c, seed=0)
        comm.take_records()
        for k in ks:
            group = comm.rank // c
            g = torch.Generator().manual_seed(group)
            comm.barrier()
            comm.take_records()
            t0 = time.perf_counter()
            edges = 0
            for call in range(total // k):
                targets = torch.cat([torch.randperm(n, generator=g)[:batch] for _ in range(k)])
                off = torch.arange(k + 1, dtype=torch.int64) * batch
                bulk = sampler.sample(targets, off, torch.arange(k) + call * k + 1000 * group)
                edges += bulk.num_sampled_edges()
            dt = time.perf_counter() - t0
            recs = comm.take_records()
            sent = sum(r.bytes_sent for r in recs if r.kind.startswith("sample"))
            rounds = sum(1 for r in recs if r.kind.startswith("sample"))
            out.append({"mode": mode, "c": c, "k": k, "seconds": dt, "edges": edges,
                        "minibatches": total, "sample_bytes_sent": sent, "rounds": rounds})
    return out


def distributed(n: int, avg: float, batch: int, total: int, quick: bool) -> list[dict]:
    from quietgnn.partition import partition_nodes
    from quietgnn.runtime.launcher import spawn_function
    indptr, indices = power_law_csr(n, avg, seed=3)
    g = Graph(indptr, indices, torch.zeros(n, 1), torch.zeros(n, dtype=torch.int64),
              torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool),
              torch.zeros(n, dtype=torch.bool), 1)
    parts = partition_nodes(g, "random", 4, seed=0)
    modes = [("replicated", 1), ("1.5d", 1), ("1.5d", 2)]
    res = spawn_function(_dist_work, 4, args=(indptr, indices, parts, [15, 10, 5], batch,
                                              [1, 16], total, modes))
    rows = []
    for i, r0 in enumerate(res[0]):
        per_rank = [r[i] for r in res]
        rows.append({**{k: r0[k] for k in ("mode", "c", "k", "minibatches")},
                     "graph": f"powerlaw n={n} E={indices.numel()}",
                     "max_seconds": max(r["seconds"] for r in per_rank),
                     "ms_per_minibatch": 1e3 * max(r["seconds"] for r in per_rank) / total,
                     "sample_MB_sent_per_rank": sum(r["sample_bytes_sent"] for r in per_rank)
                     / 4 / 1e6,
                     "rounds_per_rank": r0["rounds"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small graphs only (smoke run)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--total", type=int, default=64, help="minibatches per k")
    args = ap.parse_args()
    # one thread: on a shared, oversubscribed machine intra-op threads slow sampling ~9x
    torch.set_num_threads(1)
    fan = [15, 10, 5]
    ks = [1, 4, 16, 64]
    graphs = [("powerlaw-1e6", 100_000, 10.0)] if args.quick else \
        [("powerlaw-1e6", 100_000, 10.0), ("powerlaw-1e7", 1_000_000, 10.0)]
    rows = []
    for name, n, avg in graphs:
        t0 = time.perf_counter()
        indptr, indices = power_law_csr(n, avg)
        print(f"{name}: n={n} E={indices.numel()} built in {time.perf_counter() - t0:.1f}s",
              flush=True)
        s = NeighborSampler(indptr, indices, fan, seed=0)
        for k in ks:
            r = seps(s, n, args.batch, k, args.total)
            rows.append({"graph": name, "nodes": n, "edges": indices.numel(), "sampler": "sage",
                         "fanouts": fan, "batch": args.batch, **r})
            print(rows[-1], flush=True)
        del s, indptr, indices
    for name in ([] if args.quick else ["computers", "cs"]):
        g = load_real(name)
        if g is None:
            continue
        for label, s in (("sage", NeighborSampler(g.indptr, g.indices, fan, seed=0)),
                         ("ladies", LadiesSampler(g.indptr, g.indices, [512, 512, 512],
                                                  seed=0))):
            for k in ks:
                r = seps(s, g.num_nodes, args.batch, k, args.total)
                rows.append({"graph": name, "nodes": g.num_nodes, "edges": g.num_edges,
                             "sampler": label, "fanouts": s.fanouts, "batch": args.batch, **r})
                print(rows[-1], flush=True)
    pyg = pyg_available()
    pyg_note = (f"{pyg} importable but the comparison is not implemented in this run" if pyg
                else "not run: neither pyg_lib nor torch_sparse is installed (NeighborLoader "
                     "needs one; torch-sparse takes ~35 min of both cores to build)")
    dist_rows = distributed(20_000 if args.quick else 100_000, 10.0, 128, 16, args.quick)
    for r in dist_rows:
        print(r, flush=True)
    out = {"single_rank": rows, "pyg_neighborloader": pyg_note, "distributed": dist_rows,
           "torch_threads": torch.get_num_threads(), "note": "shared 2-core machine, noisy"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sampling.json").write_text(json.dumps(out, indent=1))
    md = ["# Bulk sampling throughput", "",
          f"`python benchmarks/bench_sampling.py` (batch {args.batch} targets, "
          f"{args.total} minibatches per k; shared 2-core machine: compare within a table).", "",
          "| graph | edges | sampler | fanouts | k | sampled edges | s | M SEPS | ms/minibatch |",
          "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['graph']} | {r['edges']:,} | {r['sampler']} | "
                  f"{','.join(map(str, r['fanouts']))} | {r['k']} | {r['sampled_edges']:,} | "
                  f"{r['seconds']:.2f} | {r['seps'] / 1e6:.2f} | {r['ms_per_minibatch']:.1f} |")
    md += ["", f"PyG NeighborLoader: {pyg_note}.", "",
           "## Distributed sampling, P = 4 (4 gloo processes on 2 shared cores)", "",
           "| graph | mode | c | k | ms/minibatch (slowest rank) | sampling MB sent/rank | "
           "collectives/rank |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in dist_rows:
        md.append(f"| {r['graph']} | {r['mode']} | {r['c']} | {r['k']} | "
                  f"{r['ms_per_minibatch']:.1f} | {r['sample_MB_sent_per_rank']:.2f} | "
                  f"{r['rounds_per_rank']} |")
    (RESULTS / "sampling.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
