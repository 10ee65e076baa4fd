"""The communicator: the only module that calls ``torch.distributed``.

Every collective goes through :class:`Communicator`, which records one :class:`OpRecord` per
call: operation, traffic kind (``halo_fwd``, ``grad_allreduce``, ...), phase (``train``,
``eval``, ``setup``, ``data``, ``control``), bytes sent and received by this rank, messages, the
number of sequential latency steps ("hops"), wall and CPU seconds, and the round number. Because
all ranks issue the same collectives in the same order, round ``r`` on one rank is round ``r``
on every rank: the projection (``quietgnn.analysis.projection``) lines rounds up across ranks and
charges each round with its slowest rank.

Byte accounting (payload only; what a real network would carry at minimum):

* ``all_to_all``: bytes of the blocks sent to / received from *other* ranks; one hop. When
  the receiver does not know the block sizes, a size handshake (P int64) is counted too.
* ``all_reduce``: bandwidth-optimal reduce-scatter + all-gather (Rabenseifner): each rank
  sends and receives ``2 (P-1)/P * nbytes`` in ``2 ceil(log2 P)`` hops.
* ``broadcast``: binomial tree: a rank sends ``nbytes`` to each of its children and the
  non-roots receive ``nbytes`` once; ``ceil(log2 P)`` hops.
* ``all_gather_object``: the objects travel as JSON or a weights-only torch archive
  (:func:`quietgnn.serial.dumps`, never a pickle): an int64 length to each of the P-1 peers,
  then every rank's buffer padded to the longest, ``(P-1) (8 + max len)`` bytes each way.

Rendezvous. Outside torchrun, rank 0 creates the TCPStore itself on a socket bound to
``MASTER_ADDR`` only (not every interface), and when that address is loopback gloo's own
sockets are kept on the loopback interface too (``GLOO_SOCKET_IFNAME``).

Residency. Every op takes ``carries=`` (a :class:`~quietgnn.comm.traffic.Traffic` class); under
``residency`` (``runtime.residency``, set by the worker) an op carrying a forbidden class raises
:class:`~quietgnn.comm.traffic.ResidencyError` before anything is sent, and
``sent_by_class`` totals this rank's bytes sent per class over the whole run.

Failure handling. The process group is created with a finite timeout, so a collective waiting
on a dead or stuck peer raises after ``timeout_s`` at the latest (a crashed peer usually makes
gloo raise at once). Errors are re-raised as :class:`CommError` naming this rank, the
operation, the traffic kind, the round and the epoch. ``QUIETGNN_FAULT`` injects faults for
tests (see :class:`~quietgnn.comm.faults.Fault`).
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..serial import dumps, loads
from .duplex import direction_groups, post_pairs
from .faults import Fault
from .liveness import Liveness, watch
from .rendezvous import confirmed, join
from .traffic import Traffic, check_traffic

__all__ = ["Communicator", "CommError", "OpRecord", "PendingExchange", "Traffic"]

#: train: per-step training traffic; eval: evaluation; setup: one-off start-up; data: bulk data
#: movement during training that is not per-step traffic (e.g. Grappa's chunk reloads);
#: control: run bookkeeping (summaries), never reported as traffic.
PHASES = ("train", "eval", "setup", "data", "control")


class CommError(RuntimeError):
    """A collective failed (peer died, timed out, or bad arguments)."""


@dataclass
class OpRecord:
    round: int
    op: str
    kind: str
    phase: str
    epoch: int
    bytes_sent: int
    bytes_recv: int
    messages: int
    hops: int
    seconds: float
    cpu_seconds: float
    carries: str = Traffic.UNDECLARED.value   # what the payload is (comm/traffic.py)
    #: an exchange started with :meth:`Communicator.all_to_all_async` and waited for later:
    #: the CPU seconds the caller computed while it was in flight (what a network's transfer
    #: time can hide behind); None for an op waited for at once
    overlap_cpu_s: Optional[float] = None
    #: such an exchange's wall seconds spent starting it and waiting for it (``seconds`` spans
    #: its whole flight, the caller's compute meanwhile included); None: ``seconds``
    blocked_s: Optional[float] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class PendingExchange:
    """An all-to-all in flight; :meth:`wait` returns the received blocks (and records the op)."""

    def __init__(self, comm: "Communicator", work: Any, recv_flat: Tensor, recv_counts: list[int],
                 row_shape: tuple[int, ...], finish: Any,
                 home: tuple[torch.device, Tensor | None] | None = None) -> None:
        self._comm, self._work, self._flat = comm, work, recv_flat
        self._counts, self._row_shape, self._finish = recv_counts, row_shape, finish
        self._home = home   # (device, out) a staged exchange's result goes back to
        self._result: list[Tensor] | None = None

    def wait(self) -> list[Tensor]:
        if self._result is None:
            self.wait_cpu0, self.wait_wall0 = time.thread_time(), time.perf_counter()
            if self._work is not None:
                work = self._work
                self._comm._guard(lambda: work.wait(), "all_to_all.wait",
                                  getattr(self, "kind", ""))
            self._finish(self)
            flat = self._flat
            if self._home is not None:
                device, out = self._home
                flat = out.view(-1).copy_(flat) if out is not None else flat.to(device)
            self._result = _split_rows(flat, self._counts, self._row_shape)
            # The work handle keeps gloo's send and receive buffers alive; let them go now
            # rather than when the exchange object is collected.
            self._work = self._finish = None
        return self._result


def _one_buffer(blocks: Sequence[Tensor]) -> Tensor | None:
    """A flat view spanning ``blocks`` when they are contiguous, consecutive views of one
    storage (e.g. ``torch.split`` of a contiguous tensor), else None (the caller copies)."""
    first = blocks[0]
    storage = first.untyped_storage()
    offset = first.storage_offset()
    for b in blocks:
        if not b.is_contiguous() or b.untyped_storage().data_ptr() != storage.data_ptr() or \
                b.storage_offset() != offset:
            return None
        offset += b.numel()
    total = offset - first.storage_offset()
    if offset * first.element_size() > storage.nbytes():
        # blocks of separate storages that only look consecutive (an empty block's pointer
        # equals the next block's, e.g. torch.from_numpy of np.split views)
        return None
    return first.new_empty(0).set_(storage, first.storage_offset(), (total,), (1,))


def _split_rows(flat: Tensor, counts: Sequence[int], row_shape: tuple[int, ...]) -> list[Tensor]:
    rows = flat.view(-1, *row_shape) if row_shape else flat
    return list(torch.split(rows, list(counts), dim=0))


def _connector(world_size: int, prefix: str | None, multi_tenant: bool) -> Any:
    """Makes another client of the group's store (MASTER_ADDR:MASTER_PORT, the key space
    ``prefix``) with a given timeout: the heartbeat's own connection (comm/liveness.py)."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    def connect(timeout: timedelta) -> Any:
        client = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout,
                               multi_tenant=multi_tenant)
        return dist.PrefixStore(prefix, client) if prefix else client
    return connect


