"""Distributed forms of the bulk sampler and the feature loader.

Tripathy, Yelick, Buluc, MLSys 2024 (arXiv 2311.02909), Section "distributed sampling"; the
design follows the reference code (PASSIONLab/CAGNET, branch distributed-sampling) except
where marked.

Two topology modes:

* **replicated** (:func:`fetch_topology` with every rank in the group): each rank receives
  the CSR rows of every node once at setup (traffic kind ``topology``, phase ``setup``) and
  samples with a plain :class:`~quietgnn.sampling.NeighborSampler` -- no communication at all
  while sampling; only features move.
* **1.5D** (:class:`Sampler15D`): ``p`` ranks in a ``(p/c) x c`` grid; rank ``r`` is replica
  ``j = r % c`` of row group ``g = r // c``. Block-row ``A_g`` (the CSR rows of the nodes the
  c ranks of group g own) is held by all c replicas of g. All replicas of a group sample the
  *same* bulk (same targets, same minibatch ids). For ``Q A`` the inner dimension is split
  over replicas: replica j handles the frontier entries whose node lies in a block ``b`` with
  ``b % c == j`` (the reference's ``p/c^2`` stages); it asks replica j of group b for exactly
  the rows it needs (sparsity-aware: ids out, rows back; kind ``sample_rows``), samples those
  rows, and the replica group sums the disjoint sparse partial results (kind
  ``sample_allreduce``). Every replica then renumbers the identical full result, so the bulk
  is bit-identical to the single-rank sampler's (counter-based RNG, tested).

Derived / simplified here (the paper body was not available):

* the ``p/c^2`` stages of one hop are issued as one all-to-all (each replica talks to at
  most ``ceil(p/c^2)`` owners), and the replica-group sparse all-reduce of disjoint partial
  products is one direct all-to-all inside the group (1 hop instead of ``log2 c``); both are
  world all-to-alls with empty blocks to non-members, so only real traffic is counted and
  the Communicator needs no sub-groups;
* features are fetched from their owners over the whole world (one all-to-all of ids, one of
  rows per bulk: :class:`FeatureFetcher`), not only within the column group;
* the 1.5D form implements uniform GraphSAGE rows; weighted rows and LADIES run in the
  replicated mode only.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ..comm import Communicator
from ..comm.rowwire import block_nnz, decode_rows, encode_rows, nnz_of_words
from ..comm.traffic import Traffic
from ..nn.sparse import BATCH_MAX_DENSITY, SparseFeatures, count_nonzero, mostly_zero
from ..partition import LocalPartition
from .bulk import Bulk, SampledBlock, expand_rows
from .renumber import Renumberer, chunk_bounds, cumsum0
from .rng import row_keys
from .sage import check_targets, sample_rows
from .topology import group_rows, owner_map, pack_rows

__all__ = ["fetch_topology", "FeatureFetcher", "Sampler15D"]


def _pack(parts: Sequence[Tensor]) -> Tensor:
    return torch.cat([p.reshape(-1).to(torch.int64) for p in parts])


def fetch_topology(comm: Communicator, part: LocalPartition, group: Sequence[int]
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Owner map and CSR rows of the nodes owned by the ranks in ``group`` (global ids).

    Returns ``(owner [N], indptr [N + 1], indices)``: rows of nodes outside the group are
    empty; ``indices`` is int32 while global ids fit (half the memory of the rank's edges, the
    largest array a sampler holds); ``owner`` is the narrowest integer type that holds the rank
    numbers (:func:`owner_map`). Cost (setup, kinds ``topology_ids`` and ``topology``):
    every rank's owned ids to every rank (N int64 in all), and its rows to the other members
    of ``group`` (a rank's own rows are read from its part, never sent to itself).
    """
    P, N = comm.world_size, part.num_nodes_global
    owned = part.owned
    recv = comm.all_to_all([owned] * P, "topology_ids", carries=Traffic.STRUCTURE)
    owner = owner_map(recv, N)
    del recv
    counts = part.indptr[1:] - part.indptr[:-1]
    me = comm.rank
    others = [j for j in group if j != me]
    # the rank's own rows never travel (they are read from the part where they are needed);
    # the other members get them packed (int64: ids, row lengths, global column ids)
    mine = pack_rows(part) if others else owned[:0]
    empty = mine[:0]
    blocks = comm.all_to_all([mine if j in others else empty for j in range(P)], "topology",
                             carries=Traffic.STRUCTURE)
    del mine
    deg = torch.zeros(N, dtype=torch.int64)
    lid = part.local_ids()
    # (row ids, row pointer into their columns, columns of an edge slice)
    rows: list[tuple[Tensor, Tensor, Any]] = []
    if me in group:
        deg[owned] = counts
        rows.append((owned, part.indptr - part.indptr[0],
                     lambda e0, e1: lid.index_select(0, part.indices[e0:e1].long())))
    for r in others:
        b = blocks[r]
        m = int(b[0])
        ids = b[1:1 + m]
        deg[ids] = b[1 + m:1 + 2 * m]
        rows.append((ids, cumsum0(b[1 + m:1 + 2 * m]),
                     lambda e0, e1, c=b[1 + 2 * m:]: c[e0:e1]))
    indptr = torch.zeros(N + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    indices = torch.empty(int(indptr[-1]), dtype=torch.int32 if N < 2 ** 31 else torch.int64)
    for ids, ptr, cols in rows:  # entries of ids' rows, row after row, land in their CSR slots
        # a slice of rows at a time: the positions of all of a rank's edges at once would be
        # several int64 temporaries of the rank's edges, the peak of a sampler's set-up
        for r0, r1 in chunk_bounds(ptr, 1 << 22):
            e0, e1 = int(ptr[r0]), int(ptr[r1])
            indices[expand_rows(indptr, ids[r0:r1])[1]] = cols(e0, e1).to(indices.dtype)
    return owner, indptr, indices


#: features fetched per round when a cache is filled (see FeatureFetcher.fill_cache)
FILL_ROUND_BYTES = 64 << 20


class FeatureFetcher:
    """Rows of node features (or any per-node tensor) fetched from their owners.

    One call = one all-to-all of requested ids (int64, with size handshake) and one of rows
    (known sizes), traffic kind ``feature_fetch``. A bulk fetches the union of its k
    minibatches' input nodes at once, so the latency is paid once per bulk.

    Cache (:meth:`fill_cache`): remote rows this rank will need most, fetched once at setup
    (kind ``data``) and kept; a call then asks the network only for rows neither owned nor
    cached. ``hits`` / ``requests`` count remote rows served from the cache / asked for.

    Mostly-zero features (bag-of-words, one-hot: every rank's part at most
    ``BATCH_MAX_DENSITY`` non-zero, agreed once at construction) are served, cached and
    returned as :class:`SparseFeatures`, never dense; a peer's block of rows crosses as
    (column, value) pairs when that is smaller (:mod:`quietgnn.comm.rowwire`), its size
    learnt by the all-to-all's handshake (8 bytes a peer). Dense features fetch as before,
    with known sizes. The construction is collective (the agreement: a 4-byte all-reduce,
    kind ``feature_form``). The cache's budget counts dense rows, so sparse ones fill less of
    it than they could.
    """

    def __init__(self, comm: Communicator, part: LocalPartition, owner: Tensor,
                 kind: str = "feature_fetch") -> None:
        # host-side throughout, as sampling is: the communicator stages its tensors to the
        # backend's device, and a strategy moves the rows it returns (``ctx.put``)
        self.comm, self.part, self.owner, self.kind = comm, part, owner, kind
        self.x = part.x
        #: rows are served, sent and cached in float32 at least: a part read as stored keeps
        #: its float16 features mapped, and only the rows read are widened
        self.dtype = torch.promote_types(part.x.dtype, torch.float32)
        self.row_bytes = int(self.x.shape[1]) * self.dtype.itemsize
        x = part.x
        sparse = x.dim() == 2 and x.is_floating_point() and \
            count_nonzero(x) <= BATCH_MAX_DENSITY * x.numel()
        every = torch.tensor([int(sparse)], dtype=torch.int32)
        comm.all_reduce(every, "feature_form", "min", carries=Traffic.CONTROL)
        #: the part's rows as float32 SparseFeatures when every rank's are mostly zero (built
        #: only then: a rank outvoted keeps its rows as they are)
        self.xs: Optional[SparseFeatures] = \
            mostly_zero(x, BATCH_MAX_DENSITY) if int(every[0]) else None
        self.cache_ids = torch.zeros(0, dtype=torch.int64)       # sorted global ids
        self.cache_x: Tensor | SparseFeatures = self._empty(0)
        self.hits = self.requests = 0

    def _empty(self, n: int) -> Tensor | SparseFeatures:
        F = int(self.x.shape[1])
        if self.xs is None:
            return torch.empty(n, F, dtype=self.dtype)
        return SparseFeatures(torch.zeros(n + 1, dtype=torch.int64),
                              torch.zeros(0, dtype=torch.int64),
                              torch.zeros(0, dtype=torch.float32), F)

    def fill_cache(self, candidates: Optional[Tensor], priority: Tensor, max_rows: int) -> None:
        """Keep the ``max_rows`` remote ``candidates`` (global ids; None: every node, with
        ``priority`` indexed by global id) of highest ``priority`` (one value per candidate;
        ties broken by id). Collective: every rank calls it with the same ``max_rows``.

        The rows arrive in rounds of at most :data:`FILL_ROUND_BYTES` of features, the same
        number of rounds on every rank: a cache of a few hundred MiB fetched in one piece
        would hold its requests, the served rows and the received rows at once."""
        if candidates is None:
            ids = self._top_remote(priority, max_rows)
        else:
            mask = self.owner[candidates] != self.comm.rank
            cand, pri = candidates[mask], priority[mask]
            del mask
            if cand.numel() > max_rows:
                order = torch.argsort(pri, descending=True, stable=True)
                cand = cand[order[:max_rows]]
            del pri
            ids = torch.sort(cand).values
        per = max(1, FILL_ROUND_BYTES // max(1, self.row_bytes))
        n_rounds = max(1, -(-int(max_rows) // per))
        if self.xs is None:    # dense rows straight into their place: no second copy
            self.cache_x = torch.empty(ids.numel(), self.x.shape[1], dtype=self.dtype)
            for r in range(n_rounds):
                self.cache_x[r * per:(r + 1) * per] = self._remote(ids[r * per:(r + 1) * per],
                                                                   "data")
        else:
            self.cache_x = SparseFeatures.cat([self._remote(ids[r * per:(r + 1) * per], "data")
                                               for r in range(n_rounds)])
        self.cache_ids = ids

    def _top_remote(self, priority: Tensor, max_rows: int) -> Tensor:
        """Sorted ids of the ``max_rows`` remote nodes of highest ``priority`` (indexed by global
        id; ties to the lower id): the first ``max_rows`` of a stable descending sort, found a
        slice of ids at a time. One key per node, ``(max - priority) * N + id``, orders them
        as that sort does; the smallest keys seen so far are kept. Sorting all remote nodes at
        once would make three O(N) temporaries (their ids, priorities and the order)."""
        N = self.owner.numel()
        if not N:
            return torch.zeros(0, dtype=torch.int64)
        top = int(priority.max())
        if (top - int(priority.min()) + 1) * N >= 2 ** 63:
            raise ValueError("FeatureFetcher: priorities too large to key by id; cap them")
        best = torch.zeros(0, dtype=torch.int64)
        step = 1 << 22
        for lo in range(0, N, step):
            remote = torch.nonzero(self.owner[lo:lo + step] != self.comm.rank).flatten()
            key = (top - priority[lo:lo + step].index_select(0, remote).long()) * N + remote + lo
            best = torch.cat([best, key])
            if best.numel() > max_rows:
                best = torch.topk(best, max_rows, largest=False, sorted=False).values
        return torch.sort(best % N).values

    def _remote(self, ids: Tensor, kind: str) -> Tensor | SparseFeatures:
        """Rows of ``ids`` (unique, global, not owned here) from their owners."""
        P = self.comm.world_size
        own = self.owner[ids].long()
        order = torch.argsort(own, stable=True)
        counts = torch.bincount(own, minlength=P).tolist()
        req = list(torch.split(ids[order], counts))
        got = self.comm.all_to_all(req, kind + "_ids" if kind == self.kind else kind,
                                   carries=Traffic.STRUCTURE)
        if self.xs is not None:
            return self._remote_sparse(got, counts, order, kind)
        rows = [self._own_rows(g) for g in got]
        back = self.comm.all_to_all(rows, kind, recv_counts=counts, carries=Traffic.FEATURES)
        out = torch.empty(ids.numel(), self.x.shape[1], dtype=self.dtype)
        out[order] = torch.cat(back)
        return out

    def _remote_sparse(self, asked: list[Tensor], counts: list[int], order: Tensor,
                       kind: str) -> SparseFeatures:
        """The asked rows as words, sparse where smaller; each block's form read off its size."""
        F = int(self.x.shape[1])
        send = []
        for a in asked:
            block = self._own_rows(a)
            send.append(encode_rows(block, block_nnz(block)))
        words = self.comm.all_to_all(send, kind, carries=Traffic.FEATURES)
        got = SparseFeatures.cat([decode_rows(w, n, nnz_of_words(n, w.numel(), F), F, True)
                                  for w, n in zip(words, counts)])
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel())
        return got.rows(back)          # in the order of the ids asked for

    def _own_rows(self, ids: Tensor) -> Tensor | SparseFeatures:
        """Rows of owned global ``ids`` (sorted owned ids: no id map), widened to ``dtype``
        (sparse ones when the features are)."""
        at = torch.searchsorted(self.part.owned, ids)
        return self.x[at].to(self.dtype) if self.xs is None else self.xs.rows(at)

    def fetch(self, ids: Tensor) -> Tensor | SparseFeatures:
        """``x[ids]`` for global ``ids`` (any order, duplicates allowed) -> ``[len(ids), F]``
        (:class:`SparseFeatures` when the features are mostly zero)."""
        uniq, inv = torch.unique(ids, return_inverse=True)
        mine = self.owner[uniq] == self.comm.rank
        remote = torch.nonzero(~mine).flatten()
        rid = uniq[remote]
        pos = torch.searchsorted(self.cache_ids, rid).clamp_(max=max(self.cache_ids.numel() - 1,
                                                                     0))
        hit = self.cache_ids[pos] == rid if self.cache_ids.numel() else \
            torch.zeros(rid.numel(), dtype=torch.bool)
        self.hits += int(hit.sum())
        self.requests += int(rid.numel())
        # every rank joins the exchange, even with nothing missing (it is collective)
        fetched = self._remote(rid[~hit], self.kind)
        if self.xs is not None:    # the three sources stacked, then read in ``ids``' order
            at = torch.cat([torch.nonzero(mine).flatten(), remote[hit], remote[~hit]])
            stacked = SparseFeatures.cat([self._own_rows(uniq[mine]),
                                          self.cache_x.rows(pos[hit]), fetched])
            row_of = torch.empty_like(at)
            row_of[at] = torch.arange(at.numel())
            return stacked.rows(row_of[inv])
        out = torch.empty(uniq.numel(), self.x.shape[1], dtype=self.dtype)
        out[mine] = self._own_rows(uniq[mine])
        out[remote[hit]] = self.cache_x[pos[hit]]
        out[remote[~hit]] = fetched
        return out[inv]


class Sampler15D:
    """Uniform GraphSAGE bulk sampler with the topology split over a ``(p/c) x c`` grid (see
    the module docstring). Call :meth:`sample` on every rank at the same time, with the same
    arguments on all replicas of a group (different groups sample different bulks)."""

    def __init__(self, comm: Communicator, part: LocalPartition, fanouts: Sequence[int],
                 c: int, seed: int = 0) -> None:
        P = comm.world_size
        if c < 1 or P % c:
            raise ValueError(f"replication c = {c} must divide the number of ranks P = {P}")
        self.comm, self.c, self.P = comm, int(c), P
        self.g, self.j = comm.rank // c, comm.rank % c
        self.fanouts = [int(f) for f in fanouts]
        self.seed = int(seed)
        members = list(range(self.g * c, self.g * c + c))
        self.members = members
        # the group's rows by sorted global id (topology.py: no O(N) pointer, and with c = 1
        # the part's own arrays, not a copy)
        self.owner, self.rows = group_rows(comm, part, members)
        # row group (block-row) of every node; one group per rank: the owner map itself
        self.block = self.owner if c == 1 else self.owner // c
        self.num_nodes = part.num_nodes_global
        self.renumber = Renumberer()   # scratch for the dense renumbering (indices only)

    def __repr__(self) -> str:
        return (f"Sampler15D(grid={self.P // self.c}x{self.c}, group={self.g}, replica={self.j}, "
                f"fanouts={self.fanouts})")

    def _rows(self, need: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """CSR rows of ``need`` (sorted unique global ids of blocks this replica handles):
        local ones read directly, the others requested from replica j of their group.
        Returns ``(starts, deg, local, fetched)``: a local row (``local`` true) lives at
        ``starts`` in the group's columns (``self.rows``), a fetched one in ``fetched`` (int64
        global ids of the fetched rows, joined)."""
        P, c = self.P, self.c
        blk = self.block.index_select(0, need).long()
        local = blk == self.g
        remote = need[~local]
        dest = blk[~local] * c + self.j              # replica j of the owning group
        order = torch.argsort(dest, stable=True)     # requests grouped by destination rank
        counts = torch.bincount(dest, minlength=P).tolist()
        got = self.comm.all_to_all(list(torch.split(remote[order], counts)), "sample_rows_ids",
                                   carries=Traffic.STRUCTURE)
        replies = []
        for ids in got:
            n, pos = self.rows.entries(ids)
            replies.append(_pack([n, self.rows.to_global(self.rows.cols.index_select(0, pos))]))
        back = self.comm.all_to_all(replies, "sample_rows", carries=Traffic.STRUCTURE)
        deg = torch.empty(need.numel(), dtype=torch.int64)
        starts = torch.empty(need.numel(), dtype=torch.int64)
        starts[local], deg[local] = self.rows.locate(need[local])
        base = 0
        pieces = []
        rem_deg, rem_start = [], []
        for m, b in zip(counts, back):
            d = b[:m]
            rem_deg.append(d)
            rem_start.append(base + torch.cumsum(d, 0) - d)
            pieces.append(b[m:])
            base += int(b.numel() - m)
        # replies arrive grouped by destination rank: restore the order of `remote`
        rd, rs = torch.empty_like(remote), torch.empty_like(remote)
        rd[order], rs[order] = torch.cat(rem_deg), torch.cat(rem_start)
        deg[~local], starts[~local] = rd, rs
        return starts, deg, local, torch.cat(pieces) if pieces else need[:0]

    def _sample(self, need: Tensor, where: Tensor, s: int, keys: Tensor
                ) -> tuple[Tensor, Tensor]:
        """``sample_rows`` over the rows ``need[where]``, each row read where it lives: local
        rows from the group's columns (never copied), fetched ones from their message. Rows are
        sampled independently (per-row keys), so sampling the two sets apart and interleaving
        them back in row order gives what one call on a joined column array gave."""
        starts, deg, local, fetched = self._rows(need)
        starts, deg, at_home = (t.index_select(0, where) for t in (starts, deg, local))
        cnt = torch.empty(where.numel(), dtype=torch.int64)
        parts = []
        for sel, cols in ((torch.nonzero(at_home).flatten(), self.rows.cols),
                          (torch.nonzero(~at_home).flatten(), fetched)):
            c, src = sample_rows(starts.index_select(0, sel), deg.index_select(0, sel), s,
                                 keys.index_select(0, sel), cols)
            cnt[sel] = c
            parts.append((sel, self.rows.to_global(src) if cols is self.rows.cols else src))
        ptr = cumsum0(cnt)
        src_all = torch.empty(int(ptr[-1]), dtype=torch.int64)
        for sel, src in parts:
            src_all[expand_rows(ptr, sel)[1]] = src
        return cnt, src_all

    def sample(self, targets: Tensor, offsets: Tensor, batch_ids: Tensor) -> Bulk:
        check_targets(targets, offsets, batch_ids, self.num_nodes)
        nodes, offs = targets, offsets
        depth = torch.zeros_like(targets)
        levels, level_offs, depths, blocks = [nodes], [offs], [depth], []
        for h, s in enumerate(self.fanouts):
            R = nodes.numel()
            mb_row = torch.repeat_interleave(torch.arange(offs.numel() - 1), offs[1:] - offs[:-1],
                                             output_size=R)
            mine = torch.nonzero(self.block.index_select(0, nodes) % self.c == self.j).flatten()
            mine_nodes = nodes.index_select(0, mine)
            need, where = torch.unique(mine_nodes, return_inverse=True)
            keys = row_keys(self.seed, batch_ids, h, mb_row.index_select(0, mine), mine_nodes)
            cnt, src = self._sample(need, where, s, keys)
            counts, src_all = self._allreduce(R, mine, cnt, src)
            indptr = cumsum0(counts)
            nodes, offs, depth, col = self.renumber.extend(nodes, offs, depth,
                                                         indptr.index_select(0, offs), src_all,
                                                         self.num_nodes, h)
            blocks.append(SampledBlock(indptr, col))
            levels.append(nodes)
            level_offs.append(offs)
            depths.append(depth)
        return Bulk(batch_ids, levels, level_offs, depths, blocks)

    def _allreduce(self, R: int, mine: Tensor, cnt: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
        """Sum of the replicas' disjoint sparse partial results: per-row counts and sources of
        all R rows, in row order."""
        if self.c == 1:
            return cnt, src
        msg = _pack([torch.tensor([mine.numel()]), mine, cnt, src])
        got = self.comm.all_to_all([msg if r in self.members and r != self.comm.rank
                                    else msg[:0] for r in range(self.P)], "sample_allreduce",
                                   carries=Traffic.STRUCTURE)
        got[self.comm.rank] = msg
        rows_l, cnt_l, src_l = [], [], []
        for r in self.members:
            b = got[r]
            m = int(b[0])
            rows_l.append(b[1:1 + m])
            cnt_l.append(b[1 + m:1 + 2 * m])
            src_l.append(b[1 + 2 * m:])
        rows, cnts, srcs = torch.cat(rows_l), torch.cat(cnt_l), torch.cat(src_l)
        counts = torch.zeros(R, dtype=torch.int64)
        counts[rows] = cnts
        if int(counts.sum()) != srcs.numel() or rows.numel() != R:
            raise RuntimeError("1.5D sampler: replica partial results do not cover every "
                               "frontier row exactly once (replicas sampled different bulks?)")
        ptr = torch.zeros(R + 1, dtype=torch.int64)
        torch.cumsum(cnts, 0, out=ptr[1:])     # pieces in received order
        order = torch.empty(R, dtype=torch.int64)
        order[rows] = torch.arange(R)            # received index of frontier row r
        _, pos = expand_rows(ptr, order)
        return counts, srcs.index_select(0, pos)
