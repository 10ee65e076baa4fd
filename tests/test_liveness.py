"""The heartbeat that names a vanished host (quietgnn/comm/liveness.py), on one machine: ranks
with different host labels over a real TCPStore; one stops beating, the other names it."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import torch.distributed as dist

from quietgnn.comm import liveness
from quietgnn.comm.liveness import Liveness


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_silent_rank_is_named_with_its_host(monkeypatch):
    monkeypatch.setattr(liveness, "PERIOD_S", 0.2)
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 3, is_master=True, timeout=timedelta(seconds=10),
                           wait_for_workers=False)

    def connect(timeout):
        return dist.TCPStore("127.0.0.1", port, 3, is_master=False, timeout=timeout)

    counted = []
    # labels first (each rank's get waits for the others' set): set them all, then build
    for r, name in enumerate(["a (10.0.0.1)", "b (10.0.0.2)", "c (10.0.0.3)"]):
        server.set(f"live/host/{r}", name)
    ranks = [Liveness(connect(timedelta(seconds=5)), r, 3, lab, connect, counted.append)
             for r, lab in enumerate(["a (10.0.0.1)", "b (10.0.0.2)", "c (10.0.0.3)"])]
    assert all(x.spans_hosts for x in ranks)
    time.sleep(0.5)
    assert "no host is down" in ranks[0].diagnose()        # everyone beats
    ranks[2].stop()                                         # rank 2's host goes quiet
    time.sleep(0.5)
    msg = ranks[0].diagnose()
    assert "rank 2 on c (10.0.0.3)" in msg and "rank 1" not in msg
    assert counted and all(n > 0 for n in counted)          # beats are counted as bytes
    for x in ranks:
        x.stop()


def test_one_host_needs_no_heartbeat():
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=10),
                           wait_for_workers=False)
    for r in range(2):
        server.set(f"live/host/{r}", "same (127.0.0.1)")
    x = Liveness(server, 0, 2, "same (127.0.0.1)", lambda t: server)
    assert not x.spans_hosts and x._thread is None and x.diagnose() == ""


def test_an_unreachable_store_is_reported_as_a_lost_link(monkeypatch):
    monkeypatch.setattr(liveness, "PERIOD_S", 0.2)
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=10),
                           wait_for_workers=False)
    server.set("live/host/0", "a (10.0.0.1)")
    server.set("live/host/1", "b (10.0.0.2)")

    def gone(timeout):
        raise RuntimeError("connect: no route to host")

    x = Liveness(server, 1, 2, "b (10.0.0.2)", gone)
    msg = x.diagnose()
    assert "cannot reach the rendezvous store on rank 0's host a (10.0.0.1)" in msg
    assert "lost its link" in msg
    x.stop()
