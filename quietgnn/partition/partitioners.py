"""Partitioners: node -> part assignment vectors.

Every partitioner returns an ``int64`` array ``parts`` of shape ``[N]`` with values in
``[0, num_parts)``. They are deterministic for a given seed.

* ``metis``     -- pymetis on the symmetrised graph (min edge cut, balanced node counts).
* ``random``    -- every node to a uniformly random part, then rebalanced to equal sizes
                   (RandomTMA, Grappa's chunking).
* ``supernode`` -- METIS into ``K >> P`` small clusters, clusters dealt randomly and evenly
                   (SuperTMA): keeps dense local structure while every part is a
                   representative sample of the graph.
* ``hash``      -- part = a multiplicative hash of the node id (:func:`hash_part_of`): needs
                   nothing but the id, so out-of-core ``quietgnn prepare`` computes it on the fly
                   (balanced to within a few sqrt(N / P) nodes, not exactly).
* ``ldg``       -- streaming Linear Deterministic Greedy (Stanton & Kliot, KDD 2012) in id
                   order, a batch of nodes at a time, restreamed (:class:`LDG`): min edge cut
                   without the graph in memory; out-of-core ``quietgnn prepare`` runs the same
                   function over DuckDB's sorted edges.
* ``given``     -- an array or a file (``.npy``, ``.pt`` or text, one part id per line) for data
                   that must stay where it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..graph import Graph
from ..serial import load_file

__all__ = ["PARTITIONERS", "partition_nodes", "metis_parts", "random_parts", "supernode_parts",
           "given_parts", "read_assignment", "check_assignment", "hash_parts", "hash_part_of",
           "ldg_parts", "LDG"]


def _symmetric_csr(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Symmetrised, loop-free CSR (METIS requires an undirected graph)."""
    if graph.meta.get("undirected") or graph.is_undirected():
        return graph.indptr.numpy(), graph.indices.numpy()
    n = graph.num_nodes
    dst, src = graph.edge_dst(), graph.indices
    key = torch.unique(torch.cat([dst * n + src, src * n + dst]))
    d, s = key // n, key % n
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(d, minlength=n).cumsum(0)
    return indptr.numpy(), s.numpy()


class PartitionerError(RuntimeError):
    """A partitioner library failed (one line suffices: :mod:`quietgnn.errors`)."""


def metis_parts(graph: Graph, num_parts: int, seed: int = 0) -> np.ndarray:
    """Min-edge-cut partition with METIS (via pymetis)."""
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    import pymetis

    indptr, indices = _symmetric_csr(graph)
    opts = pymetis.Options(seed=seed)
    adjacency = pymetis.CSRAdjacency(adj_starts=indptr, adjacent=indices)
    try:
        _, membership = pymetis.part_graph(num_parts, adjacency=adjacency, options=opts)
    except RuntimeError as exc:
        # METIS signals its own errors with SIGTERM and catches that signal while it runs,
        # so a SIGTERM sent to this process meanwhile (a scheduler's) ends up here as well,
        # our handler never called: pymetis says only "Caught an unknown exception!"
        raise PartitionerError(
            f"METIS stopped while partitioning {graph.num_nodes} nodes into {num_parts} parts "
            f"({exc}): the process was sent SIGTERM meanwhile, or METIS failed; if it was not "
            f"stopped, try --partitioner ldg or random") from None
    parts = np.asarray(membership, dtype=np.int64)
    # METIS may leave a part empty on tiny or disconnected graphs; an empty rank would train on
    # nothing, so move single nodes from the largest parts into empty ones.
    return _fill_empty(parts, num_parts)


def _fill_empty(parts: np.ndarray, num_parts: int) -> np.ndarray:
    counts = np.bincount(parts, minlength=num_parts)
    for p in np.nonzero(counts == 0)[0]:
        big = int(np.argmax(counts))
        victim = int(np.nonzero(parts == big)[0][-1])
        parts[victim] = p
        counts[big] -= 1
        counts[p] += 1
    return parts


def random_parts(graph: Graph, num_parts: int, seed: int = 0) -> np.ndarray:
    """Uniformly random, exactly balanced assignment (sizes differ by at most one)."""
    rng = np.random.default_rng(seed)
    parts = np.arange(graph.num_nodes, dtype=np.int64) % num_parts
    rng.shuffle(parts)
    return parts


#: Knuth's multiplicative constant (2^32 / golden ratio): consecutive ids land far apart
_HASH_MUL = 2654435761
_HASH_SEED = 40503


def hash_part_of(ids: np.ndarray, num_parts: int, seed: int = 0) -> np.ndarray:
    """``h P div 2^32`` with ``h = (id * 2654435761 + 40503 seed) mod 2^32``, for ids in
    ``[0, 2^32)``: the part of every id. The high bits of ``h`` decide (its low bits would
    make the part ``id mod P`` up to relabelling when P is a power of two)."""
    v = ids.astype(np.uint64) * np.uint64(_HASH_MUL) + np.uint64(_HASH_SEED * seed)
    return ((v % np.uint64(1 << 32)) * np.uint64(num_parts) >> np.uint64(32)).astype(np.int64)


