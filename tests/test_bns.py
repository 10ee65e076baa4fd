"""``bns`` (BNS-GCN): at p = 1 it is ``halo`` (whole rows), and at p < 1 exactly the sampled
boundary rows cross, both ways, as both ends' keyed sample says."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quietgnn.comm import Communicator
from quietgnn.nn.keyed import mix_key
from quietgnn.partition import build_partitions, partition_nodes
from quietgnn.runtime.spawn import spawn_function

from helpers import run_cfg, small_graph, train_run

EPOCHS, HIDDEN = 3, 8


def _cfg(strategy, parts, **options):
    return run_cfg(strategy, parts, EPOCHS, HIDDEN, **options)


_train = train_run


def _pair(comm, graph, parts, tmp):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    halo = _train(comm, part, _cfg("halo", comm.world_size, skip_dropped=False), f"{tmp}/h")
    bns = _train(comm, part, _cfg("bns", comm.world_size, p=1.0), f"{tmp}/b")
    return halo[:2], bns[:2], [r["bytes"] for r in halo[2]], [r["bytes"] for r in bns[2]]


@pytest.mark.parametrize("P", [1, 2, 4])
def test_p_1_is_halo(P, tmp_path):
    graph = small_graph(n=200)
    parts = partition_nodes(graph, "metis", P, seed=0)
    res = [_pair(Communicator(0, 1), graph, parts, tmp_path)] if P == 1 else \
        spawn_function(_pair, P, args=(graph, parts, str(tmp_path)))
    for (h_run, h_par), (b_run, b_par), h_bytes, b_bytes in res:
        for a, b in zip(h_run, b_run):
            assert a[0] == b[0] and a[2] == b[2]
            assert (a[1] is None and b[1] is None) or a[1] == pytest.approx(b[1], rel=1e-6)
        assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(h_par, b_par))
        assert h_bytes == b_bytes                        # the same rows cross, so the same bytes


def _sampled(comm, graph, parts, tmp, rate):
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    cfg = _cfg("bns", comm.world_size, p=rate)
    records = _train(comm, part, cfg, f"{tmp}/s")[2]
    from quietgnn.comm import HaloExchanger
    ex = HaloExchanger(Communicator(comm.rank, comm.world_size), part, kind="bns")
    want = []
    for e in range(EPOCHS):   # the sample both ends compute: rows out (forward), in (backward)
        m_send, m_recv = ex.row_sample(rate, mix_key(mix_key(cfg.train.seed, e), 0x626E73))
        want.append((int(m_send.sum()) * HIDDEN * 4, int(m_recv.sum()) * HIDDEN * 4))
    got = [(r["bytes_by_kind"].get("train/bns_fwd", 0), r["bytes_by_kind"].get("train/bns_bwd", 0))
           for r in records if r["epoch"] >= 0]
    return want, got, int(sum(ex.send_counts)), int(sum(ex.recv_counts))


def test_only_the_sampled_rows_cross(tmp_path):
    graph = small_graph(n=300)
    parts = partition_nodes(graph, "metis", 3, seed=0)
    for want, got, boundary_out, boundary_in in spawn_function(
            _sampled, 3, args=(graph, parts, str(tmp_path), 0.3)):
        assert got == want                          # 4 bytes x hidden width per sampled row
        sent = sum(w[0] for w in want) / (EPOCHS * HIDDEN * 4)
        assert 0 < sent < 0.6 * boundary_out         # about 0.3 of the boundary, not all of it


def test_bad_rate_is_named():
    with pytest.raises(ValueError, match=r"options.p = 0.*fraction in \(0, 1\]"):
        _cfg("bns", 2, p=0)


def _sparse_and_dense(comm, graph, parts, tmp):
    from quietgnn.strategies.bns import BNS
    torch.set_num_threads(1)
    part = build_partitions(graph, parts, ranks=[comm.rank])[0]
    cfg = _cfg("bns", comm.world_size, p=0.5)
    sparse = _train(comm, part, cfg, f"{tmp}/s")
    BNS.sparse_inputs = False            # the same run with the input rows kept dense
    try:
        dense = _train(comm, part, cfg, f"{tmp}/d")
    finally:
        BNS.sparse_inputs = True
    return sparse[1], dense[1]


def test_sparse_inputs_are_sampled_as_the_dense_ones(tmp_path):
    graph = small_graph(n=200)
    keep = torch.rand(graph.x.shape, generator=torch.Generator().manual_seed(0)) < 0.05
    graph = dataclasses.replace(graph, x=graph.x * keep)      # mostly zero: kept sparse
    parts = partition_nodes(graph, "metis", 2, seed=0)
    for s_par, d_par in spawn_function(_sparse_and_dense, 2, args=(graph, parts, str(tmp_path))):
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(s_par, d_par))
