"""Which host went away: rank addresses and a heartbeat through the rendezvous store.

When a collective fails, gloo can only say that it timed out or that a connection broke; on a
group that spans hosts the user needs to know *which host* to look at. At start every rank
writes its host label (host name and the address it reaches the rendezvous from) into the
store. When the ranks turn out to span more than one host, each rank also adds 1 to its own
counter in the store every :data:`PERIOD_S` seconds from a daemon thread, over its own store
connection. After a failure a rank reads every counter twice, :data:`PERIOD_S` x 2.5 apart:
a rank whose counter did not move is named with its host (its process died, or its host is
down or unreachable: a stuck rank still beats). A rank that cannot reach the store at all says
that its own host lost its link or that rank 0's host (the store's) is gone.

Traffic: one label per rank at start, then ~40 bytes per rank every :data:`PERIOD_S` seconds
while the ranks span hosts (none on one host), counted as ``control`` in the communicator's
bytes by class; not part of any epoch's operations.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional

__all__ = ["Liveness", "host_label", "watch", "PERIOD_S"]

#: seconds between two heartbeats of a rank
PERIOD_S = 2.0
#: bytes of one heartbeat on the wire (the add request with its key, and the reply), roughly
_BEAT_BYTES = 40


def host_label(master_addr: str, master_port: int) -> str:
    """``hostname (address)``: the address is the one this host reaches the rendezvous from
    (a UDP socket's local end after connect: nothing is sent)."""
    ip = "?"
    try:
        fam = socket.getaddrinfo(master_addr, None)[0][0]
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port))
            ip = s.getsockname()[0]
    except OSError:
        pass
    return f"{socket.gethostname()} ({ip})"


class Liveness:
    """Host labels of every rank and, when they differ, this rank's heartbeat.

    ``store``: the group's (prefixed) store, for the labels; ``connect``: makes another
    client of the same store (the heartbeat thread's own connection, and the reader's after a
    failure, each with a short timeout so an unreachable store answers within seconds)."""

    def __init__(self, store: Any, rank: int, world_size: int, label: str,
                 connect: Callable[[timedelta], Any],
                 count: Optional[Callable[[int], None]] = None) -> None:
        self.rank, self.world_size = rank, world_size
        self._connect, self._count = connect, count
        store.set(f"live/host/{rank}", label)
        self.labels = [store.get(f"live/host/{r}").decode(errors="replace")
                       for r in range(world_size)]
        self.spans_hosts = len(set(self.labels)) > 1
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if self.spans_hosts:
            self._thread = threading.Thread(target=self._beat, name="quietgnn-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        store = None
        try:
            store = self._connect(timedelta(seconds=4 * PERIOD_S))
            while not self._stop.is_set():
                store.add(f"live/beat/{self.rank}", 1)
                if self._count:
                    self._count(_BEAT_BYTES)
                self._stop.wait(PERIOD_S)
        except Exception:   # the store is gone: the failure path reports it, not this thread
            return
        finally:
            # the store client dies here, in its own thread, not at interpreter exit: a client
            # still alive then (its thread frozen mid-loop) aborted a finished rank's process
            # ("terminate called without an active exception", SIGABRT) on emulated hosts
            del store

    def stop(self) -> None:
        """Stop beating and wait for the thread to let go of its store connection (at most
        one store operation's timeout)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=4 * PERIOD_S + 1)
            if not self._thread.is_alive():
                self._thread = None     # else kept: its store call is still timing out

    def who(self, rank: int) -> str:
        return f"rank {rank} on {self.labels[rank]}"

    def diagnose(self) -> str:
        """One sentence naming the ranks (and hosts) that stopped beating, or why that cannot
        be known; empty on one host (the local launcher names ranks by their exit)."""
        if not self.spans_hosts:
            return ""
        wait = 2.5 * PERIOD_S
        try:
            store = self._connect(timedelta(seconds=wait))
            keys = [f"live/beat/{r}" for r in range(self.world_size)]
            first = [int(store.add(k, 0)) for k in keys]
            time.sleep(wait)
            second = [int(store.add(k, 0)) for k in keys]
        except Exception:
            return (f" This rank ({self.labels[self.rank]}) cannot reach the rendezvous store "
                    f"on rank 0's host {self.labels[0]}: this host lost its link, or rank 0's "
                    f"host is down.")
        silent = [r for r in range(self.world_size)
                  if r != self.rank and second[r] == first[r]]
        if not silent:
            return (" Every rank's heartbeat is still arriving: no host is down (a peer is "
                    "stuck in a computation, or failed itself).")
        names = ", ".join(self.who(r) for r in silent)
        return (f" Silent for {wait:g}s: {names} (its process died, or its host is down or "
                f"unreachable).")



def watch(comm: Any, store: Any, connect: Callable[[timedelta], Any]) -> Liveness:
    """The :class:`Liveness` of ``comm``'s rank on the group's ``store``; ``connect`` makes
    another client of it; heartbeats count as ``control`` bytes of ``comm``."""
    def count(n: int) -> None:
        comm.sent_by_class["control"] = comm.sent_by_class.get("control", 0) + n

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return Liveness(store, comm.rank, comm.world_size, host_label(addr, port), connect, count)
