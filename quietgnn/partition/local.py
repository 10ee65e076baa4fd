"""``LocalPartition``: everything one rank holds of a partitioned graph.

Built once by :func:`build_partitions` (from the full graph, in the launcher or in
``quietgnn prepare``), saved in the partition book, then read-only on the rank.

Local numbering. Rank ``i`` numbers its nodes ``[owned | halo]``:

* ``owned``  int64 ``[n_own]``   global ids of the nodes rank ``i`` owns, ascending;
* ``halo``   int64 ``[n_halo]``  global ids of *remote in-neighbours* of owned nodes, grouped by
  owner rank (ascending) and ascending within a group, so the rows received from peer ``j``
  are the contiguous block ``halo[recv_offsets[j]:recv_offsets[j+1]]``.

Local adjacency (destination-indexed CSR, the layout of :class:`quietgnn.graph.Graph`):

* ``indptr``  int64 ``[n_own + 1]``; ``indices`` int64 ``[E_loc]`` with values in
  ``[0, n_own + n_halo)``: row ``v`` lists *all* in-neighbours of owned node ``v`` (local or
  halo), so aggregation over a row sees exactly the neighbourhood of the full graph.
* ``in_degree`` / ``out_degree`` int64 ``[n_own + n_halo]``: **global** degrees (normalisation
  with global degrees is what makes distributed GCN equal the centralized one).

Communication plans (static, so exchanges need no size handshake):

* ``send_idx[j]`` int64 ``[|B_{i->j}|]``: local indices of owned nodes whose rows peer ``j``
  needs, in the order ``j`` stores them in its halo block from ``i``;
* ``recv_counts`` int64 ``[P]``: ``recv_counts[j]`` halo rows arrive from peer ``j``.

Node data for owned nodes only: ``x`` ``[n_own, F]``, ``y`` ``[n_own]``, masks ``[n_own]``.

A part read from a prepared directory by a strategy that asks for it as stored
(``Strategy.reads_stored_part``) has ``indices`` int32 and ``x`` float16 when the files hold
them so, memory-mapped; every other array has the types above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..graph import FeaturesDigest, Graph
from ..rows import chunk_bounds, cumsum0

__all__ = ["LocalPartition", "build_partitions", "iter_partitions", "gather_rows"]


def gather_rows(indptr: Tensor, indices: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """CSR rows ``rows`` of a CSR matrix, vectorised: returns (indptr', indices')."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    new_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    new_indptr[1:] = counts.cumsum(0)
    total = int(new_indptr[-1])
    # position of each output entry = row start + offset within its row
    offs = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(new_indptr[:-1], counts)
    pos = torch.repeat_interleave(starts, counts) + offs
    return new_indptr, indices[pos]


