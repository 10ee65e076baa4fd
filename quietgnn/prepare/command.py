"""``quietgnn prepare``: the command (the CLI parses and resolves the config, this runs it):
from a dataset in memory, out of core from tables or the synthetic generator, or one process
per host under ``torchrun``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..heap import peak_rss_mb, rss_mb
from ..serial import loads_json

__all__ = ["run_prepare"]


def run_prepare(args: argparse.Namespace, cfg: Any, rest: list[str], *,
                under_torchrun: bool) -> int:
    """Write a prepared directory (partition book, one memory-mappable part per rank) from a
    dataset quietgnn loads (``--dataset``)."""
    if not args.out:
        raise ValueError(f"quietgnn {args.cmd} needs --out DIR (where the prepared graph goes)")
    check_out(args.out, bool(getattr(args, "overwrite", False)))
    if args.x_dtype not in ("float32", "float16"):
        raise ValueError(f"--x-dtype {args.x_dtype!r}; expected float32 or float16 (half the "
                         f"disk and page cache; the workers compute in float32)")
    if getattr(args, "directed", False) and (args.source is None or args.source == "synthetic"):
        raise ValueError("--directed takes an edge table's edges one way only; the graphs of "
                         "--dataset and of prepare synthetic are undirected: leave it out")
    if cfg.dataset.split != "standard" and (under_torchrun or args.source is not None
                                            or args.edges is not None):
        raise ValueError(f"--dataset.split {cfg.dataset.split}: an out-of-core prepare "
                         f"draws the standard split as it streams; prepare in memory (a "
                         f"dataset name, no --edges / --nodes) for another split")
    if cfg.runtime.residency != "none" and not under_torchrun and \
            cfg.partition_method != "given":      # (under torchrun: refused, below)
        raise ValueError(f"--runtime.residency {cfg.runtime.residency} keeps each node's data "
                         f"on the site that holds it, but partitioner {cfg.partition_method!r} "
                         f"would place nodes; prepare with --partitioner given "
                         f"--partition.file SITES (the site of each node)")
    try:
        if under_torchrun:
            return _prepare_distributed(args, cfg, rest)
        if args.source is not None or args.edges is not None:
            return _prepare_streamed(args, cfg, rest)
        return _prepare_in_memory(args, cfg)
    except Exception as exc:
        full = _disk_full(args.out, exc)
        if full is None:
            raise
        raise full from exc


def _disk_full(out: str, exc: BaseException) -> Optional[OSError]:
    """The one-line error for a prepare that ran out of disk (or hit a read-only file system)
    while writing beside ``out``, or None for any other failure (the writers say it in their
    own words: :func:`~quietgnn.safefiles.disk_reason` reads them)."""
    from ..safefiles import WriteError, disk_reason, free_space_note
    known = disk_reason(exc)
    if known is None:
        return None
    code, reason = known
    return WriteError(code, f"could not write the prepared graph {out!r}: {reason}"
                            f"{free_space_note(Path(out).absolute().parent)}; free space or "
                            f"choose another --out (nothing half-written is left)")


def _prepare_in_memory(args: argparse.Namespace, cfg: Any) -> int:
    """``prepare --dataset NAME``: the graph loaded, partitioned and written by one process."""
    from ..datasets import load_dataset
    from ..partition import make_book
    graph = load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                         split_seed=cfg.dataset.split_seed, split=cfg.dataset.split)
    t0 = time.perf_counter()
    book = make_book(args.out, graph, cfg.partition_method, cfg.num_parts,
                     seed=cfg.partition.seed, clusters=cfg.partition.clusters,
                     file=cfg.partition.file, x_dtype=args.x_dtype,
                     overwrite=bool(getattr(args, "overwrite", False)))
    st = book.stats
    print(f"{graph!r}\nprepared {book.path} ({cfg.partition_method}, {book.num_parts} "
          f"parts, {time.perf_counter() - t0:.1f}s)")
    print(f"  nodes per part {st['nodes']}  balance {st['balance']:.3f}")
    print(f"  edge cut {st['edge_cut']} ({100 * st['edge_cut_fraction']:.1f}% of edges)  halo "
          f"sizes {st['halo']}  replication {st['replication_factor']:.3f}")
    return 0


def _prepare_streamed(args: argparse.Namespace, cfg: Any, rest: list[str]) -> int:
    """``prepare synthetic --edges N`` or ``prepare EDGES --nodes NODES``: out of core."""
    from . import _positive_int, human, parse_size, prepare_tables
    from .synthetic import prepare_synthetic
    method = cfg.partition.method or "ldg"     # None unless the command line or recipe set it
    budget = parse_size(args.memory_budget)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg} {_memory_now()}", file=sys.stderr,
              flush=True)

    common = dict(parts=cfg.num_parts, method=method, seed=cfg.partition.seed,
                  memory_budget=budget,
                  x_dtype=args.x_dtype, split_seed=cfg.dataset.split_seed, progress=progress,
                  overwrite=bool(getattr(args, "overwrite", False)))
    if args.source == "synthetic":
        if args.edges is None:
            raise ValueError("quietgnn prepare synthetic needs --edges N (undirected edges, "
                             "e.g. 1e9)")
        from ..datasets.synthetic import SyntheticSpec
        if any(a.split("=")[0] in ("--synthetic.nodes", "--synthetic-nodes") for a in rest) \
                or cfg.synthetic.nodes != SyntheticSpec().nodes:    # (a recipe's too)
            raise ValueError("quietgnn prepare synthetic draws 2 edges / avg_degree nodes "
                             "for --edges N: leave out --synthetic.nodes (set "
                             "--synthetic.avg_degree to change the nodes per edge)")
        book = prepare_synthetic(args.out, edges=_positive_int(args.edges, "--edges"),
                                 spec=cfg.synthetic, **common)
    else:
        if args.source is None or args.nodes is None:
            raise ValueError("quietgnn prepare EDGES needs an edge table and --nodes NODES "
                             "(Parquet or CSV), or `prepare synthetic --edges N`")
        book = prepare_tables(args.source, args.nodes, args.out, directed=args.directed,
                              partition_file=cfg.partition.file, **common)
    g, st = book.graph, book.stats
    secs = time.perf_counter() - t0
    # --directed stores each edge once, as given: half of them would be no count at all
    edges = f"{human(g['num_edges'])} directed edges (stored as given)" if \
        getattr(args, "directed", False) else \
        f"{human(g['num_edges'] / 2)} undirected edges ({human(g['num_edges'])} stored)"
    print(f"prepared {book.path}: {g['name']}, {human(g['num_nodes'])} nodes, {edges}, "
          f"{g['num_features']} features, {g['num_classes']} classes")
    print(f"  {book.num_parts} parts ({book.method}), nodes per part {st['nodes']}, edge cut "
          f"{100 * st['edge_cut_fraction']:.1f}%, halo sizes {st['halo']}")
    print(f"  {_split_line(book)}")
    print(f"  {secs:.1f}s ({human(g['num_edges'] / max(secs, 1e-9))} stored edges/s), peak "
          f"memory {peak_rss_mb():.0f} MiB (budget {budget >> 20} MiB)")
    return 0


def check_out(out: str, overwrite: bool) -> None:
    """Refuse (``ValueError``: exit 2) to replace what is at ``--out`` unless asked: a prepared
    graph can be hours of work. An empty directory is used as it is; one holding anything but
    a prepared graph (:func:`~quietgnn.partition.book.replace_problem`: a quietgnn book and
    only the files it lists) is never replaced (``--overwrite`` would delete the user's
    files)."""
    from ..partition.book import replace_problem
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file; the prepared graph is a directory: choose "
                         f"another --out")
    if not path.is_dir() or not any(path.iterdir()):
        return
    why = replace_problem(path)
    if why:
        raise ValueError(f"--out {out} exists and holds files that are not a prepared graph "
                         f"(it {why}); choose another --out, or move them away (prepare "
                         f"replaces only a prepared graph, with --overwrite)")
    if overwrite:
        return
    meta = loads_json((path / "book.json").read_text())     # a book: replace_problem read it
    graph = meta.get("graph") if isinstance(meta.get("graph"), dict) else {}

    def said(v: Any) -> str:
        return str(v) if isinstance(v, (int, str)) and not isinstance(v, bool) else "?"
    what = (f"a prepared graph ({said(meta.get('num_parts'))} parts, {said(meta.get('method'))}, "
            f"{said(graph.get('num_nodes'))} nodes, {said(graph.get('num_edges'))} stored edges, "
            f"written {said(meta.get('created'))})")
    raise ValueError(f"--out {out} already holds {what}; pass --overwrite to replace it (the "
                     f"old one stays until the new one is complete), or choose another --out")


#: the process group's timeout of `quietgnn prepare` under torchrun unless --runtime.timeout_s
PREPARE_TIMEOUT_S = 3600.0


def _prepare_distributed(args: argparse.Namespace, cfg: Any, rest: list[str]) -> int:
    """``torchrun ... -m quietgnn prepare EDGES --nodes NODES --out DIR``: each rank prepares
    its own part from its own slice (``{rank}`` in the paths; :mod:`quietgnn.prepare.dist`)."""
    from ..comm.communicator import Communicator
    from . import human, parse_size
    from .dist import prepare_distributed
    from ..runtime.worker import watch_parent, worker_env
    rank, world, _ = worker_env()
    if args.source is None or args.source == "synthetic" or args.nodes is None:
        raise ValueError("under torchrun, quietgnn prepare takes each rank's slice of a graph: "
                         "EDGES --nodes NODES (paths with {rank}, e.g. edges-{rank}.parquet "
                         "--nodes nodes-{rank}.parquet); --dataset and synthetic run in one "
                         "process, without torchrun")
    if cfg.partition.method not in (None, "given") or cfg.partition.file:
        what = f"--partitioner {cfg.partition.method}" if cfg.partition.method not in \
            (None, "given") else f"--partition.file {cfg.partition.file}"
        raise ValueError(f"{what}: under torchrun the parts are the ranks' slices (rank r's "
                         f"node table is part r); leave it out")

    if cfg.runtime.residency != "none":
        # the fingerprint and the manifest need the whole graph in id order on one process
        raise ValueError(f"--runtime.residency {cfg.runtime.residency}: the distributed prepare "
                         f"sends every rank's labels, split codes and edge sources to rank 0 "
                         f"(for the graph's fingerprint), which that level forbids; prepare "
                         f"the graph in one process where it may be read whole (quietgnn "
                         f"prepare --partitioner given --partition.file SITES), then give each "
                         f"site its book.json and part-<rank>/")

    def given(*keys: str) -> bool:
        return any(t.split("=")[0] in keys for t in rest)
    if given("--parts", "--partition.parts") and cfg.num_parts != world:
        raise ValueError(f"--parts {cfg.num_parts}, but torchrun started {world} ranks: under "
                         f"torchrun every rank prepares one part; leave out --parts or start "
                         f"{cfg.num_parts} ranks (--nproc-per-node, --nnodes)")
    if "TORCHELASTIC_RUN_ID" in os.environ:
        watch_parent(rank)
    budget = parse_size(args.memory_budget)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg} {_memory_now()}", file=sys.stderr,
              flush=True)

    # a rank may sort its slice (DuckDB) for many minutes while the others wait for it in a
    # collective: the training default (120 s) would fail a healthy prepare; a dead rank
    # still fails the others at once (its sockets close)
    timeout = cfg.runtime.timeout_s if given("--runtime.timeout_s", "--timeout") else \
        PREPARE_TIMEOUT_S
    comm = Communicator.init(rank, world, backend="gloo", timeout_s=timeout)
    try:
        book = prepare_distributed(args.source, args.nodes, args.out, comm,
                                   directed=args.directed, memory_budget=budget,
                                   x_dtype=args.x_dtype, split_seed=cfg.dataset.split_seed,
                                   progress=progress,
                                   overwrite=bool(getattr(args, "overwrite", False)))
    finally:
        sent: dict[str, int] = {}
        for rec in comm.records:
            sent[rec.kind] = sent.get(rec.kind, 0) + rec.bytes_sent
        comm.close()
    # one write, newline included: print's text and its end are two writes, and the ranks'
    # lines, sharing one terminal, ran together ("prepare_rounds=32rank 1 sent ...")
    sys.stderr.write(f"rank {rank} sent {sum(sent.values())} bytes: "
                     + " ".join(f"{k}={v}" for k, v in sorted(sent.items())) + "\n")
    sys.stderr.flush()
    if rank == 0:
        g, st = book.graph, book.stats
        print(f"prepared {book.path}: {g['name']}, {human(g['num_nodes'])} nodes, "
              f"{human(g['num_edges'])} stored edges, {g['num_features']} features, "
              f"{g['num_classes']} classes; {book.num_parts} parts (one per rank), nodes per "
              f"part {st['nodes']}, edge cut {100 * st['edge_cut_fraction']:.1f}%, halo sizes "
              f"{st['halo']} ({time.perf_counter() - t0:.1f}s); {_split_line(book)}")
    return 0


def _split_line(book: Any) -> str:
    """The split prepare wrote, said where a misspelt split would show (0 train nodes)."""
    tr, va, te = book.split_counts()
    rest = int(book.graph["num_nodes"]) - tr - va - te
    return f"split train/val/test {tr}/{va}/{te}" + (f", {rest} in no split" if rest else "")


def _memory_now() -> str:
    """The process's resident memory now and its peak so far, for each progress line: the
    budget is checked against the peak, and this says which stage reached it."""
    now = rss_mb()
    if now != now:                      # not Linux: the peak alone
        return f"(peak {peak_rss_mb():.0f} MiB)"
    return f"(resident {now:.0f} MiB, peak {peak_rss_mb():.0f} MiB)"
