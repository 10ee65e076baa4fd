"""The communicator's byte/message/hop accounting and its failure behaviour (real gloo)."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from quietgnn.comm import CommError, Communicator
from quietgnn.runtime.launcher import LaunchError
from quietgnn.runtime.spawn import spawn_function


def _collectives(comm):
    P, r = comm.world_size, comm.rank
    x = torch.full((10,), float(r + 1))
    comm.all_reduce(x, "grad_allreduce")
    b = torch.arange(6.0) if r == 1 else torch.zeros(6)
    comm.broadcast(b, src=1, kind="model_bcast")
    # rank r sends r+j+1 rows of width 3 to rank j
    send = [torch.full((r + j + 1, 3), float(r)) for j in range(P)]
    recv_known = comm.all_to_all(send, "known", recv_counts=[j + r + 1 for j in range(P)])
    recv_hand = comm.all_to_all(send, "handshake")
    pending = comm.all_to_all_async([s.to(torch.uint8) for s in send], "async")
    t = time.thread_time()
    while time.thread_time() - t < 0.05:     # compute while it flies
        pass
    recv_async = pending.wait()
    with comm.phase("eval"):
        comm.barrier()
    return {"x": x, "b": b, "recv_known": recv_known, "recv_hand": recv_hand,
            "recv_async": recv_async, "records": [r_.as_dict() for r_ in comm.take_records()]}


def _collectives_split(comm):
    """The same with the all-to-all split by direction (runtime.duplex on), plus two
    exchanges in flight at once, waited in reverse order, one with empty blocks."""
    modes = (comm.split_duplex("auto"), comm.split_duplex("on"))
    out = _collectives(comm)
    P, r = comm.world_size, comm.rank
    a = comm.all_to_all_async([torch.full((j % 2 * (r + 1), 2), float(10 * r + j))
                               for j in range(P)], "twice_a", carries="control")
    b = comm.all_to_all_async([torch.full((1,), float(r))] * P, "twice_b", carries="control")
    got_b, got_a = b.wait(), a.wait()
    return {**out, "modes": modes, "twice_a": got_a, "twice_b": got_b,
            "records_after": [x.as_dict() for x in comm.take_records()]}


def test_all_to_all_split_by_direction_is_the_collective():
    """runtime.duplex: the split exchange gives the collective's blocks and records (the
    counts checked by the test below); 'auto' leaves it off on one host."""
    P = 4
    for r, out in enumerate(spawn_function(_collectives_split, P)):
        assert out["modes"] == (False, True)
        _check_collectives(r, out, P)
        for j in range(P):
            assert torch.equal(out["twice_a"][j],
                               torch.full((r % 2 * (j + 1), 2), float(10 * j + r)))
            assert torch.equal(out["twice_b"][j], torch.full((1,), float(j)))
        sent = {x["kind"]: x["bytes_sent"] for x in out["records_after"]}
        assert sent["twice_a"] == sum(j % 2 * (r + 1) for j in range(P) if j != r) * 8 + \
            8 * (P - 1)
    with pytest.raises(ValueError, match=r"runtime.duplex = 'yes'; expected auto, on or off"):
        Communicator().split_duplex("yes")


def _check_collectives(r, out, P):
    assert torch.equal(out["x"], torch.full((10,), float(sum(range(1, P + 1)))))
    assert torch.equal(out["b"], torch.arange(6.0))
    for j in range(P):
        expect = torch.full((j + r + 1, 3), float(j))
        assert torch.equal(out["recv_known"][j], expect)
        assert torch.equal(out["recv_hand"][j], expect)
        assert torch.equal(out["recv_async"][j], expect.to(torch.uint8))
    recs = {rec["kind"]: rec for rec in out["records"]}
    assert [rec["round"] for rec in out["records"]] == list(range(6))
    ar = recs["grad_allreduce"]
    assert ar["bytes_sent"] == ar["bytes_recv"] == 2 * (P - 1) * 40 // P
    assert ar["hops"] == 4 and ar["phase"] == "setup"   # the default phase outside a trainer
    rows_out = sum(r + j + 1 for j in range(P) if j != r)
    rows_in = sum(j + r + 1 for j in range(P) if j != r)
    assert recs["known"]["bytes_sent"] == rows_out * 3 * 4
    assert recs["known"]["bytes_recv"] == rows_in * 3 * 4
    assert recs["known"]["messages"] == P - 1 and recs["known"]["hops"] == 1
    # unknown sizes cost a handshake of P-1 int64 counts and one more hop
    assert recs["handshake"]["bytes_sent"] == rows_out * 12 + 8 * (P - 1)
    assert recs["handshake"]["hops"] == 2
    assert recs["async"]["bytes_sent"] == rows_out * 3 + 8 * (P - 1)   # uint8 rows
    # the compute it flew behind (what a slow link's transfer can hide behind); an exchange
    # waited for at once has none
    assert 0.05 <= recs["async"]["overlap_cpu_s"] < 5
    assert recs["known"]["overlap_cpu_s"] is None and recs["handshake"]["overlap_cpu_s"] is None
    # the caller was blocked only starting and waiting: its compute in between is not
    # communication (a GPU run's compute is wall seconds less this)
    a = recs["async"]
    assert 0 <= a["blocked_s"] <= a["seconds"] - 0.9 * a["overlap_cpu_s"]
    assert recs["known"]["blocked_s"] is None
    assert recs["barrier"]["phase"] == "eval"


def test_collectives_results_and_counts():
    P = 4
    res = spawn_function(_collectives, P)
    for r, out in enumerate(res):
        _check_collectives(r, out, P)
    # a broadcast's bytes are conserved: what the tree sends is what the non-roots receive
    bc = [out["records"][1] for out in res]
    assert sum(b["bytes_sent"] for b in bc) == sum(b["bytes_recv"] for b in bc) == (P - 1) * 24
    assert bc[1]["bytes_recv"] == 0


def _late_peer(comm):
    if comm.rank == 1:
        time.sleep(12)       # never joins in time
        return "late"
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(3), "grad_allreduce")
    except CommError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - t0}
    return "no error"


@pytest.mark.slow   # waits out a timeout: the slow tier (pytest -m slow)
def test_stuck_peer_times_out_with_a_clear_error():
    res = spawn_function(_late_peer, 2, comm_timeout_s=3)
    assert isinstance(res[0], dict), res[0]
    msg = res[0]["error"]
    assert "rank 0: all_reduce (grad_allreduce, round 0, epoch -1) failed" in msg
    assert "timeout 3s" in msg
    assert res[0]["seconds"] < 11  # the timeout fired, not the peer's arrival


def _dying_peer(comm):
    if comm.rank == 1:
        import os
        os._exit(3)
    try:
        comm.all_reduce(torch.ones(3), "grad_allreduce")
    except CommError as exc:
        return str(exc)
    return "no error"


def test_dead_peer_is_reported_not_hung():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] died|rank 1"):
        # rank 1 dies without reporting; the parent notices instead of waiting forever
        spawn_function(_dying_peer, 2, comm_timeout_s=5, timeout_s=60)


def test_single_process_ops_are_free():
    c = Communicator(0, 1)
    t = torch.ones(4)
    assert c.all_reduce(t, "x") is t
    assert c.all_to_all([torch.ones(2, 3)], "x")[0].shape == (2, 3)
    c.barrier()
    assert c.take_records() == []
    with pytest.raises(ValueError, match="expected one per rank"):
        c.all_to_all([torch.ones(1), torch.ones(1)], "x")
    with pytest.raises(ValueError, match="unknown traffic phase"):
        with c.phase("training"):
            pass


def _exchange_buffers_freed(comm):
    """With the garbage collector off, an all-to-all's buffers must go when the last reference
    to the exchange goes (a reference cycle held ~all of an epoch's halo buffers before)."""
    import gc
    import weakref
    gc.disable()
    try:
        pending = comm.all_to_all_async([torch.ones(1000, 8)] * comm.world_size, "test",
                                        [1000] * comm.world_size)
        recv = pending.wait()
        ref = weakref.ref(pending)
        flat = weakref.ref(recv[0].untyped_storage())   # the receive buffer's storage
        del pending, recv
        # gloo's worker thread may drop its own reference a moment after the wait returns;
        # a reference cycle would keep the buffer until a collection, i.e. forever here
        deadline = time.monotonic() + 5.0
        while flat() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        return ref() is None, flat() is None
    finally:
        gc.enable()


def test_all_to_all_frees_its_buffers_without_gc():
    assert spawn_function(_exchange_buffers_freed, 2) == [(True, True), (True, True)]


def _zero_copy_exchange(comm):
    """Blocks that are views of one buffer go out without a copy, ``out`` receives in place:
    same blocks as the plain call, same byte counts."""
    P, r = comm.world_size, comm.rank
    rows = [j + 1 for j in range(P)]                        # rows this rank sends to peer j
    buf = torch.arange(sum(rows) * 3, dtype=torch.float32).reshape(-1, 3) + 100 * r
    plain = comm.all_to_all([b.clone() for b in torch.split(buf, rows)], "plain",
                            [r + 1] * P)
    out = torch.full((P * (r + 1), 3), -1.0)
    got = comm.all_to_all(torch.split(buf, rows), "zero_copy", [r + 1] * P, out=out)
    recs = comm.take_records()
    same = all(torch.equal(a, b) for a, b in zip(plain, got))
    in_out = all(g.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for g in got)
    return same, in_out, recs[0].bytes_sent == recs[1].bytes_sent, bool((out >= 0).all())


def _separate_blocks(comm):
    """Views of one numpy array, the first empty: each view is its own torch storage, and the
    empty one starts where the next does; they are sent as blocks, not read as one buffer
    past the first's (empty) storage."""
    import numpy as np
    base = np.arange(8, dtype=np.int64).reshape(4, 2) + 100 * comm.rank
    got = comm.all_to_all([torch.from_numpy(a) for a in np.split(base, [0])], "separate")
    return [g[:, 0].tolist() for g in got]


def test_all_to_all_zero_copy_send_and_out():
    for res in spawn_function(_zero_copy_exchange, 3):
        assert res == (True, True, True, True)


def _out_made_after_the_sizes(comm):
    """``out`` as a function of the total rows: called once with what the size handshake
    found, received into what it returned; the same blocks and bytes as the plain call."""
    P, r = comm.world_size, comm.rank
    send = [torch.full((r + j + 1, 2), float(10 * r + j)) for j in range(P)]
    plain = comm.all_to_all([b.clone() for b in send], "plain")
    asked = []

    def make(rows):
        asked.append(rows)
        return torch.full((rows, 2), -1.0)
    got = comm.all_to_all(send, "made", out=make)
    recs = comm.take_records()
    made = got[0].untyped_storage().data_ptr()
    return (asked, all(torch.equal(a, b) for a, b in zip(plain, got)),
            all(g.untyped_storage().data_ptr() == made for g in got),
            recs[0].bytes_sent == recs[1].bytes_sent and recs[0].bytes_recv == recs[1].bytes_recv)


def test_all_to_all_out_made_once_the_sizes_are_known():
    for r, (asked, same, in_one, same_bytes) in enumerate(spawn_function(
            _out_made_after_the_sizes, 3)):
        assert asked == [sum(j + r + 1 for j in range(3))]     # rows each peer j sends to r
        assert same and in_one and same_bytes


def test_all_to_all_of_separate_numpy_blocks():
    res = spawn_function(_separate_blocks, 2)
    assert res == [[[], []], [[0, 2, 4, 6], [100, 102, 104, 106]]]


def test_joining_a_group_nobody_starts_fails_in_one_line(monkeypatch):
    """No rank 0 at MASTER_ADDR:MASTER_PORT (a typo, a stopped host): the rank says where it
    looked and what to check, in one line, within the timeout; not torch's backtrace."""
    import socket
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(CommError) as ei:
        Communicator.init(1, 2, timeout_s=1)
    msg = str(ei.value)
    assert f"rank 1 could not join rank 0's store at 127.0.0.1:{port}" in msg
    assert "MASTER_PORT" in msg and "\n" not in msg


@pytest.mark.parametrize("env, named", [
    ({"RANK": "abc", "WORLD_SIZE": "2"},
     "RANK = 'abc' in the environment; expected an integer 0 .. 1"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK = '5'"),
    ({"RANK": "0", "WORLD_SIZE": "-1"}, "WORLD_SIZE = '-1'"),
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"},
     "MASTER_PORT = '70000'"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, "MASTER_ADDR is not set"),
])
def test_rank_environment_is_checked_and_named(monkeypatch, env, named):
    from quietgnn.runtime.worker import worker_env
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=re.escape(named)):
        worker_env()


