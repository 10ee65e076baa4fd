"""Sampling throughput of the bulk sampler (issue 8, docs/methods.md section 5).

Measures, in one run of this script (the machine is shared and noisy: compare ratios within
one run only):

1. single-rank sampled edges per second (SEPS) for bulk sizes k in {1, 4, 16, 64} on
   synthetic power-law graphs (~1e6 and ~1e7 directed edges) and on Amazon Computers and
   Coauthor CS; GraphSAGE fanouts 15,10,5 (uniform rows), plus LADIES on the real graphs.
   Every measurement samples the same ``--total`` minibatches of ``--batch`` random targets
   (k = 1: ``total`` calls; k = 64: ``total / 64`` calls) and slices every minibatch out of
   its bulk (``Bulk.minibatch``), as a training loop does;
2. PyG's ``NeighborLoader`` on the same graph, fanouts, batch size and target sequence (it
   needs ``pyg_lib`` or ``torch_sparse``; recorded as not run otherwise), plus the bare
   ``torch_sparse.neighbor_sample`` kernel the loader calls, for reference. PyG and every k
   are measured in the same process with the same single thread, interleaved over
   ``--reps`` rounds (the order rotates each round); each reports its fastest round, in wall
   seconds and in thread-CPU seconds (the latter is robust to other load on the machine),
   and the ratio quietgnn / PyG is taken within the run. Semantics differ slightly: PyG
   samples the neighbours of every *newly reached* node once (one subgraph), quietgnn samples
   every row of every level (one block per hop, targets first), so it draws more edges per
   minibatch; SEPS compares the rates;
3. distributed sampling with P = 4 gloo processes on this machine: the 1.5D sampler with
   c in {1, 2} (and the replicated topology, which needs no communication), k in {1, 16}:
   time per minibatch and sampling bytes per rank.

Run (PyG needs torch-sparse, which is not a project dependency: a separate venv)::

    /work/venv-bench/bin/python benchmarks/bench_sampling.py [--quick]

Writes ``benchmarks/results/sampling/sampling.{json,md}``.
"""

from __future__ import annotations

import argparse
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

RESULTS = ROOT / "benchmarks" / "results" / "sampling"
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


def requests(n: int, batch: int, total: int, seed: int = 0) -> list[torch.Tensor]:
    """``total`` minibatches of ``batch`` distinct random targets (one fixed sequence)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g)[:batch] for _ in range(total)]


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def run_quiet(sampler, reqs: list[torch.Tensor], k: int) -> dict:
    """Sample ``reqs`` in bulks of k and slice out every minibatch (timed)."""
    edges, wall, cpu = 0, 0.0, 0.0
    batch = reqs[0].numel()
    for c in range(len(reqs) // k):
        targets = torch.cat(reqs[c * k:(c + 1) * k])
        off = torch.arange(k + 1, dtype=torch.int64) * batch
        ids = torch.arange(k) + c * k
        w0, c0 = _clock()
        bulk = sampler.sample(targets, off, ids)
        for i in range(k):
            bulk.minibatch(i)
        w1, c1 = _clock()
        wall, cpu = wall + w1 - w0, cpu + c1 - c0
        edges += bulk.num_sampled_edges()
    return {"sampled_edges": edges, "wall_s": wall, "cpu_s": cpu}


def pyg_available() -> str | None:
    """Which NeighborLoader backend PyG uses here (None: it cannot run).

    torch-sparse's Python package imports torch-scatter; where only torch-sparse was built
    (torch-scatter is another long source build), its compiled kernels are loaded directly
    and PyG's ``WITH_TORCH_SPARSE`` flag is set, so ``NeighborLoader`` runs its unchanged
    torch-sparse code path (``torch.ops.torch_sparse.neighbor_sample``).
    """
    try:
        import torch_geometric.typing as tgt
    except ImportError:
        return None
    if tgt.WITH_PYG_LIB:
        return "pyg_lib"
    if tgt.WITH_TORCH_SPARSE:
        return "torch_sparse"
    import glob
    import importlib.util
    spec = importlib.util.find_spec("torch_sparse")
    if spec is None or spec.origin is None:
        return None
    libs = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "_*_cpu.so")))
    try:
        for lib in libs:
            torch.ops.load_library(lib)
        torch.ops.torch_sparse.neighbor_sample   # noqa: B018 (raises if not registered)
    except (OSError, RuntimeError, AttributeError):
        return None
    tgt.WITH_TORCH_SPARSE = True
    return "torch_sparse kernels (loaded directly: torch_scatter, which torch_sparse's " \
        "Python part imports, is not installed)"


class PyGRunner:
    """NeighborLoader over the same targets (and the bare torch_sparse kernel)."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int],
                 reqs: list[torch.Tensor]) -> None:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
        n = indptr.numel() - 1
        dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
        # quietgnn's CSR is destination-indexed (row v = in-neighbours of v); PyG samples
        # incoming edges of edge_index (source -> destination): the same neighbourhoods
        data = Data(edge_index=torch.stack([indices, dst]), num_nodes=n)
        self.batch = reqs[0].numel()
        self.seeds = torch.cat(reqs)
        self.loader = NeighborLoader(data, num_neighbors=list(fanouts), batch_size=self.batch,
                                     input_nodes=self.seeds, shuffle=False)
        self.fanouts = list(fanouts)
        sampler = self.loader.node_sampler
        self.colptr, self.row = sampler.colptr, sampler.row   # built once, untimed

    def run_loader(self) -> dict:
        edges = 0
        w0, c0 = _clock()
        for b in self.loader:
            edges += b.edge_index.size(1)
        w1, c1 = _clock()
        return {"sampled_edges": edges, "wall_s": w1 - w0, "cpu_s": c1 - c0}

    def run_kernel(self) -> dict:
        op = torch.ops.torch_sparse.neighbor_sample
        edges = 0
        w0, c0 = _clock()
        for seed in self.seeds.split(self.batch):
            node, row, col, edge = op(self.colptr, self.row, seed, self.fanouts, False, True)
            edges += row.numel()
        w1, c1 = _clock()
        return {"sampled_edges": edges, "wall_s": w1 - w0, "cpu_s": c1 - c0}


