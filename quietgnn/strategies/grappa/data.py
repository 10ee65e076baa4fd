"""Grappa's local graph: chunk rotation, the chunk reload, coverage weights, block expansion.

Helper module of :mod:`quietgnn.strategies.grappa` (the leading underscore keeps it out of the
strategy registry). Everything here is either pure tensor code on one rank or the one bulk
data movement Grappa does: loading the rotating chunk at a super-epoch boundary.

Local numbering of a :class:`LocalGraph` (rank ``k``, super-epoch ``s``, rotating chunk
``j = rotating_chunk(k, P, s)``)::

    [ own chunk k (n_own) | rotating chunk j (n_rot) | leaves (n_leaf) ]
      <------------ internal: n_int = n_own + n_rot ------------>

* internal nodes carry *all* their in-edges (CSR rows ``indptr [n_loc + 1]``, ``indices``
  local column ids); leaves are the in-neighbours of internal nodes outside both chunks: their
  features are present, their rows are empty (no further expansion);
* ``gid [n_loc]`` global ids, ``x [n_loc, F]`` features, ``deg [n_loc]`` **global** in-degrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...comm import Communicator
from ...comm.traffic import Traffic
from ...nn import SparseAdj
from ...partition import LocalPartition
from ...partition.local import gather_rows
from ...rows import chunk_bounds

__all__ = ["rotating_chunk", "LocalGraph", "ChunkLoader", "coverage", "expand"]


def rotating_chunk(rank: int, world: int, super_epoch: int) -> Optional[int]:
    """Chunk held by ``rank`` besides its own in ``super_epoch``: round-robin over the other
    ``P - 1`` chunks. ``k -> k + c (mod P)`` with ``c in [1, P-1]`` is a permutation, so every
    chunk is requested by exactly one rank per super-epoch (balanced reload traffic)."""
    if world <= 1:
        return None
    return (rank + 1 + super_epoch % (world - 1)) % world


@dataclass
class LocalGraph:
    """One rank's training graph in one super-epoch (see the module docstring)."""

    gid: Tensor
    x: Tensor
    deg: Tensor
    indptr: Tensor
    indices: Tensor
    n_own: int
    n_int: int
    chunk: Optional[int]
    super_epoch: int
    #: expand's position map (all -1 between calls): one O(n_loc) array for the local graph's
    #: life, not a fresh one per minibatch
    _pos: Optional[Tensor] = field(default=None, repr=False)

    @property
    def n_loc(self) -> int:
        return int(self.gid.numel())

    def scratch(self) -> Tensor:
        if self._pos is None:
            self._pos = torch.full((self.n_loc,), -1, dtype=torch.int64)
        return self._pos

    def local_in_degree(self) -> Tensor:
        return self.indptr[1:] - self.indptr[:-1]