@dataclass(eq=False)
class LocalPartition:
    """One rank's share of the graph (see the module docstring for every field's shape)."""

    rank: int
    num_parts: int
    num_nodes_global: int
    num_edges_global: int
    num_classes: int
    owned: Tensor
    halo: Tensor
    halo_owner: Tensor
    indptr: Tensor
    indices: Tensor
    in_degree: Tensor
    out_degree: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    send_idx: list[Tensor]
    recv_counts: Tensor
    num_train_global: int
    num_val_global: int
    num_test_global: int
    graph_name: str = "graph"
    graph_fingerprint: str = ""
    book_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    #: what a checkpoint records of the features (:meth:`features_identity`); "" until known
    features_id: str = ""

    # ------------------------------------------------------------------ sizes
    @property
    def n_own(self) -> int:
        return int(self.owned.numel())

    @property
    def n_halo(self) -> int:
        return int(self.halo.numel())

    @property
    def n_local(self) -> int:
        return self.n_own + self.n_halo

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def recv_offsets(self) -> Tensor:
        """int64 [P + 1]: halo block of peer j is ``[recv_offsets[j], recv_offsets[j+1])``."""
        out = torch.zeros(self.num_parts + 1, dtype=torch.int64)
        out[1:] = self.recv_counts.cumsum(0)
        return out

    @property
    def send_counts(self) -> Tensor:
        return torch.tensor([t.numel() for t in self.send_idx], dtype=torch.int64)

    def local_ids(self) -> Tensor:
        """int64 [n_own + n_halo]: global id of every local row (``cat(owned, halo)``)."""
        return torch.cat([self.owned, self.halo])

    def edge_dst(self) -> Tensor:
        """int64 [E_loc]: local destination row of every local edge."""
        return torch.repeat_interleave(torch.arange(self.n_own), self.indptr[1:] - self.indptr[:-1])

    # ------------------------------------------------------------------ derived views
    def central_mask(self) -> Tensor:
        """bool [n_own]: owned nodes none of whose in-neighbours is a halo node (their
        aggregation needs no remote data; AdaQP computes them while messages fly)."""
        has_halo = torch.zeros(self.n_own, dtype=torch.bool)
        remote = self.indices >= self.n_own
        has_halo[self.edge_dst()[remote]] = True
        return ~has_halo

    def boundary_mask(self) -> Tensor:
        """bool [n_own]: owned nodes some peer holds as a halo node."""
        m = torch.zeros(self.n_own, dtype=torch.bool)
        for idx in self.send_idx:
            m[idx] = True
        return m

    def induced(self) -> tuple[Tensor, Tensor]:
        """CSR (indptr, indices) of the node-induced subgraph on owned nodes (halo edges dropped;
        used by strategies that train in isolation). ``indices`` keeps the part's dtype.

        Two passes over row blocks of about ``_EDGE_BLOCK`` edges (count the kept edges per
        row, then copy them into place): whole-part temporaries (an int64 destination per edge,
        a mask, the kept columns before the copy) would be several times the part's edges."""
        n = self.n_own
        blocks = chunk_bounds(self.indptr, _EDGE_BLOCK)
        counts = torch.zeros(n, dtype=torch.int64)
        for r0, r1 in blocks:
            ptr = self.indptr[r0:r1 + 1]
            kept = cumsum0(self.indices[int(ptr[0]):int(ptr[-1])] < n)
            rel = ptr - ptr[0]
            counts[r0:r1] = kept[rel[1:]] - kept[rel[:-1]]
        indptr = cumsum0(counts)
        indices = torch.empty(int(indptr[-1]), dtype=self.indices.dtype)
        for r0, r1 in blocks:
            cols = self.indices[int(self.indptr[r0]):int(self.indptr[r1])]
            indices[int(indptr[r0]):int(indptr[r1])] = cols[cols < n]
        return indptr, indices

    def features_identity(self) -> str:
        """The features this rank trains on, as a checkpoint records them so that a resume
        after they changed is refused: set by :meth:`PartitionBook.load_part` from the book
        (``x.npy:`` the part file's sha256, or ``graph:`` its whole-graph features digest;
        both free), else ``part:`` this part's rows hashed by global id
        (:class:`~quietgnn.graph.FeaturesDigest`: one pass over ``x``, done once)."""
        if not self.features_id:
            d = FeaturesDigest(int(self.x[0].numel()) if self.x.shape[0] else 0)
            step = max(1, (1 << 22) // max(1, d.width))
            ids = self.owned.cpu().numpy()
            for a in range(0, self.n_own, step):
                d.update(self.x[a:a + step].detach().cpu().numpy(), ids[a:a + step])
            self.features_id = f"part:{d.hexdigest()}"
        return self.features_id

    def stats(self) -> dict[str, int]:
        return {"rank": self.rank, "owned": self.n_own, "halo": self.n_halo,
                "edges": int(self.indices.numel()),
                "send_rows": int(sum(t.numel() for t in self.send_idx)),
                "train": int(self.train_mask.sum())}

    def __repr__(self) -> str:
        return (f"LocalPartition(rank={self.rank}/{self.num_parts}, owned={self.n_own}, "
                f"halo={self.n_halo}, edges={int(self.indices.numel())}, "
                f"features={self.num_features})")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LocalPartition":
        missing = [k for k in cls.__dataclass_fields__ if k not in d and k not in ("meta",
                   "graph_name", "graph_fingerprint", "book_id")]
        if missing:
            raise ValueError(f"partition data lacks field(s) {missing}; the file was written by "
                             f"another version or is damaged: re-run `quietgnn prepare`")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


#: edges per block when a whole-graph pass needs per-edge temporaries (bounds their memory)
_EDGE_BLOCK = 1 << 22


def _edge_blocks(indptr: Tensor, indices: Tensor):
    """Yield ``(dst, src)`` int64 edge slices over row blocks of about ``_EDGE_BLOCK`` edges
    (whole rows), so whole-graph passes never hold more than a block of per-edge temporaries."""
    n, m = indptr.numel() - 1, indices.numel()
    starts = torch.searchsorted(indptr, torch.arange(0, m, _EDGE_BLOCK), right=True) - 1
    bounds = sorted(set(starts.tolist()) | {n})
    for v0, v1 in zip(bounds[:-1], bounds[1:]):
        e0, e1 = int(indptr[v0]), int(indptr[v1])
        dst = torch.repeat_interleave(torch.arange(v0, v1), indptr[v0 + 1:v1 + 1] - indptr[v0:v1])
        yield dst, indices[e0:e1]


def build_partitions(graph: Graph, parts: np.ndarray | Tensor, ranks: list[int] | None = None,
                     book_id: str = "", fingerprint: str | None = None) -> list[LocalPartition]:
    """Build the ``LocalPartition`` of every rank in ``ranks`` (default: all), vectorised.

    Cost: O(E log E) once for the cross-partition pairs, then O(E_loc) per rank.
    """
    return list(iter_partitions(graph, parts, ranks, book_id, fingerprint))


def iter_partitions(graph: Graph, parts: np.ndarray | Tensor, ranks: list[int] | None = None,
                    book_id: str = "", fingerprint: str | None = None):
    """:func:`build_partitions` one rank at a time (a caller that saves each part and drops
    it holds one part in memory, not all ``P``). ``fingerprint``: ``graph.fingerprint()``
    when the caller has it already."""
    parts_t = torch.as_tensor(np.asarray(parts), dtype=torch.int64)
    n = graph.num_nodes
    if parts_t.shape != (n,):
        raise ValueError(f"partition assignment has shape {tuple(parts_t.shape)}, expected [{n}]")
    P = int(parts_t.max()) + 1 if n else 1
    ranks = list(range(P)) if ranks is None else ranks
    in_deg, out_deg = graph.in_degree(), graph.out_degree()

    # Unique (requester, source) pairs over cross-partition edges, ordered by
    # (requester, owner, source): that order *is* every rank's halo layout and every send plan.
    blocks = []
    for dst, src in _edge_blocks(graph.indptr, graph.indices):
        req, owner = parts_t[dst], parts_t[src]
        cross = req != owner
        blocks.append(torch.unique((req[cross] * P + owner[cross]) * n + src[cross]))
        del dst, src, req, owner, cross
    if not blocks:   # no edges at all: nothing crosses, every halo is empty
        blocks = [torch.zeros(0, dtype=torch.int64)]
    key = torch.unique(torch.cat(blocks)) if len(blocks) != 1 else blocks[0]
    del blocks
    req_s, owner_s, u_s = key // (P * n), (key // n) % P, key % n
    del key
    bounds = torch.searchsorted(req_s, torch.arange(P + 1))   # halo block of each requester
    del req_s

    n_train = int(graph.train_mask.sum())
    n_val = int(graph.val_mask.sum())
    n_test = int(graph.test_mask.sum())
    fp = graph.fingerprint() if fingerprint is None else fingerprint
    g2l = torch.full((n,), -1, dtype=torch.int64)
    for i in ranks:
        owned = torch.nonzero(parts_t == i).flatten()
        halo = u_s[bounds[i]:bounds[i + 1]]
        halo_owner = owner_s[bounds[i]:bounds[i + 1]]
        recv_counts = torch.bincount(halo_owner, minlength=P)
        # send plan to j: sources owned by i in j's halo block, already in j's order
        send_idx = []
        for j in range(P):
            blk = slice(int(bounds[j]), int(bounds[j + 1]))
            mine = u_s[blk][owner_s[blk] == i] if j != i else u_s[:0]
            send_idx.append(torch.searchsorted(owned, mine))
        indptr, cols = gather_rows(graph.indptr, graph.indices, owned)
        g2l[owned] = torch.arange(owned.numel())
        g2l[halo] = owned.numel() + torch.arange(halo.numel())
        local_cols = g2l[cols]
        del cols
        g2l[owned] = -1
        g2l[halo] = -1
        ids = torch.cat([owned, halo])
        yield LocalPartition(
            rank=i, num_parts=P, num_nodes_global=n, num_edges_global=graph.num_edges,
            num_classes=graph.num_classes, owned=owned, halo=halo.clone(),
            halo_owner=halo_owner.clone(), indptr=indptr, indices=local_cols,
            in_degree=in_deg[ids], out_degree=out_deg[ids], x=graph.x[owned].contiguous(),
            y=graph.y[owned], train_mask=graph.train_mask[owned],
            val_mask=graph.val_mask[owned], test_mask=graph.test_mask[owned], send_idx=send_idx,
            recv_counts=recv_counts, num_train_global=n_train, num_val_global=n_val,
            num_test_global=n_test, graph_name=graph.name, graph_fingerprint=fp,
            book_id=book_id, meta={"evaluator": graph.meta.get("evaluator")})


def partition_stats(graph: Graph, parts: np.ndarray | Tensor) -> dict[str, Any]:
    """Edge cut, balance and halo sizes of an assignment (no LocalPartition needed)."""
    parts_t = torch.as_tensor(np.asarray(parts), dtype=torch.int64)
    n, P = graph.num_nodes, int(parts_t.max()) + 1
    edges = torch.zeros(P, dtype=torch.int64)
    cut = 0
    pairs = []
    for dst, src in _edge_blocks(graph.indptr, graph.indices):
        pd, ps = parts_t[dst], parts_t[src]
        cross = pd != ps
        cut += int(cross.sum())
        edges += torch.bincount(pd, minlength=P)
        pairs.append(torch.unique(pd[cross] * n + src[cross]))
        del dst, src, pd, ps, cross
    pair = torch.unique(torch.cat(pairs)) if pairs else torch.empty(0, dtype=torch.int64)
    halo = torch.bincount(pair // n, minlength=P)
    sizes = torch.bincount(parts_t, minlength=P)
    m = graph.num_edges
    return {
        "num_parts": P,
        "nodes": sizes.tolist(),
        "edges": edges.tolist(),
        "halo": halo.tolist(),
        "edge_cut": cut,
        "edge_cut_fraction": float(torch.tensor(cut / m, dtype=torch.float32)) if m else 0.0,
        "balance": float(sizes.max() / sizes.float().mean()),
        "halo_total": int(halo.sum()),
        "replication_factor": float((n + halo.sum()) / n),
    }