def compare(graph: str, indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int],
            ks: list[int], reqs: list[torch.Tensor], reps: int, pyg: str | None,
            ladies: bool = False) -> list[dict]:
    """All k of quietgnn (and PyG) on one graph, interleaved over ``reps`` rounds."""
    n, E = indptr.numel() - 1, indices.numel()
    runs: dict[str, object] = {}
    sampler = NeighborSampler(indptr, indices, fanouts, seed=0)
    for k in ks:
        runs[f"sage k={k}"] = (lambda k=k: run_quiet(sampler, reqs, k))
    if ladies:
        lad = LadiesSampler(indptr, indices, [512] * len(fanouts), seed=0)
        for k in ks:
            runs[f"ladies k={k}"] = (lambda k=k: run_quiet(lad, reqs, k))
    if pyg:
        pr = PyGRunner(indptr, indices, fanouts, reqs)
        runs["pyg NeighborLoader"] = pr.run_loader
        if pyg.startswith("torch_sparse"):
            runs["pyg kernel (torch_sparse.neighbor_sample)"] = pr.run_kernel
    names = list(runs)
    for name in names:          # warm-up: scratch buffers, CSC conversion, page cache
        runs[name]()
    best: dict[str, dict] = {}
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            r = runs[name]()
            b = best.setdefault(name, {"wall_s": float("inf"), "cpu_s": float("inf")})
            b.update(sampled_edges=r["sampled_edges"], wall_s=min(b["wall_s"], r["wall_s"]),
                     cpu_s=min(b["cpu_s"], r["cpu_s"]))
        print(graph, rep, {k: round(v["sampled_edges"] / v["cpu_s"] / 1e6, 2)
                           for k, v in best.items()}, flush=True)
    ref = best.get("pyg NeighborLoader")
    rows = []
    for name in names:
        b = best[name]
        row = {"graph": graph, "nodes": n, "edges": E, "run": name,
               "fanouts": [512] * len(fanouts) if name.startswith("ladies") else fanouts,
               "batch": reqs[0].numel(), "minibatches": len(reqs), "reps": reps, **b,
               "seps_wall": b["sampled_edges"] / b["wall_s"],
               "seps_cpu": b["sampled_edges"] / b["cpu_s"],
               "ms_per_minibatch_wall": 1e3 * b["wall_s"] / len(reqs)}
        if ref is not None and name.startswith("sage"):
            row["vs_pyg_wall"] = row["seps_wall"] / (ref["sampled_edges"] / ref["wall_s"])
            row["vs_pyg_cpu"] = row["seps_cpu"] / (ref["sampled_edges"] / ref["cpu_s"])
        rows.append(row)
    return rows


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
    from quietgnn.runtime.spawn import spawn_function
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
    ap.add_argument("--total", type=int, default=64, help="minibatches per measurement")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds (fastest kept)")
    ap.add_argument("--graphs", default=None, help="comma list: powerlaw-1e6, powerlaw-1e7, "
                    "computers, cs (default: all; --quick: powerlaw-1e6)")
    ap.add_argument("--no-dist", action="store_true", help="skip the distributed part")
    ap.add_argument("--render-only", action="store_true",
                    help="redraw sampling.md from sampling.json")
    args = ap.parse_args()
    if args.render_only:
        (RESULTS / "sampling.md").write_text(render(json.loads(
            (RESULTS / "sampling.json").read_text())))
        return
    # one thread: on a shared, oversubscribed machine intra-op threads slow sampling ~9x;
    # PyG's kernel is single-threaded per minibatch as well
    torch.set_num_threads(1)
    fan = [15, 10, 5]
    ks = [k for k in (1, 4, 16, 64) if k <= args.total]
    synth = {"powerlaw-1e6": (100_000, 10.0), "powerlaw-1e7": (1_000_000, 10.0)}
    names = args.graphs.split(",") if args.graphs else \
        (["powerlaw-1e6"] if args.quick else [*synth, "computers", "cs"])
    pyg = pyg_available()
    rows = []
    for name in names:
        t0 = time.perf_counter()
        if name in synth:
            n, avg = synth[name]
            indptr, indices = power_law_csr(n, avg)
        else:
            g = load_real(name)
            if g is None:
                print(f"{name}: data not found, skipped")
                continue
            n, indptr, indices = g.num_nodes, g.indptr, g.indices
        print(f"{name}: n={n} E={indices.numel()} built in {time.perf_counter() - t0:.1f}s",
              flush=True)
        reqs = requests(n, args.batch, args.total)
        rows += compare(name, indptr, indices, fan, ks, reqs, args.reps, pyg,
                        ladies=name not in synth)
        del indptr, indices
    pyg_note = (f"PyG NeighborLoader via {pyg} (torch_geometric "
                f"{_version('torch_geometric')}, torch_sparse {_version('torch_sparse')})"
                if pyg else "PyG NeighborLoader not run: neither pyg_lib nor torch_sparse "
                "imports (NeighborLoader needs one; torch-sparse takes ~35 min of both cores "
                "to build)")
    dist_rows = [] if args.no_dist else \
        distributed(20_000 if args.quick else 100_000, 10.0, 128, 16, args.quick)
    for r in dist_rows:
        print(r, flush=True)
    cmd = "python benchmarks/bench_sampling.py " + " ".join(sys.argv[1:])
    out = {"command": cmd, "single_rank": rows, "pyg": pyg_note, "distributed": dist_rows,
           "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "note": "shared 2-core machine, noisy; fastest of --reps interleaved rounds"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sampling.json").write_text(json.dumps(out, indent=1))
    (RESULTS / "sampling.md").write_text(render(out))
    print(render(out))


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:   # torch_sparse's Python part may not import; its kernels still do
        from importlib.metadata import version
        try:
            return version(mod.replace("_", "-"))
        except Exception:
            return "?"