class ChunkLoader:
    """Loads the rotating chunk (structure + features) and the leaves' features from their
    owners. All ranks must call :meth:`load` with the same ``super_epoch`` at the same time.

    Per load, in the ``data`` phase: ``chunk_structure`` (one all-to-all: the chunk's
    ids, global degrees, halo table and row lengths as int64, its column ids as int32), ``chunk_request`` (ids asked of each owner) and
    ``chunk_features`` (the rows). The features of the rank's own halo are fetched once
    (first load) and kept, since those leaves never change; ``keep_halo=False`` (a run that
    never reaches a second super-epoch) drops them after the first load instead: a copy of
    the halo's rows the local graph already holds.
    """

    def __init__(self, comm: Communicator, part: LocalPartition, keep_halo: bool = True) -> None:
        self.comm, self.part, self.keep_halo = comm, part, keep_halo
        p = part
        #: features cross the network as float32 at least (what the peers compute in); the
        #: local graph keeps them in the part's dtype: float16 when read as stored, half the
        #: bytes of its largest node array, widened exactly where a minibatch gathers its rows
        self.dtype = torch.promote_types(part.x.dtype, torch.float32)
        # the own halo's features and their lookup (filled by the first load)
        self._halo_x: Optional[Tensor] = None
        self._halo_sorted: Optional[Tensor] = None
        self._halo_order: Optional[Tensor] = None

    # ------------------------------------------------------------------ collectives
    def _fetch_features(self, gids: Tensor, owners: Tensor) -> Tensor:
        """Rows of ``x`` for global ids ``gids`` owned by ``owners`` (two all-to-alls)."""
        P, me = self.comm.world_size, self.comm.rank
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=P).tolist()
        req = list(torch.split(gids[order], counts))
        asked = self.comm.all_to_all(req, "chunk_request", carries=Traffic.STRUCTURE)
        rows = [self.part.x[torch.searchsorted(self.part.owned, a)].to(self.dtype) if j != me
                else self.part.x[:0].to(self.dtype) for j, a in enumerate(asked)]
        got = self.comm.all_to_all(rows, "chunk_features", recv_counts=counts,
                                 carries=Traffic.FEATURES)
        out = torch.empty(gids.numel(), self.part.num_features, dtype=self.part.x.dtype)
        for where, rows_j in zip(torch.split(order, counts), got):   # no joined copy
            out[where] = rows_j.to(out.dtype)   # (exact: the rows were stored so)
        return out

    def _packed(self) -> Tensor:
        """What this rank sends when its chunk is requested: built per request, not kept (a
        second copy of the part's edges for the whole run, for one send per super-epoch). The
        local column ids travel as int32 pairs in the int64 message (they index the part's own
        rows, far below 2^31): the largest field at half the bytes."""
        p = self.part
        cols = _int32_words(p.indices)
        header = torch.tensor([p.n_own, p.n_halo, int(p.indices.numel())], dtype=torch.int64)
        return torch.cat([header, p.owned, p.in_degree, p.halo, p.halo_owner,
                          p.indptr[1:] - p.indptr[:-1], cols])

    def _exchange_structure(self, chunk: int, super_epoch: int) -> Tensor:
        P, me = self.comm.world_size, self.comm.rank
        asked = [r for r in range(P) if rotating_chunk(r, P, super_epoch) == me and r != me]
        packed = self._packed() if asked else torch.zeros(0, dtype=torch.int64)
        empty = packed[:0]
        send = [packed if r in asked else empty for r in range(P)]
        got = self.comm.all_to_all(send, "chunk_structure", carries=Traffic.STRUCTURE)
        return got[chunk]

    # ------------------------------------------------------------------ the load
    def load(self, super_epoch: int) -> LocalGraph:
        p, comm = self.part, self.comm
        P = comm.world_size
        chunk = rotating_chunk(comm.rank, P, super_epoch)
        own_ids = p.local_ids()
        if self._halo_x is None:
            self._halo_sorted, self._halo_order = torch.sort(p.halo)
            self._halo_x = self._fetch_features(p.halo, p.halo_owner) if P > 1 else \
                p.x[:0]
        if chunk is None:  # one rank: the whole graph, no leaves
            return LocalGraph(p.owned, p.x, p.in_degree[: p.n_own], p.indptr.clone(),
                              p.indices.clone(), p.n_own, p.n_own, None, super_epoch)
        buf = self._exchange_structure(chunk, super_epoch)
        n_o, n_h, e = (int(v) for v in buf[:3])
        o = 3
        # the node fields copied out, so the message (mostly edges) is freed once mapped
        j_owned = buf[o:o + n_o].clone(); o += n_o
        j_deg = buf[o:o + n_o + n_h].clone(); o += n_o + n_h
        j_halo = buf[o:o + n_h].clone(); o += n_h
        j_halo_owner = buf[o:o + n_h].clone(); o += n_h
        j_counts = buf[o:o + n_o].clone(); o += n_o
        j_cols = buf[o:].view(torch.int32)[:e]
        j_ids = torch.cat([j_owned, j_halo])

        # leaves: in-neighbours of either chunk outside both chunks (with their owners)
        cand = torch.cat([p.halo, j_halo])
        cand_owner = torch.cat([p.halo_owner, j_halo_owner])
        cand_deg = torch.cat([p.in_degree[p.n_own:], j_deg[n_o:]])
        keep = (cand_owner != comm.rank) & (cand_owner != chunk)
        leaf, first = _unique_first(cand[keep])
        leaf_owner, leaf_deg = cand_owner[keep][first], cand_deg[keep][first]

        gid = torch.cat([p.owned, j_owned, leaf])
        sorted_gid, perm = torch.sort(gid)

        def to_local(g: Tensor) -> Tensor:
            return perm[torch.searchsorted(sorted_gid, g)]

        n_int = p.n_own + n_o
        counts = torch.zeros(gid.numel(), dtype=torch.int64)
        counts[: p.n_own] = p.indptr[1:] - p.indptr[:-1]
        counts[p.n_own:n_int] = j_counts
        indptr = torch.zeros(gid.numel() + 1, dtype=torch.int64)
        indptr[1:] = counts.cumsum(0)
        # half the graph's edges at P = 4: int32 local ids, mapped a slice at a time (the
        # whole-array temporaries of the mapping would be three int64 copies of them)
        e_own = int(p.indices.numel())
        indices = torch.empty(e_own + e, dtype=torch.int32 if gid.numel() < 2 ** 31
                              else torch.int64)
        for lo in range(0, e_own, _SLICE):
            hi = min(e_own, lo + _SLICE)
            indices[lo:hi] = to_local(own_ids[p.indices[lo:hi]])
        for lo in range(0, e, _SLICE):
            hi = min(e, lo + _SLICE)
            indices[e_own + lo:e_own + hi] = to_local(j_ids[j_cols[lo:hi]])
        del buf, j_cols

        # features: own chunk held, own halo cached, the rest (chunk j, new leaves) fetched
        need = torch.cat([j_owned, leaf])
        need_owner = torch.cat([torch.full((n_o,), chunk, dtype=torch.int64), leaf_owner])
        cached = torch.isin(need, p.halo)
        # one allocation for all local rows, filled in place (not the fetched rows joined to
        # the own ones: two copies of the local graph's features at once)
        x = torch.empty(p.n_own + need.numel(), p.num_features, dtype=p.x.dtype)
        x[: p.n_own] = p.x
        x_need = x[p.n_own:]
        x_need[~cached] = self._fetch_features(need[~cached], need_owner[~cached])
        hit = self._halo_order[torch.searchsorted(self._halo_sorted, need[cached])]
        x_need[cached] = self._halo_x[hit]
        if not self.keep_halo:
            self._halo_x = self._halo_sorted = self._halo_order = None
        deg = torch.cat([p.in_degree[: p.n_own], j_deg[:n_o], leaf_deg])
        return LocalGraph(gid, x, deg, indptr, indices, p.n_own, n_int, chunk, super_epoch)


