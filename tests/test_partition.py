"""Partitioners, LocalPartition invariants, partition statistics and the on-disk book."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from quietgnn.partition import (PartitionBook, build_partitions, make_book, partition_nodes,
                                partition_stats)

from helpers import small_graph


@pytest.fixture(scope="module")
def graph():
    return small_graph(n=200, avg_deg=8, seed=2)


@pytest.mark.parametrize("method", ["metis", "random", "supernode"])
@pytest.mark.parametrize("P", [1, 2, 4])
def test_partitioners_cover_every_node_and_balance(graph, method, P):
    parts = partition_nodes(graph, method, P, seed=0)
    assert parts.shape == (graph.num_nodes,) and parts.dtype == np.int64
    counts = np.bincount(parts, minlength=P)
    assert counts.min() > 0 and parts.max() < P
    if method == "random":
        assert counts.max() - counts.min() <= 1
    else:
        assert counts.max() / counts.mean() < 1.35
    assert np.array_equal(parts, partition_nodes(graph, method, P, seed=0))  # deterministic


def test_metis_cuts_fewer_edges_than_random(graph):
    cut_metis = partition_stats(graph, partition_nodes(graph, "metis", 4))["edge_cut"]
    cut_random = partition_stats(graph, partition_nodes(graph, "random", 4))["edge_cut"]
    assert cut_metis < cut_random


def test_supernode_deals_whole_clusters(graph):
    from quietgnn.partition.partitioners import metis_parts
    clusters = metis_parts(graph, 20, seed=0)
    parts = partition_nodes(graph, "supernode", 4, seed=0, clusters=20)
    for c in range(20):  # every cluster lands on exactly one part
        assert np.unique(parts[clusters == c]).size == 1


def test_given_partitioner_and_its_errors(graph, tmp_path):
    a = np.arange(graph.num_nodes) % 3
    np.save(tmp_path / "p.npy", a)
    assert np.array_equal(partition_nodes(graph, "given", 3, file=str(tmp_path / "p.npy")), a)
    (tmp_path / "p.txt").write_text("\n".join(map(str, a)))
    assert np.array_equal(partition_nodes(graph, "given", 3, file=str(tmp_path / "p.txt")), a)
    with pytest.raises(ValueError, match="has 5 entries but the graph has 200 nodes"):
        partition_nodes(graph, "given", 3, assignment=np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match=r"part ids in \[0, 2\] but num_parts = 2"):
        partition_nodes(graph, "given", 2, assignment=a)
    with pytest.raises(ValueError, match=r"leaves part\(s\) \[3\] empty"):
        partition_nodes(graph, "given", 4, assignment=a)
    with pytest.raises(ValueError, match="does not exist"):
        partition_nodes(graph, "given", 3, file=str(tmp_path / "nope.npy"))
    with pytest.raises(ValueError, match="needs an assignment"):
        partition_nodes(graph, "given", 3)
    with pytest.raises(ValueError, match="unknown partitioner 'kmeans'"):
        partition_nodes(graph, "kmeans", 3)
    with pytest.raises(ValueError, match="exceeds the 200 nodes"):
        partition_nodes(graph, "random", 500)


class _Payload:
    """Unpickling this creates ``path`` (via os.system): the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.path}",))