def hash_parts(graph: Graph, num_parts: int, seed: int = 0) -> np.ndarray:
    """Every node to part :func:`hash_part_of` (the in-memory twin of the streaming one)."""
    if graph.num_nodes >= 1 << 32:
        raise ValueError(f"the hash partitioner takes node ids below 2^32; {graph.name!r} has "
                         f"{graph.num_nodes} nodes")
    return _fill_empty(hash_part_of(np.arange(graph.num_nodes), num_parts, seed), num_parts)


def ldg_batch(num_nodes: int, num_parts: int) -> int:
    """Nodes placed per LDG step: small enough that a step moves a part's size by well under
    1 % (so the balance term still steers) and that its ``batch x P`` scores stay small (2^22
    entries), large enough for few Python steps."""
    return int(max(min(num_nodes // 1024, 1 << 16, (1 << 22) // num_parts), 16))


class LDG:
    """Streaming Linear Deterministic Greedy, batched: nodes arrive in id order in batches of
    ``batch``; each goes to the part holding most of its already-placed neighbours, weighted by
    ``1 - size / capacity`` (capacity ``(1 + LDG_SLACK) N / P``: a full part stops attracting);
    nodes with no placed neighbour go to the lightest parts in turn. Within a batch the nodes
    see the placements of earlier batches only, which makes a batch one vectorised step (a batch
    of size 1 is the sequential algorithm)."""

    def __init__(self, num_nodes: int, num_parts: int, batch: int | None = None) -> None:
        self.n, self.P = num_nodes, num_parts
        self.batch = batch or ldg_batch(num_nodes, num_parts)
        self.parts = np.full(num_nodes, -1, dtype=np.int64 if num_parts > 32767 else np.int16)
        self.sizes = np.zeros(num_parts, dtype=np.int64)
        self.capacity = (1.0 + LDG_SLACK) * num_nodes / num_parts

    def place(self, lo: int, hi: int, dst: np.ndarray, src: np.ndarray) -> None:
        """Place nodes ``[lo, hi)`` given their edges ``(dst, src)`` (dst in ``[lo, hi)``)."""
        P, b = self.P, hi - lo
        old = self.parts[lo:hi]
        if old[0] >= 0:     # a later pass: the batch leaves its parts before being placed again
            self.sizes -= np.bincount(old, minlength=P)
        ps = self.parts[src].astype(np.int64)
        ok = ps >= 0
        counts = np.bincount((dst[ok] - lo) * P + ps[ok], minlength=b * P).reshape(b, P)
        score = counts * np.maximum(1.0 - self.sizes / self.capacity, 0.0)
        best = score.argmax(1)
        lonely = score.max(1) <= 0
        k = int(lonely.sum())
        if k:   # no placed neighbour (or every such part full): deal to the lightest parts
            order = np.argsort(self.sizes, kind="stable")
            best[lonely] = order[np.arange(k) % P]
        self.parts[lo:hi] = best
        self.sizes += np.bincount(best, minlength=P)


#: parts may exceed N / P by this fraction (the capacity of LDG's balance term)
LDG_SLACK = 0.05
#: streaming passes of LDG: the first places every node, each later one re-places them seeing
#: every neighbour's part (restreaming LDG, Nishimura & Ugander, KDD 2013)
LDG_PASSES = 5


def ldg_parts(graph: Graph, num_parts: int, seed: int = 0,
              passes: int = LDG_PASSES) -> np.ndarray:
    """:class:`LDG` over the graph's in-edges in id order, ``passes`` times (``seed`` is not
    used: LDG is deterministic)."""
    n = graph.num_nodes
    ldg = LDG(n, num_parts)
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    for _ in range(passes):
        for lo in range(0, n, ldg.batch):
            hi = min(lo + ldg.batch, n)
            e0, e1 = int(indptr[lo]), int(indptr[hi])
            dst = np.repeat(np.arange(lo, hi), np.diff(indptr[lo:hi + 1]))
            ldg.place(lo, hi, dst, indices[e0:e1])
    return _fill_empty(ldg.parts.astype(np.int64), num_parts)


def supernode_parts(graph: Graph, num_parts: int, seed: int = 0,
                    clusters: int | None = None) -> np.ndarray:
    """SuperTMA: METIS into ``clusters`` (default ``max(16 P, N / 50)``, capped at N / 2)
    clusters, dealt randomly: clusters in random order each go to the currently lightest
    part, so parts are balanced in nodes to within one cluster."""
    n = graph.num_nodes
    k = clusters if clusters is not None else max(16 * num_parts, n // 50)
    k = int(min(max(k, num_parts), max(num_parts, n // 2)))
    cl = metis_parts(graph, k, seed=seed)
    sizes = np.bincount(cl, minlength=k)
    rng = np.random.default_rng(seed)
    order = rng.permutation(k)
    load = np.zeros(num_parts, dtype=np.int64)
    cluster_to_part = np.empty(k, dtype=np.int64)
    for c in order:  # loop over clusters (K << N), not nodes
        p = int(np.argmin(load))
        cluster_to_part[c] = p
        load[p] += sizes[c]
    return _fill_empty(cluster_to_part[cl], num_parts)


def read_assignment(file: str | Path) -> np.ndarray:
    """A partition file (``.npy``, ``.pt`` or text with one part id per line) as an array.
    Nothing is unpickled: ``.npy`` without pickles, ``.pt`` weights-only
    (:func:`quietgnn.serial.load_file`); a file holding anything but part ids is one
    ``ValueError`` naming it."""
    path = Path(file)
    if not path.is_file():
        raise ValueError(f"partition file {str(path)!r} does not exist; expected a .npy, .pt "
                         f"or text file with one part id per node")
    fix = "write the assignment as one integer part id per node (.npy, .pt or text)"
    if path.suffix == ".pt":
        got = load_file(path, "partition file", fix)
        if isinstance(got, torch.Tensor):
            return got.numpy()
        if isinstance(got, np.ndarray) and got.dtype != object:
            return got
        raise ValueError(f"partition file {str(path)!r} holds a {type(got).__name__}, expected "
                         f"a tensor of part ids; {fix}")
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except Exception as exc:  # noqa: BLE001 - corrupt/truncated files: say which and why
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ValueError(f"could not read partition file {str(path)!r} ({type(exc).__name__}: "
                         f"{first}); {fix}") from None


def check_assignment(assignment: Any, num_nodes: int, num_parts: int) -> np.ndarray:
    """``assignment`` as int64 part ids, one per node, every part non-empty (else ValueError
    naming what is wrong)."""
    if isinstance(assignment, torch.Tensor):
        assignment = assignment.detach().cpu().numpy()
    try:
        parts = np.asarray(assignment)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"given partition is a {type(assignment).__name__} that is no array "
                         f"({exc}); expected one integer part id per node") from None
    if parts.dtype == object or (parts.ndim > 1 and parts.size != parts.shape[0]):
        raise ValueError(f"given partition is a {type(assignment).__name__} of dtype "
                         f"{parts.dtype} shape {list(parts.shape)}, expected a 1-D array of "
                         f"integer part ids, one per node")
    parts = parts.reshape(-1)
    if not np.issubdtype(parts.dtype, np.integer):
        raise ValueError(f"given partition has dtype {parts.dtype}, expected integer part ids")
    parts = parts.astype(np.int64)
    if parts.shape[0] != num_nodes:
        raise ValueError(f"given partition has {parts.shape[0]} entries but the graph has "
                         f"{num_nodes} nodes; it needs one part id per node")
    if parts.size and (parts.min() < 0 or parts.max() >= num_parts):
        raise ValueError(f"given partition holds part ids in [{parts.min()}, {parts.max()}] but "
                         f"num_parts = {num_parts}; ids must be in [0, num_parts)")
    empty = np.nonzero(np.bincount(parts, minlength=num_parts) == 0)[0]
    if empty.size:
        raise ValueError(f"given partition leaves part(s) {empty.tolist()} empty; every one of "
                         f"the {num_parts} parts needs at least one node")
    return parts


def given_parts(graph: Graph, num_parts: int, seed: int = 0,
                assignment: Any = None, file: str | None = None) -> np.ndarray:
    """A user-given assignment: ``assignment`` (array-like) or ``file`` (.npy/.pt/text)."""
    if assignment is None and file is None:
        raise ValueError("partitioner 'given' needs an assignment: pass partition.file=PATH "
                         "(.npy, .pt or a text file with one part id per line)")
    if assignment is None:
        assignment = read_assignment(file)  # type: ignore[arg-type]
    return check_assignment(assignment, graph.num_nodes, num_parts)


PARTITIONERS: dict[str, Callable[..., np.ndarray]] = {
    "metis": metis_parts,
    "random": random_parts,
    "supernode": supernode_parts,
    "hash": hash_parts,
    "ldg": ldg_parts,
    "given": given_parts,
}


def partition_nodes(graph: Graph, method: str, num_parts: int, seed: int = 0,
                    **options: Any) -> np.ndarray:
    """Assign every node to one of ``num_parts`` parts with the named partitioner."""
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {method!r}; expected one of {sorted(PARTITIONERS)}")
    if not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts = {num_parts!r}, expected an int >= 1")
    if num_parts > graph.num_nodes:
        raise ValueError(f"num_parts = {num_parts} exceeds the {graph.num_nodes} nodes of "
                         f"{graph.name!r}; use at most one part per node")
    opts = {k: v for k, v in options.items() if v is not None}
    return PARTITIONERS[method](graph, num_parts, seed=seed, **opts)
