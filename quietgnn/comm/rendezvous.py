"""Rendezvous of the process group: the TCPStore bound to ``MASTER_ADDR`` only, gloo kept on
the loopback interface when every rank is on this host, and every rank proving the run's
secret before any data moves (see :class:`Communicator.init`)."""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch.distributed as dist

from ..serial import loads_json

__all__ = ["AuthError", "SECRET_ENV", "Joined", "join", "prove_peers", "confirm_links",
           "confirmed"]

#: the run's shared secret: the local launcher draws one per run; under torchrun set the same
#: value on every host (e.g. ``export QUIETGNN_SECRET=$(openssl rand -hex 32)``)
SECRET_ENV = "QUIETGNN_SECRET"
#: the shortest secret accepted (characters)
MIN_SECRET = 16


class AuthError(RuntimeError):
    """A rank of the process group did not prove the run's secret."""


#: the longest timeout a run may give (``runtime.timeout_s``, tma's ``fail_timeout_s``): torch's
#: store and gloo take it in milliseconds, and somewhere above 1e9 s it overflows (1e10 failed
#: at once, 'waited ... and gave up'; 1e300 was an OverflowError in every worker); 1e7 s,
#: about 115 days, is far within
MAX_TIMEOUT_S = 1e7


def _resolve(addr: str) -> tuple[int, str]:
    """(address family, numeric address) of ``addr``; ValueError when it does not resolve."""
    try:
        fam, _, _, _, sa = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, IndexError) as exc:
        raise ValueError(f"MASTER_ADDR = {addr!r} does not resolve ({exc}); set it to the "
                         f"address of rank 0's host") from None
    return fam, str(sa[0])


def _tcp_store(addr: str, port: int, world_size: int, is_master: bool, timeout: Any,
               multi_tenant: bool = False) -> Any:
    """The rendezvous store. Rank 0 listens on ``addr`` only: torch's own TCPStore server
    would listen on every interface, exposing an unauthenticated key-value store (which
    every rank trusts) to the whole network although the workers may all be on 127.0.0.1."""
    if not is_master:
        return dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout,
                             multi_tenant=multi_tenant)
    fam, ip = _resolve(addr)
    sock = socket.socket(fam, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ip, port))
        sock.listen(max(world_size, 128))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"MASTER_ADDR = {addr!r} ({ip}) is not an address of this host, "
                             f"but rank 0 runs here and must listen on it; set MASTER_ADDR to "
                             f"rank 0's address") from None
        raise ValueError(f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = {ip}:{port} "
                         f"({exc.strerror or exc}); pick a free MASTER_PORT") from None
    # the store takes the descriptor over (and closes it when it shuts down)
    return dist.TCPStore(addr, port, world_size, is_master=True, timeout=timeout,
                         multi_tenant=multi_tenant, master_listen_fd=sock.detach())


def _gloo_on_loopback(addr: str) -> None:
    """All ranks on this host (MASTER_ADDR loopback): keep gloo's pair sockets on the loopback
    interface. Gloo otherwise listens on the address the host name resolves to (often a LAN
    address). An explicit GLOO_SOCKET_IFNAME wins."""
    if "GLOO_SOCKET_IFNAME" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        if not ipaddress.ip_address(_resolve(addr)[1]).is_loopback:
            return
    except ValueError:
        return
    for name in sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []:
        try:
            flags = int(open(f"/sys/class/net/{name}/flags").read(), 16)
        except (OSError, ValueError):
            continue
        if flags & 0x8:   # IFF_LOOPBACK
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _generation(store: Any, world_size: int) -> int:
    """Which start of the worker group this process belongs to, the same on every rank.

    Not ``TORCHELASTIC_RESTART_COUNT``: with several agents (hosts) only the agent whose worker
    failed counts a restart; the others restart their workers for the new rendezvous round
    with their count unchanged, so the ranks of one round would disagree and half of them
    would read the dead round's keys. Every worker of every round adds 1 to one counter in
    the agents' shared store before anything else, so round ``g`` holds the values
    ``g*W+1 .. (g+1)*W``. (A worker stopped before it reaches this line would shift the
    count; the group then fails its rendezvous within the timeout instead of hanging.)"""
    n = int(store.add("quietgnn/worker-starts", 1))
    return (n - 1) // max(1, world_size)


