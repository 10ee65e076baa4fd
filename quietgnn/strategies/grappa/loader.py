"""Grappa's chunk reload: the rotating chunk's rows and the local graph's features fetched
from their owners once per super-epoch, into a :class:`~.data.LocalGraph`.

The rotating chunk is as large as a part (its rows are a quarter of the graph's edges at
P = 4), and so are the features of it and of the leaves: kept in the rank's anonymous memory
they would double what a rank holds beside its own (mapped) part. They are written to scratch
files instead and read back memory-mapped (:class:`Scratch`): page cache, which the kernel
writes out and drops under pressure, not memory the rank must hold.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ...comm import Communicator
from ...comm.rowwire import decode_rows, encode_rows, wire_words
from ...comm.traffic import Traffic
from ...nn.sparse import SparseFeatures, mostly_zero
from ...partition import LocalPartition
from .data import LocalGraph, Rows, rotating_chunk

__all__ = ["ChunkLoader", "Scratch"]


class Scratch:
    """Tensors backed by files in ``parent`` (or the system's temporary directory),
    memory-mapped.

    Each file is unlinked as soon as it is mapped: its blocks live exactly as long as the
    tensor (the mapping), and nothing is left on disk when the process ends, however it ends
    -- no directory either (a private one outlived every scratch nobody closed: one per
    strategy a study or a test built and dropped). The files are named ``prefix`` + this
    process's id, so a reader of ``parent`` can tell them from another process's. The blocks
    are reserved up front, so a full disk fails here with an error naming it, not later with a
    SIGBUS on a page write."""

    def __init__(self, parent: Optional[Path] = None, prefix: str = "grappa-scratch-") -> None:
        self.parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self.parent.mkdir(parents=True, exist_ok=True)
        self.prefix = f"{prefix}{os.getpid()}-"
        self.closed = False

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        if self.closed:
            raise RuntimeError("scratch used after close()")
        n_bytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        if n_bytes == 0:
            return torch.empty(shape, dtype=dtype)
        fd, name = tempfile.mkstemp(prefix=self.prefix, suffix=".bin", dir=self.parent)
        path = Path(name)
        try:
            try:
                os.posix_fallocate(fd, 0, n_bytes)
            except OSError as exc:
                raise OSError(exc.errno, f"no room for {n_bytes} bytes of grappa's scratch in "
                                         f"{self.parent} ({exc.strerror}); free disk space "
                                         f"there or set runtime.out_dir to a larger disk") from None
            finally:
                os.close(fd)
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            arr = np.memmap(path, dtype=np_dtype, mode="r+", shape=shape)
        finally:
            path.unlink(missing_ok=True)
        return torch.from_numpy(arr)

    def files(self) -> list[str]:
        """This scratch's files still in ``parent`` (none, but for one being mapped)."""
        return sorted(f for f in os.listdir(self.parent) if f.startswith(self.prefix))

    def close(self) -> None:
        self.closed = True   # the mappings go with their tensors; there is nothing on disk


class ChunkLoader:
    """Loads the rotating chunk (structure + features) and the leaves' features from their
    owners. All ranks must call :meth:`load` with the same ``super_epoch`` at the same time.

    Per load, in the ``data`` phase: ``chunk_structure`` (one all-to-all: the chunk's
    ids, global degrees, halo table and row lengths as int64, its column ids as int32),
    ``chunk_request`` (ids asked of each owner: int32 where the graph's ids fit) and
    ``chunk_features`` (each block's non-zero count, 8 bytes a peer, then the rows: a block
    of mostly-zero rows as (column, value) pairs when that is smaller). The
    features of the rank's own halo are fetched once (first load) and kept, since those
    leaves never change; ``keep_halo=False`` (a run that never reaches a second super-epoch)
    drops them after the first load instead: a copy of the halo's rows the local graph
    already holds. ``scratch_dir``: where the scratch files go (see the module docstring);
    :meth:`close` removes them.
    """

    def __init__(self, comm: Communicator, part: LocalPartition, keep_halo: bool = True,
                 scratch_dir: Optional[Path] = None) -> None:
        self.comm, self.part, self.keep_halo = comm, part, keep_halo
        self.scratch_dir = scratch_dir
        self._scratch: Optional[Scratch] = None
        #: features cross the network as float32 at least (what the peers compute in); the
        #: local graph keeps them in the part's dtype: float16 when read as stored, half the
        #: bytes of its largest node array, widened exactly where a minibatch gathers its rows
        self.dtype = torch.promote_types(part.x.dtype, torch.float32)
        # the load's node ids and owners carried as narrow as they fit: its arrays are as long
        # as a part's halo (longer than the part itself on a dense graph), so int64 ids and
        # owners would double the set-up's largest transient (the structure message keeps its
        # int64 fields: only the requests travel narrower)
        self.idt = torch.int32 if part.num_nodes_global < 2 ** 31 else torch.int64
        self.odt = torch.int16 if part.num_parts < 2 ** 15 else torch.int32
        #: the part's rows as :class:`SparseFeatures` (float32) when mostly zero, else None:
        #: the loads then fetch, keep and hand over sparse rows (none of it ever dense)
        self.x_sparse = mostly_zero(part.x)
        # the own halo's features and their lookup (filled by the first load)
        self._halo_x: Optional[Tensor] = None
        self._halo_sorted: Optional[Tensor] = None
        self._halo_order: Optional[Tensor] = None

    def halo_rows(self) -> Optional[Tensor]:
        """The own halo's feature rows in ``part.halo``'s order, as the first load fetched them
        (None before it, after :meth:`drop_halo`, or with one rank: no halo). Exact evaluation
        reads them too, instead of fetching the same rows a second time."""
        return self._halo_x

    def drop_halo(self) -> None:
        """Forget the cached halo rows (a run that never reloads, once its evaluation took
        them)."""
        self._halo_x = self._halo_sorted = self._halo_order = None

    def scratch(self) -> Scratch:
        if self._scratch is None:
            self._scratch = Scratch(self.scratch_dir)
        return self._scratch

    def close(self) -> None:
        """Drop the cached halo rows and remove the scratch directory."""
        self.drop_halo()
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None

    # ------------------------------------------------------------------ collectives
    def _fetch_features(self, gids: Tensor, owners: Tensor, into: Optional[Tensor],
                        at: Optional[Tensor] = None) -> Optional[SparseFeatures]:
        """Rows of ``x`` for global ids ``gids`` owned by ``owners``: a request all-to-all,
        one of the blocks' non-zero counts, then the rows, each block sparse on the wire when
        smaller (:mod:`quietgnn.comm.rowwire`). Dense (``into`` given): written to
        ``into[at]`` (``at``: all of ``into`` by default) a peer's block at a time. Sparse
        (``into`` None, the features are mostly zero): returned in ``gids``' order."""
        P, me = self.comm.world_size, self.comm.rank
        F, owned = self.part.num_features, self.part.owned
        # each peer's positions found one peer at a time, kept as int32: an argsort over all
        # of ``owners`` would hold int64 positions as long as the halo through the exchange
        where = [torch.nonzero(owners == j).flatten().to(torch.int32) for j in range(P)]
        counts = [int(w.numel()) for w in where]
        req = [gids[w] for w in where]
        asked = self.comm.all_to_all(req, "chunk_request", carries=Traffic.STRUCTURE)
        del req
        # non-zeros per block: only a rank whose own rows are mostly zero counts them (-1:
        # "dense", which every block of a dense-featured graph is, with no counting pass)
        xs = self.x_sparse
        local = [torch.searchsorted(owned, a.to(owned.dtype)) if xs is not None and j != me
                 else None for j, a in enumerate(asked)]
        sent_nnz = [int((xs.indptr[ix + 1] - xs.indptr[ix]).sum()) if ix is not None else -1
                    for ix in local]
        got = self.comm.all_to_all([torch.tensor([z], dtype=torch.int64) for z in sent_nnz],
                                   "chunk_features", [1] * P, carries=Traffic.FEATURES)
        recv_nnz = [int(g[0]) for g in got]
        recv_nnz[me] = sent_nnz[me] = -1
        if into is not None and all(z < 0 for z in sent_nnz + recv_nnz):
            self._fetch_dense(asked, where, counts, into, at)
            return None
        send = []
        for j, a in enumerate(asked):
            if j == me:
                send.append(torch.zeros(0, dtype=torch.int32))
            elif xs is not None:
                send.append(encode_rows(xs.rows(local[j]), sent_nnz[j]))
            else:   # a dense-featured rank's rows to a sparse one: dense, but as words
                ix = torch.searchsorted(owned, a.to(owned.dtype))
                send.append(encode_rows(self.part.x[ix].to(torch.float32), -1))
        del asked, local
        words = [0 if j == me else wire_words(counts[j], recv_nnz[j], F) for j in range(P)]
        flat = self.comm.all_to_all(send, "chunk_features", words, carries=Traffic.FEATURES)
        del send
        pieces = [decode_rows(flat[j], counts[j], recv_nnz[j], F, into is None)
                  for j in range(P)]
        if into is not None:
            for w_j, rows_j in zip(where, pieces):
                into[w_j if at is None else at[w_j]] = rows_j.to(into.dtype)
            return None
        # the blocks' rows, back in the order of ``gids``
        pos = torch.empty(gids.numel(), dtype=torch.int64)
        pos[torch.cat(where).long()] = torch.arange(gids.numel())
        return SparseFeatures.cat(pieces).rows(pos)

    def _fetch_dense(self, asked: list[Tensor], where: list[Tensor], counts: list[int],
                     into: Tensor, at: Optional[Tensor]) -> None:
        """The rows of a dense-featured graph, float32 on the wire: the rows asked of this
        rank and the rows it gets, both as large as the local graph's halo, in scratch, sent
        and received in place (one buffer each, no joined copy)."""
        me, sc, F = self.comm.rank, self.scratch(), self.part.num_features
        owned = self.part.owned
        n_asked = [0 if j == me else int(a.numel()) for j, a in enumerate(asked)]
        send = sc.empty((sum(n_asked), F), self.dtype)
        blocks = list(torch.split(send, n_asked))
        for j, a in enumerate(asked):
            for lo in range(0, n_asked[j], _ROWS):
                ids = a[lo:lo + _ROWS].to(owned.dtype)
                blocks[j][lo:lo + _ROWS] = self.part.x[torch.searchsorted(owned, ids)]
        del asked
        recv = sc.empty((sum(counts), F), self.dtype)
        got = self.comm.all_to_all(blocks, "chunk_features", recv_counts=counts, out=recv,
                                   carries=Traffic.FEATURES)
        del send, blocks
        for w_j, rows_j in zip(where, got):   # no joined copy
            for lo in range(0, w_j.numel(), _ROWS):
                w = w_j[lo:lo + _ROWS]
                # exact: the rows were stored so
                into[w if at is None else at[w]] = rows_j[lo:lo + _ROWS].to(into.dtype)

    def _packed(self) -> Tensor:
        """What this rank sends when its chunk is requested: built per request, not kept (a
        second copy of the part's edges for the whole run, for one send per super-epoch). The
        local column ids travel as int32 pairs in the int64 message (they index the part's own
        rows, far below 2^31): the largest field at half the bytes. Each field is written
        into the message in place: no int32 copy of the columns and no joined copy of the
        fields beside it."""
        p = self.part
        e = int(p.indices.numel())
        if e and int(p.indices.max()) >= 2 ** 31:
            raise ValueError(f"a part with {int(p.indices.max()) + 1} local rows: its column "
                             f"ids do not fit int32; use more parts")
        fields = [torch.tensor([p.n_own, p.n_halo, e], dtype=torch.int64), p.owned,
                  p.in_degree, p.halo, p.halo_owner]
        n_head = sum(int(t.numel()) for t in fields) + p.n_own
        # in scratch: the message is as large as the part's edges (the received one, which
        # the communicator allocates, is the receiver's transient)
        msg = self.scratch().empty((n_head + (e + 1) // 2,), torch.int64)
        o = 0
        for t in fields:
            msg[o:o + t.numel()] = t
            o += t.numel()
        torch.sub(p.indptr[1:], p.indptr[:-1], out=msg[o:o + p.n_own])
        cols = msg[n_head:].view(torch.int32)
        cols[e:] = 0                 # the padding word's second half
        for lo in range(0, e, _EDGES):      # widened (int64 parts) a slice at a time
            hi = min(e, lo + _EDGES)
            cols[lo:hi] = p.indices[lo:hi]
        return msg

    def _exchange_structure(self, chunk: int, super_epoch: int) -> Tensor:
        P, me = self.comm.world_size, self.comm.rank
        asked = [r for r in range(P) if rotating_chunk(r, P, super_epoch) == me and r != me]
        packed = self._packed() if asked else torch.zeros(0, dtype=torch.int64)
        sizes = [packed.numel() if r in asked else 0 for r in range(P)]
        if sum(sizes) == packed.numel():
            # one asker (the rotation is a permutation): views of the one message, which
            # the communicator sends without joining the blocks into a copy
            send = list(torch.split(packed, sizes))
        else:
            send = [packed if r in asked else packed[:0] for r in range(P)]
        # received into scratch, as large as the chunk's edges: its size is known only once
        # the communicator's handshake is done, so the buffer is made then
        got = self.comm.all_to_all(send, "chunk_structure", carries=Traffic.STRUCTURE,
                                   out=lambda rows: self.scratch().empty((rows,), torch.int64))
        return got[chunk]

    # ------------------------------------------------------------------ the load
    def load(self, super_epoch: int) -> LocalGraph:
        p, comm = self.part, self.comm
        P, me = comm.world_size, comm.rank
        chunk = rotating_chunk(me, P, super_epoch)
        # the own chunk's rows as the part stores them: its columns [owned | halo] are local
        # ids for the owned ones (gid[:n_own] = part.owned); only the halo's need a table
        own_rows = lambda table: Rows(p.indptr, p.indices, p.n_own, 0, table)   # noqa: E731
        xs = self.x_sparse
        if chunk is None:  # one rank: the whole graph, no halo, no leaves
            x_own = p.x if xs is None else xs
            return LocalGraph(own_rows(torch.zeros(0, dtype=torch.int32)), None, x_own,
                              x_own.head(0) if xs is not None else p.x[:0],
                              p.in_degree[: p.n_own], p.n_own, p.n_own, None, super_epoch)
        sc, idt, odt = self.scratch(), self.idt, self.odt
        # the part's id tables (int64 as stored, mapped) narrowed for this load
        halo, halo_owner = p.halo.to(idt), p.halo_owner.to(odt)
        if self._halo_x is None:
            self._halo_sorted, order = torch.sort(halo)
            self._halo_order = order.to(torch.int32)
            del order
            if xs is None:
                self._halo_x = sc.empty((p.n_halo, p.num_features), p.x.dtype)
                self._fetch_features(halo, halo_owner, self._halo_x)
            else:
                self._halo_x = self._fetch_features(halo, halo_owner, None)
        buf = self._exchange_structure(chunk, super_epoch)
        n_o, n_h, e = (int(v) for v in buf[:3])
        o = 3
        # the node fields copied out (narrowed); the columns stay where they were received
        j_owned = buf[o:o + n_o].to(idt); o += n_o
        j_deg = buf[o:o + n_o + n_h]; o += n_o + n_h       # a view: read into ``deg`` below
        j_halo = buf[o:o + n_h].to(idt); o += n_h
        j_halo_owner = buf[o:o + n_h].to(odt); o += n_h
        j_indptr = torch.zeros(n_o + 1, dtype=torch.int64)
        torch.cumsum(buf[o:o + n_o], 0, out=j_indptr[1:]); o += n_o
        j_cols = buf[o:].view(torch.int32)[:e]

        # leaves: in-neighbours of either chunk outside both chunks, by global id, with their
        # owners and degrees (a node's, whichever halo listed it: written once per listing)
        own_leaf = halo_owner != chunk                          # never owned by this rank
        j_leaf = j_halo_owner != me                             # never owned by chunk j
        leaf = torch.unique(torch.cat([halo[own_leaf], j_halo[j_leaf]]))
        n_int = p.n_own + n_o
        leaf_owner = torch.empty(leaf.numel(), dtype=odt)
        # degrees of the local graph's rows [own chunk | chunk j | leaves], written into one
        # int32 array (int64 only where a degree needs it): no int64 join
        wide = any(t.numel() and int(t.max()) >= 2 ** 31 for t in (p.in_degree, j_deg))
        deg = torch.empty(n_int + leaf.numel(), dtype=torch.int64 if wide else torch.int32)
        deg[: p.n_own] = p.in_degree[: p.n_own]
        deg[p.n_own:n_int] = j_deg[:n_o]
        for ids, owner, dg, sel in ((halo, halo_owner, p.in_degree[p.n_own:], own_leaf),
                                    (j_halo, j_halo_owner, j_deg[n_o:], j_leaf)):
            at = torch.searchsorted(leaf, ids[sel], out_int32=True)
            leaf_owner[at] = owner[sel]
            deg[n_int + at] = dg[sel].to(deg.dtype)
            del at
        del own_leaf, j_leaf, j_deg, buf

        # each of the numbering's three pieces is sorted by global id: [own | chunk j | leaves]
        pieces = ((me, p.owned.to(idt), 0), (chunk, j_owned, p.n_own), (None, leaf, n_int))
        own = own_rows(_to_local(halo, halo_owner, pieces))
        rot = Rows(j_indptr, j_cols, n_o, p.n_own, _to_local(j_halo, j_halo_owner, pieces))
        del j_halo, j_halo_owner, halo, halo_owner, pieces

        # features: own chunk's are the part's, own halo's cached, the rest (chunk j's
        # owned nodes, new leaves) fetched, all written in place into one scratch array
        need = torch.cat([j_owned, leaf])
        need_owner = torch.cat([torch.full((n_o,), chunk, dtype=odt), leaf_owner])
        del j_owned, leaf, leaf_owner
        cached = self._in_halo(need)
        fetch = torch.nonzero(~cached).flatten().to(torch.int32)
        hit = torch.nonzero(cached).flatten().to(torch.int32)
        del cached
        if xs is not None:
            x_rest = self._sparse_rest(need, need_owner, fetch, hit)
            if not self.keep_halo:
                self.drop_halo()
            return LocalGraph(own, rot, xs, x_rest, deg, p.n_own, n_int, chunk, super_epoch)
        x_rest = sc.empty((need.numel(), p.num_features), p.x.dtype)
        self._fetch_features(need[fetch], need_owner[fetch], x_rest, fetch)
        del fetch, need_owner
        # the hits searched a second time, a slice at a time: keeping the first search's
        # positions would hold an int64 array the size of ``need`` through the fetch
        for lo in range(0, hit.numel(), _ROWS):    # bounded temporaries of the halo's rows
            h = hit[lo:lo + _ROWS]
            x_rest[h] = self._halo_x[self._halo_order[
                torch.searchsorted(self._halo_sorted, need[h])].long()]
        if not self.keep_halo:
            self.drop_halo()
        return LocalGraph(own, rot, p.x, x_rest, deg, p.n_own, n_int, chunk, super_epoch)

    def _sparse_rest(self, need: Tensor, owner: Tensor, fetch: Tensor,
                     hit: Tensor) -> SparseFeatures:
        """The rows of ``need`` (mostly-zero features): ``fetch``'s from their owners, ``hit``'s
        from the cached halo rows, joined in ``need``'s order."""
        got = self._fetch_features(need[fetch], owner[fetch], None)
        at = self._halo_order[torch.searchsorted(self._halo_sorted, need[hit])].long()
        both = SparseFeatures.cat([got, self._halo_x.rows(at)])
        pos = torch.empty(need.numel(), dtype=torch.int64)
        pos[torch.cat([fetch, hit]).long()] = torch.arange(need.numel())
        return both.rows(pos)

    def _in_halo(self, ids: Tensor) -> Tensor:
        """Which of ``ids`` are in the own halo: a search in its sorted copy, a slice at a
        time (``torch.isin`` sorts both sets joined: temporaries several times their size)."""
        hs = self._halo_sorted
        out = torch.zeros(ids.numel(), dtype=torch.bool)
        if hs is None or hs.numel() == 0:
            return out
        for lo in range(0, ids.numel(), _ROWS):
            q = ids[lo:lo + _ROWS]
            at = torch.searchsorted(hs, q).clamp_(max=hs.numel() - 1)
            out[lo:lo + _ROWS] = hs[at] == q
        return out


def _to_local(g: Tensor, owner: Tensor, pieces) -> Tensor:
    """Local ids (int32) of global ids ``g`` owned by ``owner``, from the numbering's pieces
    ``(owner or None for the rest, sorted global ids, first local id)``: a search within
    the piece each id's owner puts it in."""
    out = torch.empty(g.numel(), dtype=torch.int32)
    owners = [o for o, _, _ in pieces if o is not None]
    for o, ids, base in pieces:
        if o is None:
            sel = torch.ones(g.numel(), dtype=torch.bool)
            for q in owners:
                sel &= owner != q
        else:
            sel = owner == o
        out[sel] = torch.searchsorted(ids, g[sel], out_int32=True) + base
    return out


#: feature rows gathered or copied per slice (bounds the temporaries of a copy)
_ROWS = 1 << 20


#: edges copied per slice into the structure message
_EDGES = 1 << 22
