"""Whether the parts of a run agree on what crosses between them: a set-up check on every rank.

A part is checked on its own when it is read (:func:`~quietgnn.partition.shards.
check_part_arrays`: ids and plans in range, counts that add up). What only two parts together
show is whether they agree: rank ``i`` sends peer ``j`` the rows ``owned_i[send_idx_i[j]]``, in
that order, and ``j`` files them as the nodes its halo lists as ``i``'s
(``halo_j[recv_offsets_j[i]:recv_offsets_j[i + 1]]``, which the reader checked to be the
nodes ``halo_owner_j`` gives to ``i``). A halo that names other nodes of the same peer, the
counts unchanged (a part edited with its checksums updated, or one from another book), meets
every per-part check and gloo's size checks, and trains on the wrong rows without a word:
the halo exchanges fill its rows from the peer's plan, and the strategies that fetch rows by
global id (``grappa``, ``minibatch``, ``tma``) read the halo's ids, which then name nodes
the graph does not connect. The halo rows' global degrees (the GCN norm reads them; the
reader checks only the owned rows' against the edges) must be the owner's too.

How: each rank hashes, for every peer, the ids (and, apart, the degrees) it sends in its plan's
order, and the ones its halo expects from that peer in its receive order; one all-to-all
(:data:`DIGEST_BYTES` to each peer, kind ``plan_check``) hands each peer the digests of what
it will receive, and one small gather (``[]`` from every rank when all agree) gives every rank
every disagreement, so all reach the same verdict and raise the same ``ValueError`` together:
none is left waiting in a collective. Counted as ``control``: a digest of a list that the
receiving peer holds itself reveals no node's data, so it crosses under every residency level.
Cost: one pass over the send plans and the halo, and
``(P - 1) (DIGEST_BYTES + 8 + 3)`` bytes sent per rank.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import numpy as np
import torch

from .local import LocalPartition

__all__ = ["check_plans", "plan_digests", "DIGEST_BYTES", "KIND"]

#: the traffic kind of the check's two collectives
KIND = "plan_check"
#: per peer: 16 bytes of blake2b over the ids, 16 over the degrees (an accidental or edited
#: disagreement is missed with probability 2**-128)
DIGEST_BYTES = 32
#: ids gathered and hashed per slice (bounds the temporaries for a part of 10^8 sent rows)
_SLICE = 1 << 22


def _hash(pieces: Iterator[np.ndarray]) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES // 2, person=b"quietgnn-plan")
    for a in pieces:
        # little-endian int64 whatever the host: two hosts of another byte order still agree
        h.update(np.ascontiguousarray(a, dtype="<i8"))
    return h.digest()


def _slices(n: int) -> Iterator[slice]:
    return (slice(a, min(n, a + _SLICE)) for a in range(0, n, _SLICE))


def plan_digests(part: LocalPartition) -> tuple[np.ndarray, np.ndarray]:
    """(``sends``, ``expects``), uint8 ``[P, DIGEST_BYTES]``: row ``j`` of ``sends`` hashes the
    global ids, then the in- and out-degrees, of the rows this rank sends peer ``j`` (in the
    plan's order); row ``j`` of ``expects``, those its halo lists as ``j``'s (in the order it
    receives them). Two parts agree when ``sends_i[j] == expects_j[i]``."""
    P = part.num_parts
    owned = part.owned.cpu().numpy()
    deg = [part.in_degree.cpu().numpy(), part.out_degree.cpu().numpy()]
    halo, n_own = part.halo.cpu().numpy(), part.n_own
    offs = [int(o) for o in part.recv_offsets]
    sends = np.zeros((P, DIGEST_BYTES), dtype=np.uint8)
    expects = np.zeros((P, DIGEST_BYTES), dtype=np.uint8)
    for j in range(P):
        idx = part.send_idx[j].cpu().numpy()
        rows = [idx[s] for s in _slices(idx.size)]
        sends[j] = np.frombuffer(
            _hash(owned[r] for r in rows) + _hash(d[r] for d in deg for r in rows), np.uint8)
        a, b = offs[j], offs[j + 1]
        cut = [slice(a + s.start, a + s.stop) for s in _slices(b - a)]
        expects[j] = np.frombuffer(
            _hash(halo[c] for c in cut)
            + _hash(d[n_own + c.start:n_own + c.stop] for d in deg for c in cut), np.uint8)
    return sends, expects


def check_plans(comm: Any, part: LocalPartition) -> None:
    """Raise the same ``ValueError`` on every rank when two parts disagree on the rows that
    cross between them (see the module docstring); collective: every rank calls it once, at
    set-up, before a strategy exchanges anything. Nothing to check on one rank."""
    P, me = comm.world_size, comm.rank
    if P == 1:
        return
    sends, expects = plan_digests(part)
    blocks = [torch.from_numpy(sends[j:j + 1] if j != me else sends[:0]) for j in range(P)]
    got = comm.all_to_all(blocks, KIND, recv_counts=[int(j != me) for j in range(P)],
                          carries="control")
    half = DIGEST_BYTES // 2
    bad = []
    for i in range(P):
        if i != me:
            theirs = got[i].numpy().reshape(-1)
            if not np.array_equal(theirs[:half], expects[i, :half]):
                bad.append([i, "ids"])
            elif not np.array_equal(theirs[half:], expects[i, half:]):
                bad.append([i, "degrees"])
    # every rank learns every disagreement, so all raise alike (or none does)
    everyone = comm.all_gather_object(bad, KIND, carries="control")
    found = [(int(i), j, str(what)) for j, mine in enumerate(everyone) for i, what in mine]
    if found:
        raise ValueError(_verdict(found))


def _verdict(found: list[tuple[int, int, str]]) -> str:
    """One line naming the first disagreement (sender ``i``, receiver ``j``), the files and
    the fix; the same on every rank (it is made from the gathered list only)."""
    i, j, what = found[0]
    if what == "ids":
        first = (f"part {j}'s halo (part-{j}/halo.npy, halo_owner.npy) lists other nodes as "
                 f"part {i}'s than part {i}'s send plan to it (part-{i}/send_idx.npy) names")
    else:
        first = (f"part {j}'s degrees of its halo nodes from part {i} (part-{j}/in_degree.npy, "
                 f"out_degree.npy) differ from part {i}'s own (part-{i}/in_degree.npy, "
                 f"out_degree.npy)")
    more = f" (and {len(found) - 1} more pair(s) of parts)" if len(found) > 1 else ""
    return (f"the parts of this run disagree: {first}{more}; a part was edited (its checksums "
            f"updated) or comes from another book, and training would silently use the wrong "
            f"rows: re-create the book with `quietgnn prepare`")