@contextmanager
def _joining(rank: int, world_size: int, timeout_s: float, error: type[Exception],
             gloo: bool = False) -> Iterator[None]:
    """Joining the process group: torch's failure to reach the store (nobody listens at
    MASTER_ADDR:MASTER_PORT) or to see every rank arrive within the timeout, or (``gloo``)
    gloo's failure to connect the ranks to each other, becomes one line saying which, where,
    and what to check (torch says it in a C++ backtrace), raised as ``error`` (the
    communicator's CommError)."""
    try:
        yield
    except AuthError:
        raise
    except (RuntimeError, OSError) as exc:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        first = next((x.strip() for x in str(exc).splitlines() if x.strip()),
                     type(exc).__name__)
        if gloo:
            raise error(f"rank {rank}: gloo could not connect the ranks to each other "
                        f"({first[:160]}); every host must reach the others on gloo's ports "
                        f"(a firewall?), over the interface GLOO_SOCKET_IFNAME names (unset: "
                        f"the address the host name resolves to)") from None
        who = (f"rank 0 waited for the other {world_size - 1} rank(s) at {where}"
               if rank == 0 else f"rank {rank} could not join rank 0's store at {where}")
        raise error(f"{who} for {timeout_s:g} s and gave up ({first[:160]}); start every "
                    f"rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, rank 0 "
                    f"reachable from the others (or raise --runtime.timeout_s)") from None


def prove_peers(store: Any, rank: int, world_size: int, secret: str | None) -> Optional[bytes]:
    """Every rank proves to every other that it holds the run's ``secret`` before the process
    group is formed: each posts a fresh nonce in the rendezvous store, then ``HMAC-SHA256``
    of all the nonces and its rank; each checks every proof. A process that took a rank's
    place in the store (a stray job on the same port, a stranger) cannot answer, and every
    rank stops with :class:`AuthError` naming it before any gloo connection or data. Ranks
    without a secret post none: all without, the group is unauthenticated (returns None);
    some without, refused. Returns the challenge (every rank's nonce), which
    :func:`confirm_links` binds to the group's own connections once it has formed. Store
    traffic, like torch's own rendezvous: not data, not counted.
    Not a defence against whoever can read and relay the traffic itself: gloo is not
    encrypted (see the security model)."""
    if secret is not None and len(secret) < MIN_SECRET:
        raise ValueError(f"{SECRET_ENV} is {len(secret)} character(s) long; expected at least "
                         f"{MIN_SECRET} (the store shows every proof: a short secret can be "
                         f"guessed offline); make one with: openssl rand -hex 32")
    if world_size == 1:
        return b"" if secret is not None else None
    key = (secret or "").encode()
    me = {"nonce": secrets.token_hex(16), "secret": bool(secret)}
    store.set(f"auth/nonce/{rank}", json.dumps(me))
    # this rank's own entry is what it posted, not what the store says now (a stranger could
    # overwrite it: "no secret here" would otherwise turn the check off)
    posted = [me if r == rank else _posted(store, f"auth/nonce/{r}", r)
              for r in range(world_size)]
    odd = [r for r, v in enumerate(posted) if not (isinstance(v, dict) and isinstance(
        v.get("nonce"), str) and re.fullmatch(r"[0-9a-f]{32}", v["nonce"]))]
    if odd:
        raise AuthError(f"rank(s) {odd} answered the join with something other than a nonce: "
                        f"not quietgnn ranks of this run; check MASTER_ADDR/MASTER_PORT")
    without = [r for r, v in enumerate(posted) if v.get("secret") is not True]
    if secret is None and len(without) == world_size:
        return None
    if without:
        # a rank holding a secret never goes on unauthenticated, whatever the store claims
        raise AuthError(f"rank(s) {without} have no {SECRET_ENV} but rank(s) "
                        f"{[r for r in range(world_size) if r not in without]} have one: set "
                        f"the same {SECRET_ENV} on every host of the run")
    challenge = "|".join(v["nonce"] for v in posted).encode()
    store.set(f"auth/proof/{rank}", json.dumps(_mac(key, b"peer", rank, challenge)))
    proofs = [_posted(store, f"auth/proof/{r}", r) for r in range(world_size)]
    bad = _unproven(proofs, key, b"peer", challenge)
    if bad:
        raise AuthError(f"rank(s) {bad} did not prove the run's secret ({SECRET_ENV}): a "
                        f"process that is not this run's joined in their place, or their host "
                        f"has another {SECRET_ENV}; nothing was sent to them")
    return challenge