def test_a_partition_file_holding_anything_but_part_ids_is_one_line(graph, tmp_path):
    """--partition.file as .pt: a crafted pickle got torch's multi-line refusal with its advice
    to retry with weights_only=False; a dict a raw 'Could not infer dtype of dict'."""
    from quietgnn.partition.partitioners import check_assignment
    a = torch.arange(graph.num_nodes) % 3
    torch.save(a, tmp_path / "p.pt")
    assert np.array_equal(partition_nodes(graph, "given", 3, file=str(tmp_path / "p.pt")), a)
    ran = tmp_path / "ran"
    torch.save({"parts": _Payload(str(ran))}, tmp_path / "evil.pt")
    torch.save({"parts": a}, tmp_path / "dict.pt")
    for name, said in (("evil.pt", "holds something other than tensors and plain data"),
                       ("dict.pt", "holds a dict, expected a tensor of part ids")):
        with pytest.raises(ValueError) as ei:
            partition_nodes(graph, "given", 3, file=str(tmp_path / name))
        msg = str(ei.value)
        assert "\n" not in msg and str(tmp_path / name) in msg and said in msg, msg
        assert "weights_only" not in msg
    assert not ran.exists()
    (tmp_path / "bad.txt").write_text("0\n1\nx\n")
    with pytest.raises(ValueError, match=r"could not read partition file .*bad\.txt.*ValueError"):
        partition_nodes(graph, "given", 3, file=str(tmp_path / "bad.txt"))
    for bad, said in (({"parts": 1}, "given partition is a dict of dtype object"),
                      (np.zeros((graph.num_nodes, 2), np.int64), r"shape \[200, 2\]"),
                      ([[0], [1, 2]], "given partition is a list")):
        with pytest.raises(ValueError, match=said):
            check_assignment(bad, graph.num_nodes, 3)


@pytest.mark.parametrize("P", [1, 3, 4])
def test_local_partition_invariants(graph, P):
    parts = partition_nodes(graph, "random", P, seed=1)
    locs = build_partitions(graph, parts)
    parts_t = torch.as_tensor(parts)
    assert sorted(torch.cat([lp.owned for lp in locs]).tolist()) == list(range(graph.num_nodes))
    for lp in locs:
        ids = lp.local_ids()
        # halo = exactly the remote in-neighbours of owned nodes
        nbrs = torch.cat([graph.indices[graph.indptr[v]:graph.indptr[v + 1]] for v in lp.owned])
        remote = torch.unique(nbrs[parts_t[nbrs] != lp.rank])
        assert torch.equal(torch.sort(lp.halo).values, remote)
        assert torch.equal(lp.halo_owner, parts_t[lp.halo])
        assert bool((lp.halo_owner[1:] >= lp.halo_owner[:-1]).all())   # grouped by owner
        # every owned row holds the node's full neighbourhood, in global ids
        for k in range(lp.n_own):
            v = int(lp.owned[k])
            mine = ids[lp.indices[lp.indptr[k]:lp.indptr[k + 1]]]
            assert torch.equal(torch.sort(mine).values, graph.indices[graph.indptr[v]:graph.indptr[v + 1]])
        assert torch.equal(lp.in_degree, graph.in_degree()[ids])
        assert torch.equal(lp.x, graph.x[lp.owned])
        assert lp.num_train_global == int(graph.train_mask.sum())
    # send plan of i to j == the block j receives from i, in the same order
    for i, lpi in enumerate(locs):
        for j, lpj in enumerate(locs):
            blk = lpj.halo[lpj.recv_offsets[i]:lpj.recv_offsets[i + 1]]
            assert torch.equal(lpi.owned[lpi.send_idx[j]], blk)


def test_central_and_boundary_masks(graph):
    parts = partition_nodes(graph, "metis", 2)
    lp = build_partitions(graph, parts, ranks=[0])[0]
    central = lp.central_mask()
    dst = lp.edge_dst()
    has_remote = torch.zeros(lp.n_own, dtype=torch.bool)
    has_remote[dst[lp.indices >= lp.n_own]] = True
    assert torch.equal(central, ~has_remote)
    assert int(lp.boundary_mask().sum()) == int(lp.send_counts.sum())  # P=2: one peer
    ip, ix = lp.induced()
    assert int(ip[-1]) == int((lp.indices < lp.n_own).sum()) and bool((ix < lp.n_own).all())


def test_partition_stats(graph):
    parts = partition_nodes(graph, "metis", 4)
    st = partition_stats(graph, parts)
    locs = build_partitions(graph, parts)
    assert st["halo"] == [lp.n_halo for lp in locs]
    assert sum(st["nodes"]) == graph.num_nodes and sum(st["edges"]) == graph.num_edges
    assert st["replication_factor"] == pytest.approx(1 + sum(st["halo"]) / graph.num_nodes)


