"""The set-up check that the parts of a run agree on what crosses between them
(``quietgnn/partition/plans.py``): a part whose halo names other nodes of a peer than the
peer's send plan (counts unchanged, checksums updated) passed every per-part check and
trained silently on the wrong rows; it now stops every rank at set-up with one line, and an
untouched book trains exactly as without the check, paying a few counted bytes."""

from __future__ import annotations

import numpy as np
import pytest

from quietgnn.partition import PartitionBook, build_partitions, make_book, partition_nodes
from quietgnn.partition.plans import DIGEST_BYTES, KIND, plan_digests
from quietgnn.runtime.spawn import spawn_function

from helpers import run_cfg, small_graph, train_run
from test_prepared import _lie

P = 3
#: strategies that trust the halo: the exchanges fill it from the peer's send plan; grappa,
#: minibatch and tma read its global ids
STRATEGIES = ["halo", "adaqp", "retexo", "grappa", "tma", "minibatch"]


def _check_bytes(P):
    """What the check sends per rank: one digest row to each peer, then a gather of ``[]``
    (``J[]`` as JSON, 3 bytes, after its 8-byte length) to each."""
    return (P - 1) * DIGEST_BYTES, (P - 1) * (8 + 3)


def _swap_one_halo_id(book, k, owner):
    """Replace one of part ``k``'s halo ids owned by ``owner`` with another node ``owner``
    owns that the halo does not list, keeping the (owner, id) order, the counts and every
    other file as they were (so every per-part check passes); returns (old, new)."""
    halo = np.load(book / f"part-{k}" / "halo.npy")
    owners = np.load(book / f"part-{k}" / "halo_owner.npy")
    theirs = np.load(book / f"part-{owner}" / "owned.npy")
    spare = np.setdiff1d(theirs, halo)
    at = np.flatnonzero(owners == owner)
    for pos in at:
        lo = halo[pos - 1] if pos > at[0] else -1
        hi = halo[pos + 1] if pos < at[-1] else np.iinfo(np.int64).max
        fits = spare[(spare > lo) & (spare < hi)]
        if fits.size:
            old, new = int(halo[pos]), int(fits[0])
            _lie(book, k, "halo.npy", lambda a: np.where(np.arange(a.size) == pos, new, a))
            return old, new
    raise AssertionError("no node to swap in")


@pytest.fixture(scope="module")
def books(tmp_path_factory):
    root = tmp_path_factory.mktemp("plans")
    g = small_graph(n=200, seed=4)
    clean = make_book(root / "clean", g, "metis", P, seed=1).path
    planted = make_book(root / "planted", g, "metis", P, seed=1).path
    swapped = _swap_one_halo_id(planted, 1, 0)
    return clean, planted, swapped


def test_the_planted_halo_passes_every_per_part_check(books):
    """The defect this check exists for: each part on its own is consistent."""
    clean, planted, (old, new) = books
    opened = PartitionBook.open(planted)
    parts = [opened.load_part(k, P) for k in range(P)]
    assert new in parts[1].halo.tolist() and old not in parts[1].halo.tolist()
    assert new in parts[0].owned.tolist() and parts[1].recv_counts.tolist() == \
        PartitionBook.open(clean).load_part(1, P).recv_counts.tolist()
    sends, expects = zip(*(plan_digests(p) for p in parts))
    agree = {(i, j): bool((sends[i][j] == expects[j][i]).all())
             for i in range(P) for j in range(P) if i != j}
    half = DIGEST_BYTES // 2
    # what differs is the ids part 0 sends part 1 (named first in the refusal)
    assert not (sends[0][1][:half] == expects[1][0][:half]).all()
    assert [pair for pair, ok in agree.items() if not ok] == [(0, 1)]