class Communicator:
    """Counted, time-limited collectives for one rank (see the module docstring)."""

    def __init__(self, rank: int = 0, world_size: int = 1, *, timeout_s: float = 120.0,
                 device: torch.device | str = "cpu", backend: str = "gloo") -> None:
        self.rank, self.world_size = rank, world_size
        self.timeout_s = float(timeout_s)
        self.device = torch.device(device)
        self.backend = backend
        #: where the backend takes tensors: the device under NCCL; host memory under gloo,
        #: which has no all-to-all of CUDA tensors (a device tensor is staged through it; the
        #: records count the payload either way, so they do not depend on the staging)
        self.wire = self.device if backend == "nccl" else torch.device("cpu")
        self.records: list[OpRecord] = []
        self.round = 0
        self.epoch = -1
        self._phase = "setup"
        self._fault = Fault.from_env()
        self._poison = False   # set by the "nan" fault; consumed by take_poison()
        self.residency = "none"
        #: bytes sent by this rank per traffic class, every op of the run (never drained)
        self.sent_by_class: dict[str, int] = {}
        #: host labels and heartbeat (set by :meth:`init` on a multi-process group)
        self.liveness: Liveness | None = None
        #: every rank proved the run's secret at the join (rendezvous.prove_peers)
        self.authenticated = False
        #: (lower -> higher rank, higher -> lower rank) gloo groups, set by split_duplex
        self._duplex: tuple[Any, Any] | None = None

    # ------------------------------------------------------------------ life cycle
    @classmethod
    def init(cls, rank: int, world_size: int, *, backend: str = "gloo", timeout_s: float = 120.0,
             device: torch.device | str = "cpu", init_method: str = "env://") -> "Communicator":
        """Join the process group (``env://``: MASTER_ADDR/MASTER_PORT as set by our launcher
        or by torchrun). World size 1 needs no process group."""
        if world_size > 1 and not dist.is_initialized():
            if init_method == "env://":
                j = join(rank, world_size, backend, timeout_s, CommError)
                comm = cls(rank, world_size, timeout_s=timeout_s, device=device, backend=backend)
                comm.authenticated = confirmed(comm, j.challenge)
                comm.liveness = watch(comm, j.store, _connector(world_size, j.prefix, j.own))
                return comm
            dist.init_process_group(backend=backend, init_method=init_method, rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=timeout_s))
        return cls(rank, world_size, timeout_s=timeout_s, device=device, backend=backend)

    def split_duplex(self, mode: str = "auto") -> bool:
        """Send the all-to-all's payloads point to point over two more gloo groups, one per
        direction (:mod:`.duplex`). ``mode``: 'on', 'off', or 'auto' (on when the ranks span
        hosts). Collective: every rank calls it after :meth:`init`. Returns whether it is on."""
        if self._duplex is None:
            self._duplex = direction_groups(self, mode)
        return self._duplex is not None

    def close(self) -> None:
        if self.liveness is not None:
            self.liveness.stop()
        if self.world_size > 1 and dist.is_initialized():
            for g in self._duplex or ():
                dist.destroy_process_group(g)
            self._duplex = None   # no group object left for the interpreter's exit to destroy
            dist.destroy_process_group()

    # ------------------------------------------------------------------ bookkeeping
    @property
    def phase_name(self) -> str:
        return self._phase

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label all traffic inside the block (one of :data:`PHASES`)."""
        if name not in PHASES:
            raise ValueError(f"unknown traffic phase {name!r}; expected one of {PHASES}")
        old, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = old

    def take_records(self) -> list[OpRecord]:
        """Records since the last call (the trainer drains them once per epoch)."""
        out, self.records = self.records, []
        return out

    def _record(self, op: str, kind: str, sent: int, recv: int, messages: int, hops: int,
                t0: float, c0: float, round_: int, carries: Traffic = Traffic.UNDECLARED,
                overlap_cpu_s: Optional[float] = None,
                blocked_s: Optional[float] = None) -> None:
        c = Traffic(carries).value
        self.sent_by_class[c] = self.sent_by_class.get(c, 0) + int(sent)
        self.records.append(OpRecord(round=round_, op=op, kind=kind, phase=self._phase,
                                     epoch=self.epoch, bytes_sent=int(sent), bytes_recv=int(recv),
                                     messages=int(messages), hops=int(hops),
                                     seconds=time.perf_counter() - t0,
                                     cpu_seconds=time.thread_time() - c0, carries=c,
                                     overlap_cpu_s=overlap_cpu_s, blocked_s=blocked_s))

    def declare(self, carries: Traffic | str | None, op: str, kind: str) -> Traffic:
        """The class an op carries, checked against ``residency`` before it sends (every rank
        alike: the decision depends on the level and the class only)."""
        return check_traffic(self.residency, carries, rank=self.rank, op=op, kind=kind)

    def _begin(self) -> tuple[int, float, float]:
        r = self.round
        self.round += 1
        if self._fault is not None and self._fault.fire(self.rank, r, self.epoch):
            self._poison = True
        return r, time.perf_counter(), time.thread_time()

    def take_poison(self) -> bool:
        """True once after a ``nan`` fault fired on this rank (fault injection for tests)."""
        out, self._poison = self._poison, False
        return out

    def _guard(self, fn: Any, what: str, kind: str = "") -> Any:
        try:
            return fn()
        except CommError:
            raise
        except Exception as exc:
            raise CommError(
                f"rank {self.rank}: {what} ({kind or 'n/a'}, round {self.round - 1}, epoch "
                f"{self.epoch}) failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}. "
                f"A peer rank probably died or is stuck (timeout {self.timeout_s:g}s)."
                f"{self.liveness.diagnose() if self.liveness is not None else ''}") from exc

    def _check(self, t: Tensor, what: str) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, t: Tensor, kind: str, op: str = "sum", *,
                   carries: Traffic | str | None = None) -> Tensor:
        """In-place all-reduce (``sum``, ``max``, ``min``); returns ``t``."""
        self._check(t, "all_reduce")
        cls = self.declare(carries, "all_reduce", kind)
        if self.world_size == 1:
            return t
        r, t0, c0 = self._begin()
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        w = t.to(self.wire)   # t itself where the backend takes it
        self._guard(lambda: dist.all_reduce(w, op=red), "all_reduce", kind)
        if w is not t:
            t.copy_(w)
        P = self.world_size
        vol = 2 * (P - 1) * _nbytes(t) // P
        steps = 2 * math.ceil(math.log2(P))
        self._record("all_reduce", kind, vol, vol, steps, steps, t0, c0, r, cls)
        return t

    def broadcast(self, t: Tensor, src: int, kind: str, *,
                  carries: Traffic | str | None = None) -> Tensor:
        """In-place broadcast from ``src``; returns ``t``."""
        self._check(t, "broadcast")
        cls = self.declare(carries, "broadcast", kind)
        if self.world_size == 1:
            return t
        r, t0, c0 = self._begin()
        w = t.to(self.wire)
        self._guard(lambda: dist.broadcast(w, src=src), "broadcast", kind)
        if w is not t:
            t.copy_(w)
        P, rel = self.world_size, (self.rank - src) % self.world_size
        children = sum(1 for k in range(max(1, math.ceil(math.log2(P))))
                       if rel < 2 ** k and rel + 2 ** k < P)
        n = _nbytes(t)
        self._record("broadcast", kind, n * children, 0 if rel == 0 else n, children,
                     math.ceil(math.log2(P)), t0, c0, r, cls)
        return t

    def all_to_all(self, send: Sequence[Tensor], kind: str,
                   recv_counts: Sequence[int] | None = None,
                   out: Tensor | Callable[[int], Tensor] | None = None, *,
                   carries: Traffic | str | None = None) -> list[Tensor]:
        """Variable-size all-to-all of row blocks: ``send[j]`` (``[n_j, *row]``) goes to rank j;
        returns the P blocks received (``recv[j]`` from rank j). All blocks share dtype and row
        shape. Pass ``recv_counts`` (rows expected from each peer) when known, which saves the
        size handshake.

        Large exchanges can avoid two copies: blocks that are consecutive views of one
        contiguous buffer (``torch.split`` of it) are sent without concatenating them, and
        ``out`` (a contiguous tensor of ``sum(recv_counts)`` rows, ``recv_counts`` required)
        receives in place; the returned blocks are then views of ``out``. ``out`` may also be
        a function of the total rows that returns that tensor, called once the sizes are
        known (e.g. to receive a message of unknown size into a memory-mapped file)."""
        # blocking: the caller cannot touch its blocks while they are in flight, so they may
        # be sent without a copy
        return self.all_to_all_async(send, kind, recv_counts, out=out, carries=carries,
                                     _blocking=True).wait()

    def all_to_all_async(self, send: Sequence[Tensor], kind: str,
                         recv_counts: Sequence[int] | None = None,
                         out: Tensor | Callable[[int], Tensor] | None = None, *,
                         carries: Traffic | str | None = None,
                         _blocking: bool = False) -> PendingExchange:
        """Start an all-to-all and return at once (compute while it flies); see
        :meth:`all_to_all`. The op is recorded when :meth:`PendingExchange.wait` returns.
        The send blocks are copied (the caller may reuse them at once); ``out`` must not be
        touched before the wait."""
        P = self.world_size
        cls = self.declare(carries, "all_to_all", kind)
        if len(send) != P:
            raise ValueError(f"all_to_all: got {len(send)} send blocks, expected one per rank "
                             f"({P})")
        row_shape = tuple(send[0].shape[1:])
        dtype = send[0].dtype
        for j, s in enumerate(send):
            self._check(s, "all_to_all")
            if s.dtype != dtype or tuple(s.shape[1:]) != row_shape:
                raise ValueError(f"all_to_all: block {j} has dtype {s.dtype} row shape "
                                 f"{tuple(s.shape[1:])}, expected {dtype} {row_shape}")
        if P == 1:
            flat = send[0].reshape(-1)
            if callable(out):
                out = out(int(send[0].shape[0]))
            if out is not None:
                flat = out.view(-1).copy_(flat)
            return PendingExchange(self, None, flat, [send[0].shape[0]], row_shape,
                                   lambda pending: None)
        r, t0, c0 = self._begin()
        send_counts = [int(s.shape[0]) for s in send]
        extra = 0
        if recv_counts is None:
            sc = torch.tensor(send_counts, dtype=torch.int64, device=self.wire)
            rc = torch.empty(P, dtype=torch.int64, device=self.wire)
            self._guard(lambda: dist.all_to_all_single(rc, sc), "all_to_all.sizes", kind)
            recv_counts = rc.tolist()
            extra = 8 * (P - 1)
        recv_counts = [int(c) for c in recv_counts]
        if callable(out):
            out = out(sum(recv_counts))
        row_numel = math.prod(row_shape) if row_shape else 1
        home: tuple[torch.device, Tensor | None] | None = None
        if send[0].device != self.wire:   # staged: the blocks over, the result back at wait
            home = (send[0].device, out)
            send = [s.to(self.wire) for s in send]
        flat_send = _one_buffer(send) if _blocking else None
        if flat_send is None:
            flat_send = torch.cat([s.reshape(-1) for s in send]) if any(send_counts) else \
                send[0].new_empty(0)
        if out is not None:
            if not out.is_contiguous() or out.dtype != dtype or \
                    out.numel() != sum(recv_counts) * row_numel:
                raise ValueError(f"all_to_all: out has shape {tuple(out.shape)} dtype "
                                 f"{out.dtype}, expected a contiguous {dtype} tensor of "
                                 f"{sum(recv_counts)} rows of shape {row_shape}")
            flat_recv = out.view(-1)
        if out is None or home is not None:
            flat_recv = send[0].new_empty(sum(recv_counts) * row_numel)
        recv_n, send_n = [c * row_numel for c in recv_counts], [c * row_numel for c in send_counts]
        if self._duplex is not None:
            work = self._guard(lambda: post_pairs(self._duplex, self.rank, flat_recv, flat_send,
                                                  recv_n, send_n, self.timeout_s),
                               "all_to_all", kind)
        else:
            work = self._guard(lambda: dist.all_to_all_single(
                flat_recv, flat_send, recv_n, send_n, async_op=True), "all_to_all", kind)
        esize = send[0].element_size() * row_numel
        sent = sum(c for j, c in enumerate(send_counts) if j != self.rank) * esize + extra
        recv = sum(c for j, c in enumerate(recv_counts) if j != self.rank) * esize + extra
        msgs = sum(1 for j in range(P) if j != self.rank and send_counts[j] > 0)

        start_cpu, start_wall = time.thread_time() - c0, time.perf_counter() - t0

        def finish(pending: PendingExchange) -> None:
            # CPU seconds of the op: starting it plus waiting for it, not what the caller
            # computed while it was in flight (that is compute, and an overlapping strategy
            # would otherwise have it subtracted from its compute time); seconds: in flight.
            # ``pending`` is passed in, not captured: a closure over it would make a reference
            # cycle (exchange -> finish -> exchange) that kept every exchange's buffers alive
            # until the garbage collector happened to run - hundreds of MB per epoch at 10^7
            # edges.
            overlap = None if _blocking else max(0.0, pending.wait_cpu0 - c0 - start_cpu)
            blocked = None if _blocking else \
                start_wall + time.perf_counter() - pending.wait_wall0
            self._record("all_to_all", kind, sent, recv, msgs, 2 if extra else 1, t0,
                         pending.wait_cpu0 - start_cpu, r, cls, overlap, blocked)

        pending = PendingExchange(self, work, flat_recv, recv_counts, row_shape, finish, home)
        pending.kind = kind   # named in the error if the wait fails
        return pending

    def all_gather_object(self, obj: Any, kind: str = "control", *,
                          carries: Traffic | str | None = None) -> list[Any]:
        """Gather a small object (tensors and plain data, see :mod:`quietgnn.serial`) from
        every rank (metadata, summaries). Not ``dist.all_gather_object``: that unpickles
        whatever a peer sends. Every rank gets the decoded objects, its own included."""
        cls = self.declare(carries, "all_gather_object", kind)
        if self.world_size == 1:
            return [obj]
        data = dumps(obj, where=f"all_gather_object({kind})")   # TypeError before any traffic
        P = self.world_size
        r, t0, c0 = self._begin()
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.wire)
        sizes = [torch.empty_like(size) for _ in range(P)]
        self._guard(lambda: dist.all_gather(sizes, size), "all_gather_object.sizes", kind)
        lens = [int(x) for x in sizes]
        longest = max(lens)
        buf = torch.zeros(longest, dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        buf = buf.to(self.wire)
        bufs = [torch.empty_like(buf) for _ in range(P)]
        self._guard(lambda: dist.all_gather(bufs, buf), "all_gather_object", kind)
        vol = (P - 1) * (8 + longest)
        self._record("all_gather_object", kind, vol, vol, 2 * (P - 1), 2, t0, c0, r, cls)
        out = []
        for j in range(P):
            raw = bufs[j][:lens[j]].cpu().numpy().tobytes()
            try:
                out.append(loads(raw, what=f"the object rank {j} sent"))
            except ValueError as exc:
                raise CommError(f"rank {self.rank}: all_gather_object ({kind}, round {r}): "
                                f"{exc}") from None
        return out

    def barrier(self, kind: str = "barrier") -> None:
        """Carries nothing but the wait: always control."""
        if self.world_size == 1:
            return
        r, t0, c0 = self._begin()
        # A tiny all-reduce instead of dist.barrier(): it honours the group timeout on every
        # backend and its cost is accounted like any other op.
        flag = torch.zeros(1, device=self.wire)
        self._guard(lambda: dist.all_reduce(flag), "barrier", kind)
        self._record("barrier", kind, 0, 0, 0, 2 * math.ceil(math.log2(self.world_size)), t0, c0, r,
                     Traffic.CONTROL)
