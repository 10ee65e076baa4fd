"""The distributed prepare's exchanges of rows (:mod:`.dist`), and the graph's fingerprint
computed at rank 0 from what every rank sends in id order."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from ..comm.communicator import Communicator
from ..comm.traffic import Traffic
from .arrays import NpyWriter, npy_chunks
from ..partition.book import book_id_of
from .nodes import TEST, TRAIN, VAL

__all__ = ["gather_fingerprint"]


def _a2a(comm: Communicator, blocks: list[np.ndarray], kind: str,
         recv_counts: Optional[list[int]] = None,
         carries: Traffic = Traffic.STRUCTURE) -> list[np.ndarray]:
    # one buffer split into the blocks: the communicator sends it without another copy
    flat = torch.from_numpy(np.concatenate(blocks))
    out = comm.all_to_all(list(torch.split(flat, [len(b) for b in blocks])), kind,
                          recv_counts, carries=carries)
    return [t.numpy() for t in out]


def _rows(con: Any, sql: str, rows: int) -> Iterator[dict[str, np.ndarray]]:
    reader = con.sql(sql).to_arrow_reader(rows)
    try:
        for batch in reader:
            yield {name: batch.column(i).to_numpy(zero_copy_only=False).astype(np.int64)
                   for i, name in enumerate(batch.schema.names)}
    finally:
        reader.close()


def gather_fingerprint(comm: Communicator, con: Any, tmp: Path, owned: np.ndarray,
                 in_deg: np.ndarray, y: np.ndarray, split: np.ndarray, n: int, F: int,
                 B: int) -> Optional[dict[str, str]]:
    """:meth:`Graph.fingerprint` and the book id, computed at rank 0 from what the ranks send
    in id order (``None`` on the other ranks); rank 0 writes ``assignment.npy`` meanwhile."""
    P, r = comm.world_size, comm.rank
    h = hashlib.sha256()
    work = tmp / ".work-0"
    if r == 0:
        h.update(np.zeros(1, dtype=np.int64).tobytes())
        asg = NpyWriter(tmp / "assignment.npy", np.int64, (n,))
        files = {k: NpyWriter(work / f"{k}.npy", t, (n,))
                 for k, t in (("deg", np.int64), ("y", np.int64), ("split", np.uint8))}
    total = 0
    # degrees (hashed as the CSR's indptr), labels and split codes, a window of ids at a time
    for a in range(0, n, B):
        i0, i1 = np.searchsorted(owned, [a, a + B])
        rows = np.stack([owned[i0:i1], in_deg[i0:i1], y[i0:i1], split[i0:i1]], 1)
        blocks = [rows if j == 0 else rows[:0] for j in range(P)]
        got = _a2a(comm, blocks, "prepare_gather", carries=Traffic.LABELS)
        if r == 0:
            w = min(B, n - a)
            win = np.full((w, 4), -1, dtype=np.int64)
            for j, g in enumerate(got):
                win[g[:, 0] - a, 0] = j
                win[g[:, 0] - a, 1:] = g[:, 1:]
            asg.write(win[:, 0])
            files["deg"].write(win[:, 1])
            files["y"].write(win[:, 2])
            files["split"].write(win[:, 3])
            c = np.cumsum(win[:, 1]) + total
            h.update(c.tobytes())
            total = int(c[-1])
    bounds = torch.zeros(1, dtype=torch.int64)
    if r == 0:
        asg.close()
        for f in files.values():
            f.close()
        bounds = torch.from_numpy(_edge_windows(work / "deg.npy", n, B))
    size = comm.broadcast(torch.tensor([bounds.numel()]), 0, "prepare_gather",
                          carries=Traffic.CONTROL)
    if r != 0:
        bounds = torch.zeros(int(size[0]), dtype=torch.int64)
    bounds = comm.broadcast(bounds, 0, "prepare_gather", carries=Traffic.CONTROL).numpy()
    # the sources in CSR order: each rank sends its edges' sources of a window of
    # destinations; rank 0 interleaves them by the owner of each destination
    if r == 0:
        owner_of = np.load(tmp / "assignment.npy", mmap_mode="r")
        deg_of = np.load(work / "deg.npy", mmap_mode="r")
    cursor = _Cursor(_rows(con, "SELECT dst, src FROM e", B))
    for a, b in zip(bounds[:-1], bounds[1:]):
        mine = cursor.below(int(b))
        got = _a2a(comm, [mine if j == 0 else mine[:0] for j in range(P)], "prepare_gather")
        if r == 0:
            slot = np.repeat(owner_of[a:b], deg_of[a:b])
            srcs = np.empty(slot.size, dtype=np.int64)
            for j, g in enumerate(got):
                sel = slot == j
                if int(sel.sum()) != g.size:
                    raise RuntimeError(f"rank {j} sent {g.size} edges of nodes {a} .. {b - 1}, "
                                       f"its degrees say {int(sel.sum())}")
                srcs[sel] = g
            h.update(srcs.tobytes())
    if r != 0:
        return None
    del owner_of, deg_of
    for chunk in npy_chunks(work / "y.npy"):
        h.update(chunk.tobytes())
    for code in (TRAIN, VAL, TEST):
        for chunk in npy_chunks(work / "split.npy"):
            h.update((chunk == code).tobytes())
    h.update(str((n, F)).encode())
    fingerprint = h.hexdigest()[:16]
    return {"fingerprint": fingerprint,
            "book_id": book_id_of(fingerprint, npy_chunks(tmp / "assignment.npy"))}


def _edge_windows(deg_file: Path, n: int, B: int) -> np.ndarray:
    """Boundaries of id windows of at most ``B`` nodes holding at most ``B`` edges (or one
    node, however many edges it has), from the degrees in id order."""
    bounds, a = [0], 0
    for chunk in npy_chunks(deg_file):
        c = np.cumsum(chunk)
        s = 0
        while s < chunk.size:
            base = int(c[s - 1]) if s else 0
            e = max(int(np.searchsorted(c, base + B, side="right")), s + 1)
            s = min(e, s + B)
            bounds.append(a + s)
        a += chunk.size
    return np.array(bounds, dtype=np.int64)


class _Cursor:
    """The rows of a stream sorted by ``dst``, handed out by windows of destinations."""

    def __init__(self, batches: Iterator[dict[str, np.ndarray]]) -> None:
        self.batches = batches
        self.dst = self.src = np.zeros(0, dtype=np.int64)

    def below(self, b: int) -> np.ndarray:
        """The sources of the rows with ``dst < b`` not handed out yet."""
        while not self.dst.size or self.dst[-1] < b:
            nxt = next(self.batches, None)
            if nxt is None:
                break
            self.dst = np.concatenate([self.dst, nxt["dst"]])
            self.src = np.concatenate([self.src, nxt["src"]])
        cut = int(np.searchsorted(self.dst, b))
        out, self.dst, self.src = self.src[:cut], self.dst[cut:], self.src[cut:]
        return out
