"""Grappa's two-piece local graph (the own chunk's rows as its part stores them, the rotating
chunk's as received, each with a column translation table) against the one renumbered CSR it
replaced, computed here from the whole graph: the same local numbering, the same rows in the
same edge order, the same features and degrees; and its scratch files."""

from __future__ import annotations

import dataclasses
import errno
import os

import pytest
import torch

from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.partition.shards import read_part, write_part
from quietgnn.runtime.spawn import spawn_function
from quietgnn.strategies.grappa.data import coverage
from quietgnn.strategies.grappa.loader import ChunkLoader, Scratch

from helpers import small_graph


def _renumbered(graph, parts, k, j):
    """The local graph as one renumbered CSR: ``[chunk k | chunk j | leaves by global id]``,
    internal rows with every in-edge in the graph's order, leaves' rows empty."""
    parts = torch.as_tensor(parts)
    own = torch.nonzero(parts == k).flatten()
    rot = torch.nonzero(parts == j).flatten() if j is not None else own[:0]
    internal = torch.cat([own, rot])
    src = torch.cat([graph.indices[graph.indptr[v]:graph.indptr[v + 1]] for v in internal])
    inside = torch.zeros(graph.num_nodes, dtype=torch.bool)
    inside[internal] = True
    gid = torch.cat([internal, torch.unique(src[~inside[src]])])
    g2l = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    g2l[gid] = torch.arange(gid.numel())
    counts = torch.zeros(gid.numel(), dtype=torch.int64)
    counts[:internal.numel()] = graph.indptr[internal + 1] - graph.indptr[internal]
    indptr = torch.zeros(gid.numel() + 1, dtype=torch.int64)
    indptr[1:] = counts.cumsum(0)
    return gid, indptr, g2l[src]


def _coverage(indptr, src, deg, layers):
    """The mean-over-levels coverage of the renumbered CSR, all edges at once."""
    d = deg.double()
    complete = d == 0
    counts = indptr[1:] - indptr[:-1]
    a = torch.where(complete, 1.0, counts.double() / d.clamp(min=1))
    levels = [a]
    row = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    for _ in range(layers - 1):
        s = torch.zeros_like(d).index_add_(0, row, a[src])
        a = torch.where(complete, 1.0, s / d.clamp(min=1))
        levels.append(a)
    return torch.stack(levels).mean(0).float()


def _one_hot(graph, seed=0):
    """The graph with one non-zero feature per node (a one-hot column, a random value)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros_like(graph.x)
    x[torch.arange(graph.num_nodes), torch.randint(0, x.shape[1], (graph.num_nodes,),
                                                   generator=gen)] = \
        torch.rand(graph.num_nodes, generator=gen) + 0.5
    return dataclasses.replace(graph, x=x)


def _load(comm, graph, parts, super_epochs, stored_dir, wide=False):
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    if stored_dir is not None:    # the part as a prepared run reads it: int32, float16, mapped
        write_part(stored_dir / f"p{comm.rank}", part, x_dtype="float16")
        part = read_part(stored_dir / f"p{comm.rank}", stored=True)
    loader = ChunkLoader(comm, part, keep_halo=True, scratch_dir=stored_dir)
    if wide:    # what a graph of 2^31 nodes or more gets: int64 ids, int32 owners
        loader.idt, loader.odt = torch.int64, torch.int32
    out = []
    for s in super_epochs:
        lg = loader.load(s)
        nodes = torch.arange(lg.n_loc)
        indptr, src = lg.gather(nodes)
        # a shuffled subset: rows come back in the order asked for
        some = torch.randperm(lg.n_loc, generator=torch.Generator().manual_seed(s))[:17]
        out.append({"chunk": lg.chunk, "n_own": lg.n_own, "n_int": lg.n_int,
                    "indptr": indptr, "src": src, "x": lg.rows(nodes).float(),
                    "deg": lg.deg.long(), "some": some, "some_rows": lg.gather(some),
                    "coverage": coverage(lg, 2),
                    "id_dtype": None if loader._halo_sorted is None else loader._halo_sorted.dtype,
                    "sparse": loader.x_sparse is not None})
    scratch = loader._scratch
    out.append({"scratch_files": scratch.files() if scratch else []})
    loader.close()
    out.append({"scratch_left": scratch is not None and bool(scratch.files())})
    return out


@pytest.mark.parametrize("world,stored,wide,sparse", [
    (1, False, False, False), (2, False, False, False), (2, True, False, False),
    (4, False, False, False), (4, True, True, False), (2, True, False, True),
    (4, False, False, True)])
def test_two_piece_rows_equal_the_renumbered_csr(world, stored, wide, sparse, tmp_path):
    """The local graph's rows, features, degrees and coverage are the renumbered whole
    graph's; mostly-zero features (sparse) are loaded, kept and handed over sparse."""
    graph = small_graph(n=150, avg_deg=5, seed=3)
    graph = _one_hot(graph) if sparse else graph
    parts = partition_nodes(graph, "random", world, seed=1)
    super_epochs = [0, 1, 2] if world == 4 else [0]
    res = spawn_function(_load, world, args=(graph, parts, super_epochs,
                                              tmp_path if stored else None, wide))
    deg = graph.in_degree()
    x = graph.x.half().float() if stored else graph.x
    for k, got in enumerate(res):
        for s, lg in zip(super_epochs, got):
            gid, indptr, src = _renumbered(graph, parts, k, lg["chunk"])
            assert lg["n_own"] == int((torch.as_tensor(parts) == k).sum())
            assert torch.equal(lg["indptr"], indptr) and torch.equal(lg["src"], src)
            assert torch.equal(lg["x"], x[gid]) and torch.equal(lg["deg"], deg[gid])
            some = lg["some"]
            ptr = torch.zeros(some.numel() + 1, dtype=torch.int64)
            ptr[1:] = (indptr[some + 1] - indptr[some]).cumsum(0)
            assert torch.equal(lg["some_rows"][0], ptr)
            assert torch.equal(lg["some_rows"][1],
                               torch.cat([src[indptr[v]:indptr[v + 1]] for v in some]))
            # coverage read through the pieces: the old computation on the renumbered CSR
            assert torch.equal(lg["coverage"], _coverage(indptr, src, deg[gid], 2))
            # the load carries ids as narrow as the graph allows (its halo-long arrays)
            if world > 1:
                assert lg["id_dtype"] == (torch.int64 if wide else torch.int32)
            assert lg["sparse"] == sparse
        if world == 4:   # a new chunk each super-epoch
            assert [lg["chunk"] for lg in got[:3]] == [(k + 1 + s) % 4 for s in range(3)]
        # scratch files are unlinked once mapped: none left, before close() or after
        assert got[-2]["scratch_files"] == [] and not got[-1]["scratch_left"]
    if stored:
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("grappa")] == []