def confirm_links(comm: Any, secret: str, challenge: bytes) -> None:
    """Once the process group has formed: every rank sends every other, over the group's own
    connections (one gather, kind ``peer_auth``, counted), an HMAC of the join's challenge
    and its rank under a key of its own purpose. The proofs in the store show that each rank
    knows the secret; this shows that the process at the other end of each connection does
    (gloo found its peers' addresses in the same unauthenticated store: one swapped there
    after the proofs would otherwise receive a rank's data). A relay that passes the bytes
    on unchanged is not caught: only encryption would."""
    key = secret.encode()
    got = comm.all_gather_object(_mac(key, b"link", comm.rank, challenge), "peer_auth",
                                 carries="control")
    bad = _unproven(got, key, b"link", challenge)
    if bad:
        raise AuthError(f"the process connected as rank(s) {bad} does not hold the run's secret "
                        f"({SECRET_ENV}), though rank(s) {bad} proved it at the join: their "
                        f"address in the rendezvous store was replaced; stopped before any data")


def _mac(key: bytes, purpose: bytes, rank: int, challenge: bytes) -> str:
    """Rank ``rank``'s proof for ``purpose`` (the store's ``peer``, the connections' ``link``:
    one never passes for the other)."""
    return hmac.new(key, b"quietgnn-%s|%d|" % (purpose, rank) + challenge,
                    hashlib.sha256).hexdigest()


def _unproven(proofs: list[Any], key: bytes, purpose: bytes, challenge: bytes) -> list[int]:
    """The ranks whose proof (``proofs[r]``, as received) is not theirs; compared in constant
    time."""
    return [r for r, p in enumerate(proofs)
            if not (isinstance(p, str) and hmac.compare_digest(p, _mac(key, purpose, r,
                                                                        challenge)))]


def _posted(store: Any, name: str, rank: int) -> Any:
    """The JSON value rank ``rank`` posted under ``name`` (waiting for it: the store's
    timeout); None where it is not JSON."""
    try:
        store.wait([name])
    except RuntimeError:
        raise AuthError(f"rank {rank} did not answer the join ({name}) within the timeout: "
                        f"a process that is not a quietgnn rank of this run holds its place, "
                        f"or it stopped; check MASTER_ADDR/MASTER_PORT") from None
    try:
        return loads_json(store.get(name))
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass
class Joined:
    """What :func:`join` leaves: the store the ranks met in (the liveness watch uses it), its
    key prefix (a torchrun group's generation), whether the ranks run their own store (not
    the torchrun agent's), and the join's challenge (None: not authenticated)."""

    store: Any
    prefix: Optional[str]
    own: bool
    challenge: Optional[bytes]


def join(rank: int, world_size: int, backend: str, timeout_s: float,
         error: type[Exception]) -> Joined:
    """Join the process group from the environment (``MASTER_ADDR``/``MASTER_PORT``, as the
    launcher or torchrun set them): the store, the ranks' proofs (:func:`prove_peers`),
    then gloo's connections; a failure is one line (:func:`_joining`, as ``error``).

    Under torchrun the store keeps one port across restarts: the keys the previous attempt
    left behind (e.g. a dead rank's gloo address) could be read before they are overwritten,
    failing the restart with "connection refused". A key space per start of the group
    (:func:`_generation`, one every agent agrees on) avoids that."""
    timeout = timedelta(seconds=timeout_s)
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    secret = os.environ.get(SECRET_ENV) or None
    torchrun = os.environ.get("TORCHELASTIC_RESTART_COUNT") is not None
    agent = torchrun and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if backend == "gloo":
        _gloo_on_loopback(addr)
    with _joining(rank, world_size, timeout_s, error):
        if torchrun:
            base = _tcp_store(addr, port, world_size, not agent and rank == 0, timeout,
                              multi_tenant=not agent)
            prefix: Optional[str] = f"quietgnn/generation-{_generation(base, world_size)}"
            store = dist.PrefixStore(prefix, base)
            challenge = prove_peers(store, rank, world_size, secret)
        else:
            prefix = None
            store = _tcp_store(addr, port, world_size, rank == 0, timeout)
            challenge = prove_peers(dist.PrefixStore("quietgnn", store), rank, world_size,
                                    secret)
    with _joining(rank, world_size, timeout_s, error, gloo=True):
        dist.init_process_group(backend=backend, store=store, rank=rank,
                                world_size=world_size, timeout=timeout)
    return Joined(store, prefix, torchrun and not agent, challenge)


def confirmed(comm: Any, challenge: Optional[bytes]) -> bool:
    """Whether the ranks authenticated each other, their connections confirmed
    (:func:`confirm_links`) where they did."""
    if challenge is None:
        return False
    if comm.world_size > 1:
        confirm_links(comm, os.environ[SECRET_ENV], challenge)
    return True