#: edges mapped per slice when building the local graph (bounds its temporaries)
_SLICE = 1 << 22


def _int32_words(t: Tensor) -> Tensor:
    """``t`` as int32, padded to an even count and viewed as int64 words (for an int64
    message; the receiver views the words back as int32 and trims)."""
    if t.numel() and int(t.max()) >= 2 ** 31:
        raise ValueError(f"a part with {int(t.max()) + 1} local rows: its column ids do not fit "
                         f"int32; use more parts")
    w = torch.zeros(t.numel() + t.numel() % 2, dtype=torch.int32)
    w[: t.numel()] = t
    return w.view(torch.int64)


def _unique_first(t: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted unique values of ``t`` and the index of one occurrence of each."""
    uniq, inv = torch.unique(t, return_inverse=True)
    first = torch.full((uniq.numel(),), -1, dtype=torch.int64)
    first.scatter_(0, inv, torch.arange(t.numel()))
    return uniq, first


# ---------------------------------------------------------------------- coverage
def coverage(lg: LocalGraph, layers: int, kind: str = "mean") -> Tensor:
    """Coverage ``w [n_loc]`` of every node's ``layers``-hop computation tree on ``lg``.

    ``r(u) = d_loc(u) / d(u)`` (1 for internal nodes, 0 for leaves with in-edges, 1 for nodes
    without any). ``a_t(v)`` is the probability that a uniform ``t+1``-step walk along in-edges
    of the *global* graph stays on edges present locally::

        a_0 = r,   a_t(v) = (1 / d(v)) * sum_{u in N_loc(v)} a_{t-1}(u)

    so ``a_t(v)`` is the fraction of the tree's level-``t+1`` edges that the local graph has.
    ``kind='mean'``: ``w = mean_{t<L} a_t`` (mean over the levels); ``kind='path'``:
    ``w = a_{L-1}`` (fraction of complete root-to-depth-L paths: the product of ``r`` along a
    path, averaged over paths). Computed on the local graph only: no communication.
    """
    d = lg.deg.to(torch.float64)
    d_loc = lg.local_in_degree().to(torch.float64)
    complete = d == 0
    a = torch.where(complete, torch.ones_like(d), d_loc / d.clamp(min=1))
    counts = lg.local_in_degree()
    # rows a slice of edges at a time: the per-edge temporaries (row ids, gathered values)
    # of all of the local graph's edges at once would be two float64/int64 copies of them
    bounds = chunk_bounds(lg.indptr, _SLICE)
    levels = [a]
    for _ in range(layers - 1):
        s = torch.zeros_like(d)
        for r0, r1 in bounds:
            e0, e1 = int(lg.indptr[r0]), int(lg.indptr[r1])
            row = torch.repeat_interleave(torch.arange(r0, r1), counts[r0:r1],
                                          output_size=e1 - e0)
            s.index_add_(0, row, a[lg.indices[e0:e1]])
        a = torch.where(complete, torch.ones_like(d), s / d.clamp(min=1))
        levels.append(a)
    if kind == "mean":
        return torch.stack(levels).mean(0).float()
    if kind == "path":
        return levels[-1].float()
    raise ValueError(f"coverage kind {kind!r}; expected 'mean' or 'path'")


# ---------------------------------------------------------------------- blocks
def expand(lg: LocalGraph, seeds: Tensor, fanouts: Sequence[Optional[int]],
           gen: Optional[torch.Generator] = None) -> tuple[Tensor, list[SparseAdj]]:
    """Message-flow blocks for ``seeds`` (local ids) over ``lg``: ``fanouts[h]`` neighbours per
    node at hop ``h`` from the seeds (``None``: all), uniformly without replacement, vectorised.

    Returns ``(input_nodes, blocks)``: ``blocks[l]`` is layer ``l``'s block (first layer
    first); each block's sources start with its destinations. GCN normalisation uses the
    global in-degree capped at the fanout (so a fully present node is normalised exactly as in
    evaluation, and a sampled one as in a graph of degree ``min(d, f)``).
    """
    try:
        return _expand(lg, seeds, fanouts, gen, lg.scratch())
    except BaseException:
        lg._pos = None    # possibly left dirty: the next call starts a fresh one
        raise


def _expand(lg: LocalGraph, nodes: Tensor, fanouts: Sequence[Optional[int]],
            gen: Optional[torch.Generator], pos: Tensor) -> tuple[Tensor, list[SparseAdj]]:
    """:func:`expand` with ``pos`` (all -1) as the position map; leaves it all -1."""
    blocks: list[SparseAdj] = []
    for f in fanouts:
        indptr, src = gather_rows(lg.indptr, lg.indices, nodes)
        src = src.long()     # the local graph's ids may be int32; a block's are int64
        counts = indptr[1:] - indptr[:-1]
        if f is not None and src.numel():
            row = torch.repeat_interleave(torch.arange(nodes.numel()), counts)
            key = row.to(torch.float64) + torch.rand(src.numel(), generator=gen,
                                                     dtype=torch.float64)
            order = torch.argsort(key)
            rank_in_row = torch.arange(src.numel()) - indptr[:-1][row]
            keep = rank_in_row < f
            src = src[order][keep]
            counts = counts.clamp(max=f)
            indptr = torch.zeros_like(indptr)
            indptr[1:] = counts.cumsum(0)
        pos[nodes] = torch.arange(nodes.numel())
        new = torch.unique(src[pos[src] < 0])
        pos[new] = nodes.numel() + torch.arange(new.numel())
        cols = pos[src]
        all_nodes = torch.cat([nodes, new])
        pos[all_nodes] = -1
        # the block's degrees gathered, then capped (not a capped copy of every local node's)
        deg = lg.deg[all_nodes] if f is None else lg.deg[all_nodes].clamp(max=f)
        blocks.insert(0, SparseAdj(indptr, cols, all_nodes.numel(), deg,
                                   deg[:nodes.numel()].clone()))
        nodes = all_nodes
    return nodes, blocks
