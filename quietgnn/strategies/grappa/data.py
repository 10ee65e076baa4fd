"""Grappa's local graph: its two pieces of rows, coverage weights, block expansion.

Helper module of :mod:`quietgnn.strategies.grappa` (the chunk reload that builds a
:class:`LocalGraph` is in :mod:`.loader`). Everything here is pure tensor code on one rank.

Local numbering of a :class:`LocalGraph` (rank ``k``, super-epoch ``s``, rotating chunk
``j = rotating_chunk(k, P, s)``)::

    [ own chunk k (n_own) | rotating chunk j (n_rot) | leaves (n_leaf) ]
      <------------ internal: n_int = n_own + n_rot ------------>

own chunk in the part's order (``part.owned``), chunk ``j`` in its part's order, leaves by
global id. Internal nodes carry *all* their in-edges; leaves are the in-neighbours of
internal nodes outside both chunks: their features are present, their rows are empty (no
further expansion).

The rows are never renumbered into one local CSR (at P = 4 that copy holds half the graph's
edges): each chunk keeps its rows as its part stores them (:class:`Rows`, columns in the
part's ``[owned | halo]`` numbering) and translates a column to a local id when a row is read.
The own chunk's rows and features are the part's own arrays (memory-mapped when the part is
read as stored); the rotating chunk's are what its owner sent (see :mod:`.loader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...nn import SparseAdj, SparseFeatures
from ...nn.sparse import count_nonzero
from ...partition.local import gather_rows
from ...partition.shards import advise_access
from ...rows import chunk_bounds
from ...sampling.sage import sample_rows

__all__ = ["rotating_chunk", "Rows", "LocalGraph", "coverage", "expand"]


def rotating_chunk(rank: int, world: int, super_epoch: int) -> Optional[int]:
    """Chunk held by ``rank`` besides its own in ``super_epoch``: round-robin over the other
    ``P - 1`` chunks. ``k -> k + c (mod P)`` with ``c in [1, P-1]`` is a permutation, so every
    chunk is requested by exactly one rank per super-epoch (balanced reload traffic)."""
    if world <= 1:
        return None
    return (rank + 1 + super_epoch % (world - 1)) % world


@dataclass
class Rows:
    """CSR rows of one chunk in its part's column numbering ``[owned | halo]``: column ``c``
    is local id ``base + c`` when ``c < n_direct`` (the chunk's own nodes, numbered locally in
    the part's order from ``base``) and ``table[c - n_direct]`` otherwise (a halo node)."""

    indptr: Tensor      # int64 [n_rows + 1]
    cols: Tensor        # int32 or int64 [nnz], the part's numbering
    n_direct: int
    base: int
    table: Tensor       # int32 [n_halo]: local id of each halo column

    @property
    def n_rows(self) -> int:
        return int(self.indptr.numel()) - 1

    def counts(self) -> Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def local(self, c: Tensor) -> Tensor:
        """Local ids (int64) of part columns ``c``."""
        c = c.long()
        far = c >= self.n_direct
        out = c + self.base
        out[far] = self.table[c[far] - self.n_direct].long()
        return out


@dataclass
class LocalGraph:
    """One rank's training graph in one super-epoch (see the module docstring): the own
    chunk's rows (local rows ``0..n_own-1``), the rotating chunk's (``n_own..n_int-1``; None
    on one rank), features in two pieces (``x_own [n_own, F]``, ``x_rest [n_loc - n_own, F]``)
    and ``deg [n_loc]``, the **global** in-degrees."""

    own: Rows
    rot: Optional[Rows]
    x_own: Tensor | SparseFeatures     # the loader's choice: sparse when mostly zero
    x_rest: Tensor | SparseFeatures
    deg: Tensor
    n_own: int
    n_int: int
    chunk: Optional[int]
    super_epoch: int
    #: expand's position map (all -1 between calls): one O(n_loc) array for the local graph's
    #: life, not a fresh one per minibatch; int32, since local ids fit (a block's are int64)
    _pos: Optional[Tensor] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.n_loc >= 2 ** 31:
            raise ValueError(f"a local graph of {self.n_loc} nodes: its ids do not fit int32; "
                             f"use more parts")

    @property
    def n_loc(self) -> int:
        return self.n_own + int(self.x_rest.shape[0])

    def scratch(self) -> Tensor:
        if self._pos is None:
            self._pos = torch.full((self.n_loc,), -1, dtype=torch.int32)
        return self._pos

    def pieces(self) -> list[Rows]:
        return [self.own] if self.rot is None else [self.own, self.rot]

    def local_in_degree(self) -> Tensor:
        d = torch.zeros(self.n_loc, dtype=torch.int64)
        for r in self.pieces():
            d[r.base:r.base + r.n_rows] = r.counts()
        return d

    def gather(self, nodes: Tensor, fanout: Optional[int] = None,
               gen: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
        """CSR rows of local nodes ``nodes`` (in order, each row in its stored edge order):
        ``(indptr int64 [len + 1], src int64 local ids)``; a leaf's row is empty. With
        ``fanout``, a row longer than it keeps ``fanout`` of its edges, uniformly without
        replacement and in draw order (:func:`quietgnn.sampling.sage.sample_rows`, keys
        drawn from ``gen``), and only those are read: a hub's row costs ``fanout`` reads, not
        its degree (whole rows read and shuffled made a step's cost the sampled nodes' degree
        sum, which a power-law graph's hubs dominate)."""
        counts = torch.zeros(nodes.numel(), dtype=torch.int64)
        got = []
        for r in self.pieces():
            mine = (nodes >= r.base) & (nodes < r.base + r.n_rows)
            rows = nodes[mine] - r.base
            if fanout is None:
                ptr, cols = gather_rows(r.indptr, r.cols, rows)
                counts[mine] = ptr[1:] - ptr[:-1]
            else:
                lo = r.indptr[rows]
                keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (rows.numel(),), generator=gen)
                counts[mine], cols = sample_rows(lo, r.indptr[rows + 1] - lo, fanout, keys,
                                                 r.cols)
            got.append((mine, cols, r))
        indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
        indptr[1:] = counts.cumsum(0)
        total = int(indptr[-1])
        for mine, cols, r in got:
            if cols.numel() == total:     # all rows from this piece (e.g. a batch of seeds)
                return indptr, r.local(cols)
        src = torch.empty(total, dtype=torch.int64)
        for mine, cols, r in got:     # a piece's edges keep their order among the output's
            src[torch.repeat_interleave(mine, counts, output_size=total)] = r.local(cols)
        return indptr, src

    def advise(self, random: bool) -> None:
        """Read-around off (``random``) or back on for the local graph's mapped arrays: off
        while steps sample scattered rows, on while the coverage or a reload scans them
        (:func:`quietgnn.partition.shards.advise_access`)."""
        arrays = [x for x in (self.x_own, self.x_rest) if isinstance(x, Tensor)]
        for r in self.pieces():
            arrays += [r.indptr, r.cols, r.table]
        advise_access(arrays, random)

    def rows(self, nodes: Tensor) -> Tensor:
        """Feature rows of local nodes ``nodes`` (the stored dtype), dense."""
        sp = self.features(1.0) if isinstance(self.x_own, SparseFeatures) else None
        if sp is not None:
            return sp.rows(nodes).to_dense()
        out = torch.empty(nodes.numel(), self.x_own.shape[1], dtype=self.x_own.dtype)
        own = nodes < self.n_own
        out[own] = self.x_own[nodes[own]]
        out[~own] = self.x_rest[nodes[~own] - self.n_own].to(out.dtype)
        return out

    def features(self, max_density: float) -> Optional[SparseFeatures]:
        """All local rows as :class:`SparseFeatures` when at most ``max_density`` of them is
        non-zero (built a piece at a time), else None: read dense rows with :meth:`rows`."""
        pieces = [self.x_own, self.x_rest]
        if all(isinstance(x, SparseFeatures) for x in pieces):   # the loader kept them sparse
            return SparseFeatures.cat(pieces)
        numel = sum(int(x.numel()) for x in pieces)
        if numel == 0:
            return None
        if sum(count_nonzero(x) for x in pieces) / numel > max_density:
            return None
        return SparseFeatures.cat([SparseFeatures.from_dense(x.to(self.x_own.dtype))
                                   for x in pieces])


#: edges read per slice in :func:`coverage` (bounds its per-edge temporaries)
_SLICE = 1 << 20


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
    # O(n_loc) float64 arrays are the large temporaries here: divided and filled in place
    # (the same arithmetic as new arrays from d_loc / d and torch.where)
    d = lg.deg.to(torch.float64)
    complete = d == 0
    d.clamp_(min=1)
    a = lg.local_in_degree().to(torch.float64).div_(d).masked_fill_(complete, 1.0)
    levels = [a]
    for _ in range(layers - 1):
        s = torch.zeros_like(d)
        # a piece's rows a slice of edges at a time: the per-edge temporaries (row ids,
        # gathered values) of all of the local graph's edges at once would be two
        # float64/int64 copies of them. A row's edges are summed in their stored order within
        # one slice, so the sums do not depend on where the slices fall.
        for r in lg.pieces():
            counts = r.counts()
            for r0, r1 in chunk_bounds(r.indptr, _SLICE):
                e0, e1 = int(r.indptr[r0]), int(r.indptr[r1])
                row = torch.repeat_interleave(torch.arange(r.base + r0, r.base + r1),
                                              counts[r0:r1], output_size=e1 - e0)
                s.index_add_(0, row, a[r.local(r.cols[e0:e1])])
        a = s.div_(d).masked_fill_(complete, 1.0)
        levels.append(a)
    if kind == "mean":
        return torch.stack(levels).mean(0).float()
    if kind == "path":
        return levels[-1].float()
    raise ValueError(f"coverage kind {kind!r}; expected 'mean' or 'path'")


# ---------------------------------------------------------------------- blocks
def expand(lg: LocalGraph, seeds: Tensor, fanouts: Sequence[Optional[int]],
           gen: Optional[torch.Generator] = None,
           present: bool = False) -> tuple[Tensor, list[SparseAdj]]:
    """Message-flow blocks for ``seeds`` (local ids) over ``lg``: ``fanouts[h]`` neighbours per
    node at hop ``h`` from the seeds (``None``: all), uniformly without replacement, vectorised.

    Returns ``(input_nodes, blocks)``: ``blocks[l]`` is layer ``l``'s block (first layer
    first); each block's sources start with its destinations. GCN normalisation uses the
    global in-degree capped at the fanout (so a fully present node is normalised exactly as in
    evaluation, and a sampled one as in a graph of degree ``min(d, f)``). ``present``: a
    destination row is normalised by the edges it has (a leaf's: none), not by its degree.
    """
    try:
        return _expand(lg, seeds, fanouts, gen, lg.scratch(), present)
    except BaseException:
        lg._pos = None    # possibly left dirty: the next call starts a fresh one
        raise


def _expand(lg: LocalGraph, nodes: Tensor, fanouts: Sequence[Optional[int]],
            gen: Optional[torch.Generator], pos: Tensor,
            present: bool = False) -> tuple[Tensor, list[SparseAdj]]:
    """:func:`expand` with ``pos`` (all -1) as the position map; leaves it all -1."""
    blocks: list[SparseAdj] = []
    for f in fanouts:
        indptr, src = lg.gather(nodes, f, gen)
        pos[nodes] = torch.arange(nodes.numel(), dtype=pos.dtype)
        new = torch.unique(src[pos[src] < 0])
        pos[new] = nodes.numel() + torch.arange(new.numel(), dtype=pos.dtype)
        cols = pos[src].long()
        all_nodes = torch.cat([nodes, new])
        pos[all_nodes] = -1
        # the block's degrees gathered, then capped (not a capped copy of every local node's)
        deg = lg.deg[all_nodes].long()
        if f is not None:
            deg = deg.clamp(max=f)
        dst = indptr[1:] - indptr[:-1] if present else deg[:nodes.numel()].clone()
        blocks.insert(0, SparseAdj(indptr, cols, all_nodes.numel(), deg, dst))
        nodes = all_nodes
    return nodes, blocks
