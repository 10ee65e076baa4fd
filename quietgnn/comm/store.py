"""A fault-tolerant star channel: rank 0 is a small parameter server, every other rank a spoke.

Why not gloo. A gloo collective involves every rank of the group; when one peer dies the
others raise (or hang until the group timeout) and the group cannot be used again without a
global rebuild, which itself needs every *surviving* rank to agree on the new membership.
Model-averaging strategies (RandomTMA / SuperTMA, :mod:`quietgnn.strategies.tma`) promise the
opposite: a trainer dies, the others keep going and average over the survivors. So their
traffic goes through this channel instead:

* **Topology.** Rank 0 (the *hub*) listens on a TCP port; ranks ``1..P-1`` (the *spokes*) each
  hold one persistent connection to it. The port is announced once with a gloo broadcast at
  setup (when all ranks are known to be alive); after that no gloo collective is needed.
* **Who may join.** The hub listens only on the address the spokes connect to
  (``MASTER_ADDR``; 127.0.0.1 under the local launcher), and only until every spoke has
  joined. The same bootstrap broadcast carries a random 32-byte secret: the hub sends each
  connection a fresh nonce and admits it only if it answers ``HMAC-SHA256(secret, rank |
  nonce)``; anything else is closed and the hub keeps waiting for the real spokes. Messages
  are JSON or weights-only torch archives (:mod:`quietgnn.serial`), never pickles.
* **Failure detection.** A process that dies (crash, ``os._exit``, SIGKILL, OOM kill) has its
  socket closed by the kernel, so the hub sees EOF or a reset *at once* and drops that rank.
  A rank that is alive but silent (hung, or far slower than everyone else) is dropped when it
  misses a deadline of ``timeout_s`` seconds in a gather; its connection is closed, so if it
  wakes up it fails loudly instead of training on alone. Drops are final (a dropped rank is
  never re-admitted) and recorded in :attr:`StarChannel.lost` (rank, round, epoch, seconds
  since the channel opened, reason).
* **What is given up.** The hub is a single point of failure (as the paper's server): when
  rank 0 dies the spokes raise :class:`~quietgnn.comm.CommError`. Hub bandwidth: a reduction
  moves ``(S-1) M`` bytes through rank 0 each way (S participants, payload M), against
  ``2 (P-1)/P M`` per rank for a ring all-reduce; for model averaging every few seconds this
  is small, and it is what makes dead peers harmless.

Operations (each one *round* of the :class:`~quietgnn.comm.Communicator`: the survivors all
issue the same operations in the same order, and every op is recorded as an ``OpRecord`` with
the Communicator's phase/epoch, so the trainer's metrics and the network model see it):

* :meth:`reduce_sum` -- sum a float32 vector over the live ranks, everyone gets the sum and the
  list of ranks that contributed (2 hops: up to the hub, back down);
* :meth:`gather_object` -- the hub gets one object (tensors, plain data) from every live rank
  (1 hop);
* :meth:`broadcast_object` -- the live spokes get one object from the hub (1 hop).

Wire format: every message is a 20-byte header ``(tag: 4 bytes, round: int64, length: int64)``
followed by ``length`` payload bytes; header bytes are counted as traffic. ``reduce_sum``
replies carry the sum (``4 n`` bytes) plus one byte per rank (1 = contributed). Set-up: the
bootstrap broadcast is 40 bytes (int64 port + 32-byte secret); joining costs each spoke one
nonce message (header + 16) in and one hello (header + 32-byte MAC) out.

World size 1: every operation is a local no-op that records nothing (like the Communicator).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import selectors
import socket
import struct
import time
from typing import Any, Optional

import torch
from torch import Tensor

from ..serial import dumps, loads
from .communicator import CommError, Communicator
from .qreduce import decode_flat, encode_flat, encoded_len
from .rendezvous import _resolve
from .traffic import Traffic

__all__ = ["StarChannel", "HEADER_BYTES"]

_HEADER = struct.Struct("!4sqq")
#: bytes of the framing header of every message
HEADER_BYTES = _HEADER.size
#: bytes of the hub's secret, of its nonce per connection, and of a spoke's proof (HMAC-SHA256)
SECRET_BYTES, NONCE_BYTES, MAC_BYTES = 32, 16, 32


def _proof(secret: bytes, rank: int, nonce: bytes) -> bytes:
    return hmac.new(secret, b"quietgnn-hub|%d|" % rank + nonce, hashlib.sha256).digest()


class StarChannel:
    """Hub-and-spoke messaging with failure detection (see the module docstring).

    Create it on every rank at the same point with :meth:`open` (which uses one gloo
    broadcast to announce the hub's port). ``timeout_s``: how long the hub waits for a live
    spoke in a gather, and a spoke for the hub's reply, before giving up on it.
    """

    def __init__(self, comm: Communicator, timeout_s: float) -> None:
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self.timeout_s = float(timeout_s)
        self.spoke_timeout_s = 2.0 * self.timeout_s + 5.0
        self.alive: list[int] = list(range(self.world_size))
        self.lost: list[dict[str, Any]] = []
        self._socks: dict[int, socket.socket] = {}     # hub: rank -> spoke connection
        self._inbuf: dict[int, bytearray] = {}
        self._hub: Optional[socket.socket] = None      # spoke: connection to the hub
        self._listener: Optional[socket.socket] = None
        self._t_open = time.monotonic()

    # ------------------------------------------------------------------ set-up / tear-down
    @classmethod
    def open(cls, comm: Communicator, timeout_s: Optional[float] = None,
             host: Optional[str] = None) -> "StarChannel":
        """Connect all ranks (collective: call on every rank). The hub binds an ephemeral
        port on ``host`` (default ``MASTER_ADDR`` or 127.0.0.1: where the spokes connect, not
        every interface) and announces it and a fresh secret with one broadcast (kind
        ``ft_bootstrap``); spokes connect to ``host`` and prove the secret."""
        ch = cls(comm, comm.timeout_s if timeout_s is None else timeout_s)
        if ch.world_size == 1:
            return ch
        addr = host or os.environ.get("MASTER_ADDR", "127.0.0.1")
        # [port | secret as 4 int64]: one broadcast, while every rank is known to be alive
        boot = torch.zeros(1 + SECRET_BYTES // 8, dtype=torch.int64)
        if ch.rank == 0:
            fam, ip = _resolve(addr)
            lst = socket.socket(fam, socket.SOCK_STREAM)
            try:
                lst.bind((ip, 0))
            except OSError as exc:
                lst.close()
                raise ValueError(f"rank 0 cannot open the averaging hub on MASTER_ADDR = "
                                 f"{addr!r} ({ip}): {exc.strerror or exc}; MASTER_ADDR must be "
                                 f"an address of rank 0's host") from None
            lst.listen(ch.world_size)
            ch._listener = lst
            boot[0] = lst.getsockname()[1]
            boot[1:] = torch.frombuffer(bytearray(secrets.token_bytes(SECRET_BYTES)),
                                        dtype=torch.int64)
        comm.broadcast(boot, 0, kind="ft_bootstrap", carries=Traffic.CONTROL)
        port, secret = int(boot[0]), boot[1:].numpy().tobytes()
        r, t0, c0 = comm._begin()
        if ch.rank == 0:
            ch._accept_all(secret)
            n = ch.world_size - 1
            comm._record("ft_connect", "ft_bootstrap", n * (HEADER_BYTES + NONCE_BYTES),
                         n * (HEADER_BYTES + MAC_BYTES), n, 2, t0, c0, r, Traffic.CONTROL)
        else:
            deadline = time.monotonic() + ch.timeout_s
            while True:
                try:
                    s = socket.create_connection((addr, port), timeout=ch.timeout_s)
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise CommError(f"rank {ch.rank}: cannot reach the averaging hub at "
                                        f"{addr}:{port} ({exc}); check MASTER_ADDR "
                                        f"and firewalls") from exc
                    time.sleep(0.05)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A reply can be late by the hub's own wait for a silent peer (timeout_s) before
            # it drops that peer and answers: a spoke that gave up after timeout_s as well
            # would be lost with it (seen when a host's link went down: runtime/netcluster.py).
            s.settimeout(ch.spoke_timeout_s)
            ch._hub = s
            try:
                tag, _, n = _HEADER.unpack(_recv_exact(s, HEADER_BYTES))
                nonce = _recv_exact(s, n) if tag == b"NONC" and n == NONCE_BYTES else b""
                if not nonce:
                    raise EOFError(f"expected a {NONCE_BYTES}-byte nonce, got {tag!r} of {n}")
                s.sendall(_HEADER.pack(b"HELO", ch.rank, MAC_BYTES) +
                          _proof(secret, ch.rank, nonce))
            except (OSError, EOFError) as exc:
                raise ch._hub_error(r, exc) from exc
            comm._record("ft_connect", "ft_bootstrap", HEADER_BYTES + MAC_BYTES,
                         HEADER_BYTES + NONCE_BYTES, 1, 2, t0, c0, r, Traffic.CONTROL)
        return ch

    def _accept_all(self, secret: bytes) -> None:
        """Admit one authenticated connection per spoke rank within ``timeout_s``. A
        connection that does not prove the secret (a port scanner, a stranger, a replay) is
        closed and does not stop the hub from waiting for the real spokes. The listener is
        closed once all have joined: nobody can connect afterwards."""
        lst = self._listener
        assert lst is not None
        lst.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(lst, selectors.EVENT_READ, None)
        pending: dict[socket.socket, tuple[bytes, bytearray]] = {}   # conn -> (nonce, input)
        rejected = 0
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(self._socks) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, self.world_size)) - set(self._socks))
                    raise CommError(f"rank 0: rank(s) {missing} did not join the averaging hub "
                                    f"within {self.timeout_s:g}s ({rejected} connection(s) "
                                    f"without the run's secret were refused)")
                for key, _ in sel.select(min(left, 1.0)):
                    if key.data is None:           # the listener: a new connection
                        try:
                            s, _ = lst.accept()
                        except OSError:            # gone before accept, or would block
                            continue
                        nonce = secrets.token_bytes(NONCE_BYTES)
                        try:
                            s.settimeout(1.0)      # 36 bytes into an empty socket buffer
                            s.sendall(_HEADER.pack(b"NONC", 0, NONCE_BYTES) + nonce)
                            s.setblocking(False)
                        except OSError:
                            rejected += 1
                            s.close()
                            continue
                        pending[s] = (nonce, bytearray())
                        sel.register(s, selectors.EVENT_READ, "hello")
                        continue
                    s = key.fileobj
                    nonce, buf = pending[s]
                    try:
                        chunk = s.recv(HEADER_BYTES + MAC_BYTES - len(buf))
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        chunk = b""
                    buf += chunk
                    if chunk and len(buf) < HEADER_BYTES + MAC_BYTES:
                        continue
                    sel.unregister(s)
                    del pending[s]
                    rank = self._check_hello(bytes(buf), nonce, secret)
                    if rank is None:
                        rejected += 1
                        s.close()
                        continue
                    s.setblocking(True)
                    s.settimeout(self.timeout_s)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._socks[rank] = s
                    self._inbuf[rank] = bytearray()
        finally:
            sel.close()
            for s in pending:
                s.close()
            lst.close()
            self._listener = None

    def _check_hello(self, msg: bytes, nonce: bytes, secret: bytes) -> Optional[int]:
        """The rank a hello proves (``None``: refuse it)."""
        if len(msg) != HEADER_BYTES + MAC_BYTES:
            return None
        tag, rank, n = _HEADER.unpack(msg[:HEADER_BYTES])
        if tag != b"HELO" or n != MAC_BYTES or not 0 < rank < self.world_size or \
                rank in self._socks:
            return None
        ok = hmac.compare_digest(msg[HEADER_BYTES:], _proof(secret, rank, nonce))
        return rank if ok else None

    def close(self) -> None:
        for s in list(self._socks.values()) + [self._hub, self._listener]:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self._socks.clear()
        self._hub = self._listener = None

    # ------------------------------------------------------------------ membership
    @property
    def survivors(self) -> int:
        return len(self.alive)

    def _drop(self, rank: int, round_: int, reason: str) -> None:
        if rank not in self.alive:
            return
        self.alive.remove(rank)
        s = self._socks.pop(rank, None)
        if s is not None:
            try:
                s.close()
            except OSError:
                pass
        self.lost.append({"rank": rank, "round": round_, "epoch": self.comm.epoch,
                          "seconds": round(time.monotonic() - self._t_open, 3),
                          "reason": reason})

    # ------------------------------------------------------------------ hub primitives
    def _collect(self, tag: bytes, round_: int) -> dict[int, bytes]:
        """Hub: one ``tag`` message of round ``round_`` from every live spoke; spokes that die
        or miss the deadline are dropped. Returns ``{rank: payload}``."""
        out: dict[int, bytes] = {}
        sel = selectors.DefaultSelector()
        pending = set()
        for r in self.alive:
            if r == 0:
                continue
            msg = self._parse(r, tag, round_)
            if msg is not None:
                out[r] = msg
                continue
            self._socks[r].setblocking(False)
            sel.register(self._socks[r], selectors.EVENT_READ, r)
            pending.add(r)
        deadline = time.monotonic() + self.timeout_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    for r in sorted(pending):
                        sel.unregister(self._socks[r])
                        self._drop(r, round_, f"no message within {self.timeout_s:g}s (hung or "
                                              f"too slow)")
                    break
                for key, _ in sel.select(min(left, 1.0)):
                    r = key.data
                    try:
                        chunk = self._socks[r].recv(1 << 20)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        chunk, reason = b"", f"connection error: {exc}"
                    else:
                        reason = "connection closed (process exited)"
                    if not chunk:
                        sel.unregister(key.fileobj)
                        pending.discard(r)
                        self._drop(r, round_, reason)
                        continue
                    self._inbuf[r] += chunk
                    msg = self._parse(r, tag, round_)
                    if msg is not None:
                        sel.unregister(key.fileobj)
                        pending.discard(r)
                        out[r] = msg
        finally:
            sel.close()
            for r in self.alive:
                if r != 0:
                    self._socks[r].settimeout(self.timeout_s)
        return out

    def _parse(self, r: int, tag: bytes, round_: int) -> Optional[bytes]:
        buf = self._inbuf[r]
        if len(buf) < HEADER_BYTES:
            return None
        t, rd, n = _HEADER.unpack(bytes(buf[:HEADER_BYTES]))
        if t != tag or rd != round_:
            raise CommError(f"rank 0: protocol error on the averaging hub: rank {r} sent "
                            f"{t!r} for round {rd}, expected {tag!r} for round {round_} "
                            f"(ranks issued different operations)")
        if len(buf) < HEADER_BYTES + n:
            return None
        msg = bytes(buf[HEADER_BYTES:HEADER_BYTES + n])
        del buf[:HEADER_BYTES + n]
        return msg

    def _send_spokes(self, tag: bytes, round_: int, payload: bytes) -> tuple[int, int]:
        """Hub: send one message to every live spoke; returns (bytes sent, messages)."""
        frame = _HEADER.pack(tag, round_, len(payload)) + payload
        sent = msgs = 0
        for r in [r for r in self.alive if r != 0]:
            try:
                self._socks[r].sendall(frame)
                sent += len(frame)
                msgs += 1
            except OSError as exc:
                self._drop(r, round_, f"send failed: {exc}")
        return sent, msgs

    # ------------------------------------------------------------------ spoke primitives
    def _to_hub(self, tag: bytes, round_: int, payload: bytes) -> int:
        assert self._hub is not None
        frame = _HEADER.pack(tag, round_, len(payload)) + payload
        try:
            self._hub.sendall(frame)
        except OSError as exc:
            raise self._hub_error(round_, exc) from exc
        return len(frame)

    def _from_hub(self, tag: bytes, round_: int) -> bytes:
        assert self._hub is not None
        try:
            t, rd, n = _HEADER.unpack(_recv_exact(self._hub, HEADER_BYTES))
            payload = _recv_exact(self._hub, n)
        except (OSError, EOFError) as exc:
            raise self._hub_error(round_, exc) from exc
        if t != tag or rd != round_:
            raise CommError(f"rank {self.rank}: protocol error: the hub sent {t!r} for round "
                            f"{rd}, expected {tag!r} for round {round_}")
        return payload

    def _hub_error(self, round_: int, exc: BaseException) -> CommError:
        return CommError(f"rank {self.rank}: lost the averaging hub (rank 0) in round {round_}, "
                         f"epoch {self.comm.epoch}: {type(exc).__name__}: {exc}. Either rank 0 "
                         f"died or cannot be reached (the hub is a single point of failure; no "
                         f"reply within {self.spoke_timeout_s:g}s) or it dropped this rank "
                         f"after {self.timeout_s:g}s of silence")

    # ------------------------------------------------------------------ operations
    def reduce_sum(self, flat: Tensor, kind: str, bits: int = 32, exact_tail: int = 0,
                   generator: Optional[torch.Generator] = None, *,
                   carries: Optional[Traffic] = None) -> tuple[Tensor, list[int]]:
        """Sum the float32 vector ``flat`` over the live ranks; returns ``(sum, ranks that
        contributed)`` on every live rank. Ranks found dead are dropped, not waited for.

        ``bits`` < 32: every message is stochastically quantized (:func:`~.qreduce.encode_flat`,
        unbiased) but the last ``exact_tail`` values; the hub adds the decoded vectors to its
        own exact one and sends the sum quantized once, keeping the decoded copy itself, so
        every rank returns the same values."""
        if flat.dtype != torch.float32 or flat.dim() != 1:
            raise ValueError(f"reduce_sum: expected a 1-D float32 tensor, got {flat.dtype} "
                             f"with shape {tuple(flat.shape)}")
        cls = self.comm.declare(carries, "reduce_sum", kind)
        if self.world_size == 1:
            return flat, [0]
        r, t0, c0 = self.comm._begin()
        n = flat.numel()
        L = encoded_len(n, bits, exact_tail)
        if self.rank == 0:
            got = self._collect(b"RSUM", r)
            total = flat.detach().clone()
            for j in sorted(got):          # fixed order: the sum is reproducible
                msg = got[j]
                if len(msg) != L:
                    raise CommError(f"rank 0: reduce_sum payload of {len(msg)} bytes, expected "
                                    f"{L} (ranks disagree on the model size or bits)")
                total += decode_flat(msg, n, bits, exact_tail)
            payload = encode_flat(total, bits, exact_tail, generator=generator)
            if bits != 32:
                total = decode_flat(payload, n, bits, exact_tail)
            ranks = sorted([0] + list(got))
            mask = bytes(1 if j in ranks else 0 for j in range(self.world_size))
            recv = sum(HEADER_BYTES + len(m) for m in got.values())
            sent, msgs = self._send_spokes(b"RSUM", r, payload + mask)
            ranks = [j for j in ranks if j in self.alive]
            self.comm._record("ft_reduce", kind, sent, recv, msgs, 2, t0, c0, r, cls)
            return total, ranks
        sent = self._to_hub(b"RSUM", r, encode_flat(flat, bits, exact_tail, generator=generator))
        reply = self._from_hub(b"RSUM", r)
        total = decode_flat(reply[:L], n, bits, exact_tail)
        ranks = [j for j, b in enumerate(reply[L:]) if b]
        self.comm._record("ft_reduce", kind, sent, HEADER_BYTES + len(reply), 1, 2, t0, c0, r,
                          cls)
        return total, ranks

    def gather_object(self, obj: Any, kind: str, *,
                      carries: Optional[Traffic] = None) -> Optional[dict[int, Any]]:
        """Hub: ``{rank: obj}`` over the live ranks (itself included); spokes: ``None``."""
        cls = self.comm.declare(carries, "gather_object", kind)
        if self.world_size == 1:
            return {0: obj}
        r, t0, c0 = self.comm._begin()
        if self.rank == 0:
            got = self._collect(b"GOBJ", r)
            recv = sum(HEADER_BYTES + len(m) for m in got.values())
            self.comm._record("ft_gather", kind, 0, recv, 0, 1, t0, c0, r, cls)
            out = {0: obj}
            out.update({j: self._decode(m, f"the object rank {j} sent", r)
                        for j, m in got.items()})
            return dict(sorted(out.items()))
        sent = self._to_hub(b"GOBJ", r, dumps(obj, where=f"gather_object({kind})"))
        self.comm._record("ft_gather", kind, sent, 0, 1, 1, t0, c0, r, cls)
        return None

    def broadcast_object(self, obj: Any, kind: str, *,
                         carries: Optional[Traffic] = None) -> Any:
        """Every live rank gets the hub's ``obj`` (spokes pass anything, e.g. ``None``)."""
        cls = self.comm.declare(carries, "broadcast_object", kind)
        if self.world_size == 1:
            return obj
        r, t0, c0 = self.comm._begin()
        if self.rank == 0:
            sent, msgs = self._send_spokes(b"BOBJ", r,
                                           dumps(obj, where=f"broadcast_object({kind})"))
            self.comm._record("ft_broadcast", kind, sent, 0, msgs, 1, t0, c0, r, cls)
            return obj
        payload = self._from_hub(b"BOBJ", r)
        self.comm._record("ft_broadcast", kind, 0, HEADER_BYTES + len(payload), 0, 1, t0, c0, r,
                          cls)
        return self._decode(payload, "the object the hub sent", r)

    def _decode(self, payload: bytes, what: str, round_: int) -> Any:
        try:
            return loads(payload, what)
        except ValueError as exc:   # refused (not tensors / plain data): never unpickled
            raise CommError(f"rank {self.rank}: averaging hub, round {round_}: {exc}") from None


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)