def render(out: dict) -> str:
    r0 = out["single_rank"][0] if out["single_rank"] else {"batch": "?", "minibatches": "?",
                                                          "reps": "?"}
    md = ["# Bulk sampling throughput", "",
          f"`{out['command']}` (torch {out['torch']}, {out['torch_threads']} thread; "
          f"batch {r0['batch']} targets, {r0['minibatches']} minibatches per measurement, "
          f"fastest of {r0['reps']} interleaved rounds). Shared, oversubscribed 2-core machine: "
          "compare within a table; wall SEPS depends on the share of a core each run got, "
          "thread-CPU SEPS is the figure robust to other load.", "",
          out["pyg"] + ". PyG draws the neighbours of each newly reached node once (one "
          "subgraph per minibatch), quietgnn draws every row of every level (one block per hop, "
          "targets first), hence more sampled edges for the same targets; SEPS compares "
          "rates. quietgnn's times include slicing every minibatch out of its bulk.", "",
          "| graph | edges | run | fanouts | sampled edges | M SEPS (wall) | M SEPS (CPU) | "
          "x PyG (wall) | x PyG (CPU) | ms/minibatch (wall) |",
          "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in out["single_rank"]:
        ratio = (f"{r['vs_pyg_wall']:.2f} | {r['vs_pyg_cpu']:.2f}" if "vs_pyg_wall" in r
                 else "- | -")
        md.append(f"| {r['graph']} | {r['edges']:,} | {r['run']} | "
                  f"{','.join(map(str, r['fanouts']))} | {r['sampled_edges']:,} | "
                  f"{r['seps_wall'] / 1e6:.2f} | {r['seps_cpu'] / 1e6:.2f} | {ratio} | "
                  f"{r['ms_per_minibatch_wall']:.1f} |")
    md += ["", "## Distributed sampling, P = 4 (4 gloo processes on 2 shared cores)", "",
           "| graph | mode | c | k | ms/minibatch (slowest rank) | sampling MB sent/rank | "
           "collectives/rank |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in out["distributed"]:
        md.append(f"| {r['graph']} | {r['mode']} | {r['c']} | {r['k']} | "
                  f"{r['ms_per_minibatch']:.1f} | {r['sample_MB_sent_per_rank']:.2f} | "
                  f"{r['rounds_per_rank']} |")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