def _runs(comm, clean, planted, tmp):
    """On every rank: the clean book trained with and without the check, each strategy
    refused on the planted book, the check under strict residency."""
    import quietgnn.runtime.trainer as trainer
    from quietgnn.partition.plans import check_plans
    out = {}
    part = PartitionBook.open(clean).load_part(comm.rank, P)
    out["with"] = train_run(comm, part, run_cfg("halo", P, 2), f"{tmp}/with")
    trainer.check_plans = lambda comm, part: None      # as before the check existed
    out["without"] = train_run(comm, part, run_cfg("halo", P, 2), f"{tmp}/without")
    trainer.check_plans = check_plans
    comm.residency = "strict"
    check_plans(comm, part)                             # control traffic: allowed everywhere
    comm.take_records()
    opened = PartitionBook.open(planted)
    out["refused"] = {}
    for name in STRATEGIES:
        cfg = run_cfg(name, P, 1)
        bad = opened.load_part(comm.rank, P, stored=cfg.strategy_cls.reads_stored_part(
            cfg.options))
        try:
            train_run(comm, bad, cfg, f"{tmp}/{name}")
            out["refused"][name] = None
        except ValueError as exc:
            recs = comm.take_records()
            out["refused"][name] = (str(exc), [(r.kind, r.carries) for r in recs])
    return out


def test_every_rank_refuses_the_planted_book_and_a_clean_one_trains_as_before(tmp_path, books):
    clean, planted, _ = books
    per_rank = spawn_function(_runs, P, args=(str(clean), str(planted), str(tmp_path)))
    to_peers, gathered = _check_bytes(P)
    for rank, out in enumerate(per_rank):
        # refused on every rank (rank 2 holds neither part of the pair), the same line, at
        # set-up: no strategy sent anything (the check's two collectives only)
        for name, got in out["refused"].items():
            assert got is not None, f"{name} trained on the planted book (rank {rank})"
            msg, ops = got
            assert msg == per_rank[0]["refused"][name][0] and "\n" not in msg
            assert "part 1's halo (part-1/halo.npy, halo_owner.npy) lists other nodes as " \
                   "part 0's than part 0's send plan to it (part-0/send_idx.npy)" in msg
            assert "re-create the book with `quietgnn prepare`" in msg
            assert ops == [(KIND, "control"), (KIND, "control")], (name, ops)
        # the clean book: the same run as without the check (losses, accuracies, weights,
        # every epoch's bytes); the set-up pays the check's bytes, by kind and class
        (w_run, w_par, w_rec), (o_run, o_par, o_rec) = out["with"], out["without"]
        assert w_run == o_run and len(w_run) == 3
        assert all((a == b).all() for a, b in zip(w_par, o_par))
        assert [r["bytes"] for r in w_rec[1:]] == [r["bytes"] for r in o_rec[1:]]
        check = [x for x in w_rec[0]["rounds"] if x[1] == KIND]
        assert [(x[2], x[3], x[4]) for x in check] == [("setup", to_peers, to_peers),
                                                       ("setup", gathered, gathered)]
        assert not any(x[1] == KIND for x in o_rec[0]["rounds"])
        assert w_rec[0]["bytes"]["setup"]["sent"] == \
            o_rec[0]["bytes"]["setup"]["sent"] + to_peers + gathered


def test_a_halo_degree_of_another_value_is_named(tmp_path):
    """The halo rows' global degrees (the GCN norm reads them; the reader checks only the owned
    rows' against the edges) are compared with the owner's own, in a digest of their own."""
    from quietgnn.partition.plans import _verdict
    book = make_book(tmp_path / "d", small_graph(n=200, seed=4), "metis", 2, seed=1).path
    n_own = np.load(book / "part-1" / "owned.npy").size
    _lie(book, 1, "in_degree.npy", lambda a: np.where(np.arange(a.size) == n_own, a + 1, a))
    opened = PartitionBook.open(book)
    (s0, _), (_, e1) = (plan_digests(opened.load_part(k, 2)) for k in range(2))
    half = DIGEST_BYTES // 2
    assert (s0[1][:half] == e1[0][:half]).all() and not (s0[1][half:] == e1[0][half:]).all()
    msg = _verdict([(0, 1, "degrees"), (0, 2, "ids")])
    assert "part 1's degrees of its halo nodes from part 0 (part-1/in_degree.npy, " \
           "out_degree.npy) differ from part 0's own" in msg and "1 more pair(s)" in msg


def test_in_memory_parts_always_agree():
    """The in-memory partitioning builds every halo from the peers' plans: nothing to refuse
    for any P (and a one-rank run checks nothing)."""
    g = small_graph(n=150, seed=2)
    for n_parts in (2, 4):
        parts = build_partitions(g, partition_nodes(g, "random", n_parts, seed=0))
        d = [plan_digests(p) for p in parts]
        assert all((d[i][0][j] == d[j][1][i]).all()
                   for i in range(n_parts) for j in range(n_parts) if i != j)
