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
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ...comm import Communicator
from ...comm.traffic import Traffic
from ...partition import LocalPartition
from .data import LocalGraph, Rows, rotating_chunk

__all__ = ["ChunkLoader", "Scratch"]


class Scratch:
    """Tensors backed by files in a private directory (under ``parent``, or the system's
    temporary directory), memory-mapped.

    Each file is unlinked as soon as it is mapped: its blocks live exactly as long as the
    tensor (the mapping), and nothing is left on disk when the process ends, however it ends.
    :meth:`close` removes the directory. The blocks are reserved up front, so a full disk
    fails here with an error naming it, not later with a SIGBUS on a page write."""

    def __init__(self, parent: Optional[Path] = None, prefix: str = "grappa-scratch-") -> None:
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.dir: Optional[Path] = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self._n = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        if self.dir is None:
            raise RuntimeError("scratch used after close()")
        n_bytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        if n_bytes == 0:
            return torch.empty(shape, dtype=dtype)
        path = self.dir / f"t{self._n}.bin"
        self._n += 1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, n_bytes)
            except OSError as exc:
                raise OSError(exc.errno, f"no room for {n_bytes} bytes of grappa's scratch in "
                                         f"{self.dir} ({exc.strerror}); free disk space there "
                                         f"or set runtime.out_dir to a larger disk") from None
            finally:
                os.close(fd)
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            arr = np.memmap(path, dtype=np_dtype, mode="r+", shape=shape)
        finally:
            path.unlink(missing_ok=True)
        return torch.from_numpy(arr)

    def close(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class ChunkLoader:
    """Loads the rotating chunk (structure + features) and the leaves' features from their
    owners. All ranks must call :meth:`load` with the same ``super_epoch`` at the same time.

    Per load, in the ``data`` phase: ``chunk_structure`` (one all-to-all: the chunk's
    ids, global degrees, halo table and row lengths as int64, its column ids as int32),
    ``chunk_request`` (ids asked of each owner) and ``chunk_features`` (the rows). The
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
        # the own halo's features and their lookup (filled by the first load)
        self._halo_x: Optional[Tensor] = None
        self._halo_sorted: Optional[Tensor] = None
        self._halo_order: Optional[Tensor] = None

    def scratch(self) -> Scratch:
        if self._scratch is None:
            self._scratch = Scratch(self.scratch_dir)
        return self._scratch

    def close(self) -> None:
        """Drop the cached halo rows and remove the scratch directory."""
        self._halo_x = self._halo_sorted = self._halo_order = None
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None

    # ------------------------------------------------------------------ collectives
    def _fetch_features(self, gids: Tensor, owners: Tensor, into: Tensor,
                        at: Optional[Tensor] = None) -> None:
        """Rows of ``x`` for global ids ``gids`` owned by ``owners`` (two all-to-alls),
        written to ``into[at]`` (``at``: all of ``into`` by default) a peer's block at a time."""
        P, me = self.comm.world_size, self.comm.rank
        order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners, minlength=P).tolist()
        req = list(torch.split(gids[order], counts))
        asked = self.comm.all_to_all(req, "chunk_request", carries=Traffic.STRUCTURE)
        rows = [self.part.x[torch.searchsorted(self.part.owned, a)].to(self.dtype) if j != me
                else self.part.x[:0].to(self.dtype) for j, a in enumerate(asked)]
        got = self.comm.all_to_all(rows, "chunk_features", recv_counts=counts,
                                   carries=Traffic.FEATURES)
        for where, rows_j in zip(torch.split(order, counts), got):   # no joined copy
            into[where if at is None else at[where]] = rows_j.to(into.dtype)   # exact: stored so

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
        P, me = comm.world_size, comm.rank
        chunk = rotating_chunk(me, P, super_epoch)
        # the own chunk's rows as the part stores them: its columns [owned | halo] are local
        # ids for the owned ones (gid[:n_own] = part.owned); only the halo's need a table
        own_rows = lambda table: Rows(p.indptr, p.indices, p.n_own, 0, table)   # noqa: E731
        if chunk is None:  # one rank: the whole graph, no halo, no leaves
            return LocalGraph(own_rows(torch.zeros(0, dtype=torch.int32)), None, p.x, p.x[:0],
                              p.in_degree[: p.n_own], p.n_own, p.n_own, None, super_epoch)
        sc = self.scratch()
        if self._halo_x is None:
            self._halo_sorted, order = torch.sort(p.halo)
            self._halo_order = order.to(torch.int32)
            del order
            self._halo_x = sc.empty((p.n_halo, p.num_features), p.x.dtype)
            self._fetch_features(p.halo, p.halo_owner, self._halo_x)
        buf = self._exchange_structure(chunk, super_epoch)
        n_o, n_h, e = (int(v) for v in buf[:3])
        o = 3
        # the node fields copied out, the columns to scratch: the message is freed once read
        j_owned = buf[o:o + n_o].clone(); o += n_o
        j_deg = buf[o:o + n_o + n_h].clone(); o += n_o + n_h
        j_halo = buf[o:o + n_h].clone(); o += n_h
        j_halo_owner = buf[o:o + n_h].clone(); o += n_h
        j_indptr = torch.zeros(n_o + 1, dtype=torch.int64)
        torch.cumsum(buf[o:o + n_o], 0, out=j_indptr[1:]); o += n_o
        j_cols = sc.empty((e,), torch.int32)
        j_cols.copy_(buf[o:].view(torch.int32)[:e])
        del buf

        # leaves: in-neighbours of either chunk outside both chunks (with their owners)
        cand = torch.cat([p.halo, j_halo])
        cand_owner = torch.cat([p.halo_owner, j_halo_owner])
        cand_deg = torch.cat([p.in_degree[p.n_own:], j_deg[n_o:]])
        keep = (cand_owner != me) & (cand_owner != chunk)
        leaf, first = _unique_first(cand[keep])
        leaf_owner, leaf_deg = cand_owner[keep][first], cand_deg[keep][first]
        del cand, cand_owner, cand_deg, keep, first
        n_int = p.n_own + n_o

        def to_local(g: Tensor, owner: Tensor) -> Tensor:
            """Local ids (int32) of global ids ``g`` owned by ``owner``: each of the three
            pieces of the numbering is sorted by global id, so a search within it."""
            out = torch.empty(g.numel(), dtype=torch.int32)
            for sel, ids, base in ((owner == me, p.owned, 0), (owner == chunk, j_owned, p.n_own),
                                   ((owner != me) & (owner != chunk), leaf, n_int)):
                out[sel] = (torch.searchsorted(ids, g[sel]) + base).to(torch.int32)
            return out

        own = own_rows(to_local(p.halo, p.halo_owner))
        rot = Rows(j_indptr, j_cols, n_o, p.n_own, to_local(j_halo, j_halo_owner))
        del j_halo, j_halo_owner

        # features: own chunk's are the part's, own halo's cached, the rest (chunk j's
        # owned nodes, new leaves) fetched, all written in place into one scratch array
        need = torch.cat([j_owned, leaf])
        need_owner = torch.cat([torch.full((n_o,), chunk, dtype=torch.int64), leaf_owner])
        cached = torch.isin(need, p.halo)
        x_rest = sc.empty((need.numel(), p.num_features), p.x.dtype)
        fetch = torch.nonzero(~cached).flatten()
        self._fetch_features(need[fetch], need_owner[fetch], x_rest, fetch)
        hit = torch.nonzero(cached).flatten()
        for lo in range(0, hit.numel(), _ROWS):    # bounded temporaries of the halo's rows
            h = hit[lo:lo + _ROWS]
            x_rest[h] = self._halo_x[self._halo_order[
                torch.searchsorted(self._halo_sorted, need[h])].long()]
        if not self.keep_halo:
            self._halo_x = self._halo_sorted = self._halo_order = None
        deg = torch.cat([p.in_degree[: p.n_own], j_deg[:n_o], leaf_deg])
        deg = deg.to(torch.int32) if deg.numel() == 0 or int(deg.max()) < 2 ** 31 else deg
        return LocalGraph(own, rot, p.x, x_rest, deg, p.n_own, n_int, chunk, super_epoch)


#: feature rows copied per slice from the halo cache (bounds the copy's temporaries)
_ROWS = 1 << 20


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