def test_scratch_is_mapped_unlinked_and_leaves_nothing(tmp_path, monkeypatch):
    sc = Scratch(tmp_path)
    t = sc.empty((5, 3), torch.float16)
    t[:] = 2
    assert list(tmp_path.iterdir()) == []      # unlinked: nothing left if the process dies
    with open("/proc/self/maps") as f:
        assert any(f"{tmp_path}/{sc.prefix}" in line and "(deleted)" in line for line in f)
    assert float(t.sum()) == 30
    sc.empty((0, 3), torch.int32)
    # a full disk: an error naming it, no file left behind
    def full(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="scratch"):
        sc.empty((1 << 20,), torch.int32)
    assert list(tmp_path.iterdir()) == []
    sc.close()                                 # not even a directory, closed or not
    assert list(tmp_path.iterdir()) == [] and float(t.sum()) == 30
    with pytest.raises(RuntimeError):
        sc.empty((1,), torch.int32)


def _feature_bytes(comm, graph, parts):
    out = {}
    for name, g in (("dense", graph), ("one_hot", _one_hot(graph))):
        part = build_partitions(g, parts, ranks=[comm.rank])[0]
        loader = ChunkLoader(comm, part)
        loader.load(0)
        out[name] = [(r.bytes_sent, r.bytes_recv) for r in comm.take_records()
                     if r.kind == "chunk_features"]
        loader.close()
    return out


def test_one_hot_rows_cross_sparse_and_dense_rows_dense():
    """``chunk_features`` per fetch: the blocks' non-zero counts (8 bytes a peer), then the
    rows: dense features as 4 F bytes a row; one-hot ones sparse, 4 + 8 bytes a row (its count,
    its column, its value). The same rows are fetched either way (same structure)."""
    graph = small_graph(n=150, avg_deg=5, seed=3)
    F, P = graph.num_features, 4
    for res in spawn_function(_feature_bytes, P, args=(graph, partition_nodes(graph, "random",
                                                                               P, seed=1))):
        dense, one_hot = res["dense"], res["one_hot"]
        # two fetches (the halo's rows, then the rest), each: counts, then rows
        assert len(dense) == len(one_hot) == 4
        for counts in (dense[0], dense[2], one_hot[0], one_hot[2]):
            assert counts == (8 * (P - 1), 8 * (P - 1))
        for d, o in ((dense[1], one_hot[1]), (dense[3], one_hot[3])):
            rows_sent, rows_recv = d[0] // (4 * F), d[1] // (4 * F)
            assert d == (4 * F * rows_sent, 4 * F * rows_recv)
            assert o == (12 * rows_sent, 12 * rows_recv)
        assert dense[1][1] > 0

