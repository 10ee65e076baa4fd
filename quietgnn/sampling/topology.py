"""The rows a 1.5D replica group holds (:class:`~quietgnn.sampling.dist.Sampler15D`), in
memory that grows with the group's rows and edges, never with the whole graph.

Why not a global CSR: an ``indptr`` indexed by global id is ``8 (N + 1)`` bytes on every rank,
and a column array of global ids a copy of the rank's edges. Here the rows are addressed by
``searchsorted`` on their sorted global ids, and with one rank per group (``c = 1``) the rows
*are* the rank's part: its ``owned`` ids, ``indptr`` and ``indices`` as loaded (memory-mapped
when read from a prepared directory), the local column ids translated to global ones only for
the entries sampled (:meth:`GroupRows.to_global`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..comm import Communicator
from ..comm.traffic import Traffic
from ..partition import LocalPartition
from ..rows import chunk_bounds, cumsum0

__all__ = ["owner_map", "GroupRows", "group_rows", "pack_rows"]


def owner_map(owned_by_rank: Sequence[Tensor], num_nodes: int) -> Tensor:
    """``owner [N]``: the rank owning every global id, from every rank's owned ids. An O(N)
    array on every rank, so in the narrowest signed type that holds the ranks (int8 up to 127
    ranks: an eighth of int64's bytes); whoever computes with its entries widens the few it
    gathered."""
    P = len(owned_by_rank)
    dtype = torch.int8 if P < 2 ** 7 else torch.int16 if P < 2 ** 15 else torch.int32
    owner = torch.full((num_nodes,), -1, dtype=dtype)
    for r, ids in enumerate(owned_by_rank):
        owner[ids] = r
    if bool((owner < 0).any()):
        raise ValueError("owner map: some nodes are owned by no rank; the partition book "
                         "does not cover the graph")
    return owner


def pack_rows(part: LocalPartition) -> Tensor:
    """This rank's rows as one int64 message: ``[m, owned ids, row lengths, global columns]``."""
    counts = part.indptr[1:] - part.indptr[:-1]
    cols = part.local_ids()[part.indices]
    return torch.cat([torch.tensor([part.n_own]), part.owned, counts, cols]).to(torch.int64)


@dataclass
class GroupRows:
    """CSR rows of the group's nodes: row ``k`` is node ``ids[k]`` (ascending global ids), its
    entries ``cols[ptr[k]:ptr[k + 1]]``; ``lid`` translates ``cols`` to global ids (None: they
    are global already)."""

    ids: Tensor
    ptr: Tensor
    cols: Tensor
    lid: Optional[Tensor]

    def locate(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """(start in ``cols``, length) of the rows of global ``nodes`` (all in the group)."""
        k = torch.searchsorted(self.ids, nodes)
        start = self.ptr.index_select(0, k)
        return start, self.ptr.index_select(0, k + 1) - start

    def entries(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """(row lengths, positions in ``cols`` of every entry, row after row) of ``nodes``."""
        start, n = self.locate(nodes)
        ptr = cumsum0(n)
        total = int(ptr[-1])
        return n, torch.arange(total) + torch.repeat_interleave(start - ptr[:-1], n,
                                                                output_size=total)

    def to_global(self, cols: Tensor) -> Tensor:
        """Entries read from ``cols`` as int64 global ids."""
        return (cols if self.lid is None else self.lid.index_select(0, cols.long())).long()


def group_rows(comm: Communicator, part: LocalPartition, group: Sequence[int]
               ) -> tuple[Tensor, GroupRows]:
    """Owner map and the rows of the nodes owned by the ranks in ``group`` (collective).

    Traffic as :func:`~quietgnn.sampling.dist.fetch_topology`'s (kinds ``topology_ids``,
    ``topology``): every rank's owned ids to every rank, and its rows to the other members.
    """
    P, N = comm.world_size, part.num_nodes_global
    recv = comm.all_to_all([part.owned] * P, "topology_ids", carries=Traffic.STRUCTURE)
    owner = owner_map(recv, N)
    del recv
    me = comm.rank
    others = [j for j in group if j != me]
    mine = pack_rows(part) if others else part.owned[:0]
    empty = mine[:0]
    blocks = comm.all_to_all([mine if j in others else empty for j in range(P)], "topology",
                             carries=Traffic.STRUCTURE)
    del mine
    # local row -> global id, int32 while ids fit: the one O(part nodes) copy a group keeps
    lid = part.local_ids()
    if N < 2 ** 31:
        lid = lid.to(torch.int32)
    if me in group and not others:
        # one rank per group: its part's rows, not copied (owned ids are ascending)
        return owner, GroupRows(part.owned, part.indptr, part.indices, lid)
    # several members: one CSR of all their rows, columns as global ids (int32 while they fit)
    sources: list[tuple[Tensor, Tensor, Tensor, bool]] = []   # (ids, row ptr, columns, local?)
    if me in group:
        sources.append((part.owned, part.indptr - part.indptr[0], part.indices, True))
    for r in others:
        b = blocks[r]
        m = int(b[0])
        sources.append((b[1:1 + m], cumsum0(b[1 + m:1 + 2 * m]), b[1 + 2 * m:], False))
    ids = torch.sort(torch.cat([s[0] for s in sources])).values
    deg = torch.zeros(ids.numel(), dtype=torch.int64)
    for rows, ptr, _, _ in sources:
        deg[torch.searchsorted(ids, rows)] = ptr[1:] - ptr[:-1]
    gptr = cumsum0(deg)
    del deg
    cols = torch.empty(int(gptr[-1]), dtype=torch.int32 if N < 2 ** 31 else torch.int64)
    for rows, ptr, src, local in sources:
        # a slice of rows at a time: the positions of all of a rank's edges at once would be
        # several int64 temporaries of the rank's edges
        for r0, r1 in chunk_bounds(ptr, 1 << 22):
            e0, e1 = int(ptr[r0]), int(ptr[r1])
            k = torch.searchsorted(ids, rows[r0:r1])
            start = gptr.index_select(0, k)
            n = ptr[r0 + 1:r1 + 1] - ptr[r0:r1]
            pos = torch.arange(e1 - e0) + torch.repeat_interleave(start - (ptr[r0:r1] - e0), n,
                                                                  output_size=e1 - e0)
            piece = src[e0:e1]
            cols[pos] = (lid.index_select(0, piece.long()) if local else piece).to(cols.dtype)
    return owner, GroupRows(ids, gptr, cols, None)