def test_book_round_trip_and_errors(graph, tmp_path):
    path = tmp_path / "book"
    book = make_book(path, graph, "metis", 3, seed=0)
    assert sorted(p.name for p in path.iterdir()) == [
        "assignment.npy", "book.json", "part-0", "part-1", "part-2"]
    direct = build_partitions(graph, book.assignment())
    for r in range(3):
        lp = PartitionBook.open(path).load_part(r, 3)
        assert torch.equal(lp.indices, direct[r].indices) and lp.book_id == book.book_id
        assert all(torch.equal(a, b) for a, b in zip(lp.send_idx, direct[r].send_idx))
    with pytest.raises(ValueError, match="world size 4 does not match .* 3 parts"):
        book.load_part(0, 4)
    # truncated part file
    f = path / "part-1" / "indices.npy"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="part-1/indices.npy.*truncated"):
        PartitionBook.open(path).load_part(1, 3)
    # same size, other content
    f.write_bytes(bytes(len(data)))
    with pytest.raises(ValueError, match="checksum"):
        PartitionBook.open(path).load_part(1, 3)
    (path / "part-2" / "owned.npy").unlink()
    with pytest.raises(ValueError, match="part-2/owned.npy.* is missing"):
        PartitionBook.open(path).load_part(2, 3)
    meta = json.loads((path / "book.json").read_text())
    meta["version"] = 99
    (path / "book.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="version 99"):
        PartitionBook.open(path)
    (path / "book.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        PartitionBook.open(path)
    with pytest.raises(ValueError, match="no partition book"):
        PartitionBook.open(tmp_path / "missing")


@pytest.mark.parametrize("P", [1, 4])
def test_blockwise_build_does_not_change_partitions(graph, monkeypatch, P):
    """Whole-graph passes run over edge blocks (bounded memory): any block size gives the
    same partitions and statistics; iter_partitions yields what build_partitions returns."""
    import quietgnn.partition.local as local
    parts = partition_nodes(graph, "metis", P, seed=0)
    ref, ref_stats = build_partitions(graph, parts), partition_stats(graph, parts)
    monkeypatch.setattr(local, "_EDGE_BLOCK", 37)
    for a, b in zip(ref, local.iter_partitions(graph, parts)):
        for k, v in a.to_dict().items():
            w = getattr(b, k)
            if isinstance(v, list):
                assert all(torch.equal(x, y) for x, y in zip(v, w)), k
            else:
                assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, k
    assert partition_stats(graph, parts) == ref_stats


def test_part_files_hold_only_their_rank(graph, tmp_path):
    """A part holds its own rows only (not a slice's whole source): its files' array bytes
    are exactly those of its arrays (int32 edges), plus one small .npy header per file."""
    book = make_book(tmp_path / "b", graph, "metis", 4)
    ref = build_partitions(graph, book.assignment())[2]
    want = sum(t.numel() * t.element_size() for k, v in ref.to_dict().items()
               for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)
               and k != "indices") + ref.indices.numel() * 4 + 8 * 4   # + send_counts [P]
    files = list((tmp_path / "b" / "part-2").glob("*.npy"))
    have = sum(f.stat().st_size for f in files)
    assert want <= have <= want + 128 * len(files)


def test_metis_stopped_midway_is_one_line_not_a_traceback(monkeypatch, capsys, tmp_path):
    """METIS signals its own errors with SIGTERM and catches it while partitioning, so a
    scheduler's SIGTERM became pymetis's 'Caught an unknown exception!' and a traceback."""
    import pymetis

    from quietgnn.cli import main
    from quietgnn.partition.partitioners import PartitionerError, metis_parts

    def stopped(*a, **k):
        raise RuntimeError("Caught an unknown exception!")
    monkeypatch.setattr(pymetis, "part_graph", stopped)
    g = small_graph(n=60, seed=1)
    with pytest.raises(PartitionerError, match=r"^METIS stopped while partitioning 60 nodes "
                                               r"into 2 parts \(Caught an unknown exception!\)"):
        metis_parts(g, 2)
    rc = main(["prepare", "--dataset", "synthetic", "--synthetic.nodes", "300", "--parts", "2",
               "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and "sent SIGTERM meanwhile, or METIS failed" in err