class _Store:
    """Rank 0's view of a two-rank rendezvous store whose rank 1 posts ``peer(name, keys)``
    when rank 0 waits for ``name`` (None: never posts)."""

    def __init__(self, peer, forge=False):
        self.keys, self.peer, self.forge = {}, peer, forge

    def set(self, name, value):
        self.keys[name] = value.encode() if isinstance(value, str) else value

    def wait(self, names):
        for n in names:
            if n not in self.keys:
                v = self.peer(n, self.keys)
                if v is None:
                    raise RuntimeError("Wait timeout")
                self.set(n, v)

    def get(self, name):
        if name == "auth/nonce/0" and self.forge:     # a stranger rewrote rank 0's entry
            return json.dumps({"nonce": "cd" * 16, "secret": False}).encode()
        return self.keys[name]


def _proof(key: str, rank: int, nonces: list) -> str:
    import hashlib
    import hmac
    return hmac.new(key.encode(), b"quietgnn-peer|%d|" % rank + "|".join(nonces).encode(),
                    hashlib.sha256).hexdigest()


def _peer(key, nonce="ab" * 16, proof=None):
    """Rank 1: posts ``nonce`` (and whether it has a secret), then its proof by ``key``."""
    def answer(name, keys):
        if name == "auth/nonce/1":
            return json.dumps({"nonce": nonce, "secret": key is not None})
        if name == "auth/proof/1":
            mine = json.loads(keys["auth/nonce/0"])["nonce"]
            return json.dumps(proof if proof is not None else _proof(key, 1, [mine, nonce]))
    return answer


def test_every_rank_proves_the_run_secret_before_the_group_forms():
    """A process that took a rank's place in the store (a stranger, another job on the same
    port) cannot answer the challenge: every rank stops naming it; honest ranks pass."""
    from quietgnn.comm.rendezvous import AuthError, prove_peers

    def run(peer, secret="s3cret-s3cret-s3cret"):
        return prove_peers(_Store(peer), 0, 2, secret)
    assert run(_peer("s3cret-s3cret-s3cret")) is not None    # the challenge, for the links
    with pytest.raises(AuthError, match=r"rank\(s\) \[1\] did not prove the run's secret"):
        run(_peer("guess"))
    with pytest.raises(AuthError, match=r"rank\(s\) \[1\] did not prove"):   # a replay
        run(_peer("s3cret-s3cret-s3cret",
                  proof=_proof("s3cret-s3cret-s3cret", 1, ["00" * 16, "ab" * 16])))
    with pytest.raises(AuthError, match=r"rank\(s\) \[1\] answered the join with something"):
        run(lambda name, keys: b"\x80garbage")
    with pytest.raises(AuthError, match=r"rank 1 did not answer the join .* within the timeout"):
        run(lambda name, keys: None)             # joined the store, never answers
    with pytest.raises(AuthError, match=r"rank\(s\) \[0\] have no QUIETGNN_SECRET"):
        run(_peer("s3cret-s3cret-s3cret"), secret=None)
    # nobody has a secret (a torchrun job without one): unauthenticated, said by the worker
    assert run(_peer(None), secret=None) is None
    # a rank holding a secret never goes on unauthenticated: not when a peer claims to have
    # none, not when the store is rewritten to say that this rank has none either
    with pytest.raises(AuthError, match=r"rank\(s\) \[1\] have no QUIETGNN_SECRET"):
        run(_peer(None))
    with pytest.raises(AuthError, match=r"rank\(s\) \[1\] have no QUIETGNN_SECRET"):
        prove_peers(_Store(_peer(None), forge=True), 0, 2, "s3cret-s3cret-s3cret")
    with pytest.raises(ValueError, match="QUIETGNN_SECRET is 3 character.* at least 16"):
        run(_peer("abc"), secret="abc")


def test_the_connected_peers_prove_the_secret_over_the_group():
    """gloo finds its peers' addresses in the unauthenticated store: a process whose address
    replaced a rank's there after the proofs is caught over the connection itself."""
    import hashlib
    import hmac

    from quietgnn.comm.rendezvous import AuthError, confirm_links
    secret, challenge = "s3cret-s3cret-s3cret", b"nonces"

    class Group:
        rank, world_size = 0, 2

        def __init__(self, key):
            self.key, self.kinds = key, []

        def all_gather_object(self, obj, kind="control", *, carries=None):
            self.kinds.append((kind, carries))
            peer = hmac.new(self.key.encode(), b"quietgnn-link|1|" + challenge,
                            hashlib.sha256).hexdigest()
            return [obj, peer]
    honest = Group(secret)
    confirm_links(honest, secret, challenge)
    assert honest.kinds == [("peer_auth", "control")]        # counted, as control traffic
    with pytest.raises(AuthError, match=r"connected as rank\(s\) \[1\] does not hold"):
        confirm_links(Group("another-secret-here"), secret, challenge)
