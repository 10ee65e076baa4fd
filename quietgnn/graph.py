"""The one data contract every loader produces and every partitioner consumes.

A :class:`Graph` is a node-classification graph in CSR form, *indexed by destination*:
the in-neighbours (message sources) of node ``v`` are ``indices[indptr[v]:indptr[v+1]]``.
This is the layout message passing reads (``out[v] = sum_u A[v, u] h[u]``), so the
sparse-dense product ``A @ H`` is one CSR kernel call with no transposition.

Worked example (3 nodes, undirected path 0 - 1 - 2)::

    indptr  = [0, 1, 3, 4]         # int64 [N+1]
    indices = [1, 0, 2, 1]         # int64 [E]: node 0 <- 1; node 1 <- 0, 2; node 2 <- 1
    x       = float32 [3, F]
    y       = int64   [3]          # in [0, num_classes)
    train_mask / val_mask / test_mask = bool [3], pairwise disjoint, train non-empty

Conventions (checked by :meth:`Graph.validate`):

* **No self-loops, no duplicate edges.** Models add the self-loop they need (GCN's
  ``A + I``, GIN's ``(1 + eps) h``); a stored self-loop would be counted twice.
  :meth:`Graph.from_edge_index` drops them for you.
* **Direction is explicit.** ``from_edge_index(..., undirected=True)`` (the default for
  the built-in loaders) adds every reverse edge; ``undirected=False`` keeps the edge set
  as given, and ``is_undirected()`` tells which one you have. Partitioners that need a
  symmetric graph (METIS) symmetrise their own input and leave the graph untouched.
* Each row's sources are sorted ascending (canonical CSR), which makes results and
  fingerprints independent of input order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .graphinput import MASKS, graph_inputs

__all__ = ["Graph", "FeaturesDigest", "csr_from_edges", "random_split",
           "check_trainable_split"]

#: edges checked per block by :meth:`Graph.validate` (bounds its memory on big graphs)
_VALIDATE_BLOCK = 1 << 22


class FeaturesDigest:
    """An order-sensitive hash of a feature matrix, written a block of rows at a time in any
    chunking (so the out-of-core ``prepare`` computes what :meth:`Graph.features_digest`
    computes): per column, the sum over rows of the value's float32 bits times an odd
    multiplier of the row id, modulo 2^64 -- an integer sum, the same in any order of blocks.
    Any single changed value changes it (an odd multiplier is invertible modulo 2^64). Cost:
    one vectorised pass, about the cost of reading the matrix; a cryptographic hash of every
    byte costs several times that at 10^9 values. A check against edits and mix-ups, not a
    defence against a crafted collision."""

    def __init__(self, width: int) -> None:
        self.width, self.rows = int(width), 0
        self.acc = np.zeros(self.width, dtype=np.uint64)

    def update(self, x: np.ndarray, ids: "int | np.ndarray") -> None:
        """Add rows of the matrix (``[rows, width]``, any float dtype): ``ids`` their global
        ids, or the first of consecutive ones."""
        bits = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1).view(np.uint32)
        ids = np.arange(ids, ids + bits.shape[0], dtype=np.uint64) if np.isscalar(ids) else \
            np.asarray(ids).astype(np.uint64)
        mult = ids * np.uint64(0x9E3779B97F4A7C15) | np.uint64(1)
        with np.errstate(over="ignore"):      # the wrap-around is the modulo
            self.acc += (bits.astype(np.uint64) * mult[:, None]).sum(0, dtype=np.uint64)
        self.rows += bits.shape[0]

    def merge(self, rows: int, acc: bytes) -> None:
        """Add another writer's sums (its ``rows`` and ``acc.tobytes()``): one digest from the
        parts that ranks hashed apart."""
        with np.errstate(over="ignore"):
            self.acc += np.frombuffer(acc, dtype=np.uint64)
        self.rows += int(rows)

    def hexdigest(self) -> str:
        h = hashlib.sha256(f"{(self.rows, self.width)}:float32".encode())
        h.update(self.acc.tobytes())
        return h.hexdigest()[:16]


def csr_from_edges(src: Tensor, dst: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Canonical destination-indexed CSR from an edge list (sorted rows, duplicates removed)."""
    key = torch.unique(dst.to(torch.int64) * num_nodes + src.to(torch.int64))  # sorts too
    dst_s, src_s = key // num_nodes, key % num_nodes
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(dst_s, minlength=num_nodes).cumsum(0)
    return indptr, src_s


def random_split(num_nodes: int, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
                 seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded random train/val/test masks (the split rule for datasets without a standard one)."""
    if abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"split fractions {fractions} must be non-negative and sum to 1")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_nodes, generator=gen)
    n_train = int(round(fractions[0] * num_nodes))
    n_val = int(round(fractions[1] * num_nodes))
    masks = []
    for lo, hi in ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, num_nodes)):
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[perm[lo:hi]] = True
        masks.append(m)
    return masks[0], masks[1], masks[2]


@dataclass(frozen=True, eq=False)
class Graph:
    """A validated node-classification graph (see the module docstring for the layout)."""

    indptr: Tensor
    indices: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int
    name: str = "graph"
    #: Free-form provenance (loader, split rule, evaluator name, ...). Not used for computation.
    meta: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ basic views
    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel() - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def in_degree(self) -> Tensor:
        """int64 [N]: number of in-neighbours (sources) of every node."""
        return self.indptr[1:] - self.indptr[:-1]

    def out_degree(self) -> Tensor:
        """int64 [N]: number of out-neighbours of every node."""
        return torch.bincount(self.indices, minlength=self.num_nodes)

    def edge_dst(self) -> Tensor:
        """int64 [E]: destination of every stored edge (row id of the CSR entry)."""
        return torch.repeat_interleave(torch.arange(self.num_nodes), self.in_degree())

    def edge_index(self) -> Tensor:
        """int64 [2, E] in PyG's (source, destination) convention."""
        return torch.stack([self.indices, self.edge_dst()])

    def is_undirected(self) -> bool:
        """True when every edge u->v has its reverse v->u."""
        n = self.num_nodes
        fwd = self.edge_dst() * n + self.indices
        rev = self.indices * n + self.edge_dst()
        return bool(torch.equal(torch.sort(fwd).values, torch.sort(rev).values))

    def fingerprint(self) -> str:
        """Short content hash of topology, labels and splits (partition books record it)."""
        h = hashlib.sha256()
        for t in (self.indptr, self.indices, self.y, self.train_mask, self.val_mask,
                  self.test_mask):
            h.update(memoryview(np.ascontiguousarray(t.numpy())).cast("B"))   # no copy
        h.update(str(tuple(self.x.shape)).encode())
        return h.hexdigest()[:16]

    def features_digest(self, chunk_rows: int = 0) -> str:
        """Short hash of the feature matrix ``x`` (:class:`FeaturesDigest`), one pass in chunks
        of ``chunk_rows`` rows (0: about 4M values)."""
        x = self.x.detach()
        d = FeaturesDigest(int(x[0].numel()) if x.shape[0] else 0)
        step = chunk_rows or max(1, (1 << 22) // max(1, d.width))
        for a in range(0, x.shape[0], step):
            d.update(x[a:a + step].numpy(), a)
        return d.hexdigest()

    def __repr__(self) -> str:
        return (f"Graph(name={self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"features={self.num_features}, classes={self.num_classes}, "
                f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")

    # ------------------------------------------------------------------ validation
    def validate(self) -> "Graph":
        """Check the whole contract; raise ``ValueError``/``TypeError`` naming value and fix."""
        def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
            if not cond:
                raise exc(f"Graph {self.name!r}: {msg}")

        for fname in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
            need(isinstance(getattr(self, fname), Tensor),
                 f"field {fname} is {type(getattr(self, fname)).__name__}, expected a "
                 f"torch.Tensor; "
                 f"convert with torch.as_tensor(...)", TypeError)
        need(self.indptr.dtype == torch.int64 and self.indptr.dim() == 1,
             f"indptr must be a 1-D int64 tensor, got dtype {self.indptr.dtype} shape "
             f"{tuple(self.indptr.shape)}; use .to(torch.int64)", TypeError)
        need(self.indices.dtype == torch.int64 and self.indices.dim() == 1,
             f"indices must be a 1-D int64 tensor, got dtype {self.indices.dtype} shape "
             f"{tuple(self.indices.shape)}; use .to(torch.int64)", TypeError)
        n = self.num_nodes
        need(n >= 1, f"has no nodes ({self.indptr.numel()} indptr entries, {self.x.shape[0]} "
                     f"feature rows): there is nothing to train on; check that the source "
                     f"holds the graph's nodes (features and labels)")
        need(int(self.indptr[0]) == 0, f"indptr[0] = {int(self.indptr[0])}, expected 0")
        need(int(self.indptr[-1]) == self.indices.numel(),
             f"indptr[-1] = {int(self.indptr[-1])} but there are {self.indices.numel()} indices; "
             f"they must match")
        steps = self.indptr[1:] - self.indptr[:-1]
        if bool((steps < 0).any()):
            v = int(torch.nonzero(steps < 0)[0])
            raise ValueError(f"Graph {self.name!r}: indptr decreases at node {v} "
                             f"({int(self.indptr[v])} -> {int(self.indptr[v + 1])}); it must be "
                             f"non-decreasing")
        if self.indices.numel():
            lo, hi = int(self.indices.min()), int(self.indices.max())
            need(lo >= 0, f"edge source id {lo} is negative; node ids must be in [0, {n})")
            need(hi < n, f"edge source id {hi} >= num_nodes {n}; node ids must be in [0, {n}) "
                         f"(wrong num_nodes, or ids not renumbered from 0?)")
            # Row blocks of ~_VALIDATE_BLOCK edges: per-edge temporaries stay bounded.
            loops, ordered, last_key = 0, True, -1
            starts = torch.searchsorted(self.indptr, torch.arange(0, self.indices.numel(),
                                                                  _VALIDATE_BLOCK), right=True) - 1
            bounds = sorted(set(starts.tolist()) | {n})
            for v0, v1 in zip(bounds[:-1], bounds[1:]):
                e0, e1 = int(self.indptr[v0]), int(self.indptr[v1])
                dst = torch.repeat_interleave(torch.arange(v0, v1), steps[v0:v1])
                src = self.indices[e0:e1]
                loops += int((dst == src).sum())
                key = dst * n + src
                if key.numel():
                    ordered = ordered and int(key[0]) > last_key and \
                        bool((key[1:] > key[:-1]).all())
                    last_key = int(key[-1])
            need(loops == 0, f"{loops} self-loop(s) stored; the contract stores none (models add "
                             f"their own). Build with Graph.from_edge_index(...), which drops them")
            need(ordered, "edges are not in canonical CSR order or contain duplicates; build with "
                          "Graph.from_edge_index(...) which sorts and de-duplicates")
        need(self.x.dim() == 2 and self.x.shape[0] == n,
             f"x has shape {tuple(self.x.shape)}, expected [num_nodes={n}, num_features]")
        need(self.x.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16),
             f"x has dtype {self.x.dtype}, expected a float dtype; use x.float()", TypeError)
        finite = torch.isfinite(self.x)
        if not bool(finite.all()):
            bad = torch.nonzero(~finite)[0].tolist()
            raise ValueError(f"Graph {self.name!r}: x has {int((~finite).sum())} NaN/Inf value(s), "
                             f"first at node {bad[0]}, feature {bad[1]} (value "
                             f"{float(self.x[bad[0], bad[1]])}); clean or impute features first")
        need(self.y.dim() == 1 and self.y.shape[0] == n,
             f"y has shape {tuple(self.y.shape)}, expected [num_nodes={n}]")
        need(self.y.dtype == torch.int64, f"y has dtype {self.y.dtype}, expected int64; "
                                         f"use y.long()", TypeError)
        need(isinstance(self.num_classes, int) and self.num_classes >= 2,
             f"num_classes = {self.num_classes!r}, expected an int >= 2 (a node classifier "
             f"needs at least two classes among the labels)")
        if n:
            lo, hi = int(self.y.min()), int(self.y.max())
            need(lo >= 0 and hi < self.num_classes,
                 f"labels span [{lo}, {hi}] but num_classes = {self.num_classes}; labels must be "
                 f"in [0, num_classes) ("
                 + ("relabel: a negative label is no class; give an unlabelled node any class "
                    "and leave it out of every split mask, it is then never scored"
                    if lo < 0 else "relabel, or raise num_classes") + ")")
        for mname in ("train_mask", "val_mask", "test_mask"):
            m = getattr(self, mname)
            need(m.dtype == torch.bool and m.dim() == 1,
                 f"{mname} has dtype {m.dtype} shape {tuple(m.shape)}, expected a 1-D bool mask; "
                 f"index lists can be turned into masks with "
                 f"torch.zeros(N, dtype=bool)[idx] = True",
                 TypeError)
            need(m.shape[0] == n, f"{mname} has length {m.shape[0]}, expected num_nodes = {n} "
                                  f"(split covers nodes out of range)")
        need(bool(self.train_mask.any()), "train_mask selects no node; the train set must be "
                                          "non-empty")
        for a, b in (("train_mask", "val_mask"), ("train_mask", "test_mask"),
                     ("val_mask", "test_mask")):
            both = getattr(self, a) & getattr(self, b)
            if bool(both.any()):
                raise ValueError(f"Graph {self.name!r}: {a} and {b} overlap on {int(both.sum())} "
                                 f"node(s), first node {int(torch.nonzero(both)[0])}; splits must "
                                 f"be disjoint")
        return self

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_edge_index(cls, edge_index: Tensor | np.ndarray, x: Tensor | np.ndarray | None,
                        y: Tensor | np.ndarray, *, num_classes: int | None = None,
                        train_mask: Tensor | None = None, val_mask: Tensor | None = None,
                        test_mask: Tensor | None = None, undirected: bool = True,
                        name: str = "graph", split_seed: int = 0,
                        meta: dict[str, Any] | None = None,
                        sources: dict[str, str] | None = None,
                        nodes_from: str = "x") -> "Graph":
        """Build a canonical graph from a PyG-style ``[2, E]`` (source, destination) edge list.

        Self-loops and duplicate edges are dropped; ``undirected=True`` adds reverse edges.
        Give all three masks or none: without them, the split is seeded random 60/20/20
        (``split_seed``). ``x=None``: one-hot log2 degree buckets, as the file loaders give a
        graph without features. What else is accepted (bool/integer features, whole-number
        float labels, 0/1 masks) is in :mod:`quietgnn.graphinput`. ``sources``: how errors
        name each input (e.g. ``{"x": "g.npz key 'x'"}``); default ``x of graph 'name'``.
        ``nodes_from``: what fixes the number of nodes where ``x`` and ``y`` disagree
        (:func:`~quietgnn.graphinput.graph_inputs`; the files' labels: ``"y"``).
        """
        where = {k: f"{k} of graph {name!r}" for k in ("x", "y", "num_classes") + MASKS}
        where = {"graph": f"graph {name!r}", "edge_index": f"graph {name!r}", **where,
                 **(sources or {})}
        g = graph_inputs(edge_index, x, y, (train_mask, val_mask, test_mask), num_classes,
                         where, nodes_from=nodes_from)
        src, dst = g.edge_index[0], g.edge_index[1]
        if undirected:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
        keep = src != dst
        n = int(g.x.shape[0])
        indptr, indices = csr_from_edges(src[keep], dst[keep], n)
        masks = g.masks or random_split(n, seed=split_seed)
        meta = dict(meta or {}, undirected=undirected)
        if g.features != "given":
            meta.setdefault("features", g.features)
        if g.label_names is not None:
            meta.setdefault("label_names", g.label_names)    # class k is label_names[k]
        return cls(indptr=indptr, indices=indices, x=g.x, y=g.y, train_mask=masks[0],
                   val_mask=masks[1], test_mask=masks[2], num_classes=g.num_classes, name=name,
                   meta=meta).validate()

    @classmethod
    def from_pyg(cls, data: Any, *, name: str = "graph", undirected: bool | None = None,
                 num_classes: int | None = None, split_seed: int = 0) -> "Graph":
        """Convert a ``torch_geometric.data.Data``.

        Masks are taken from ``data`` (all three or none; 2-D masks, i.e. several PyG splits,
        use column 0); without them, seeded 60/20/20. Without ``x``, nodes get degree-bucket
        features (as the file loaders give them). ``undirected=None`` symmetrises the graph,
        explicitly recorded in ``meta['undirected']``.
        """
        masks = []
        for key in MASKS:
            m = getattr(data, key, None)
            if isinstance(m, Tensor) and m.dim() == 2:
                m = m[:, 0]
            masks.append(m)
        if undirected is None:
            undirected = True
        where = {k: f"data.{k} (graph {name!r})" for k in ("x", "y") + MASKS}
        return cls.from_edge_index(data.edge_index, getattr(data, "x", None),
                                   getattr(data, "y", None), num_classes=num_classes,
                                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                                   undirected=undirected, name=name, split_seed=split_seed,
                                   sources=where)

    def to_pyg(self) -> Any:
        """A ``torch_geometric.data.Data`` with the same edges (source, destination), features,
        labels and masks."""
        from torch_geometric.data import Data
        return Data(x=self.x, edge_index=self.edge_index(), y=self.y, train_mask=self.train_mask,
                    val_mask=self.val_mask, test_mask=self.test_mask, num_nodes=self.num_nodes)

    def save(self, path: str | Path) -> Path:
        """Write the graph as the ``.npz`` that ``load_dataset(path)`` reads back (keys
        ``edge_index``, ``x``, ``y``, the three masks, ``num_classes``; no pickle). The file's
        stem becomes the graph's name when it is loaded. Returns the path."""
        p = Path(path)
        if self.meta.get("labels") == "absent":
            # loaded to predict on (load_dataset(labels=False)): its labels are all 0 and its
            # split drawn; saved, it would train on them as if they were the graph's
            raise ValueError(f"Graph {self.name!r} was loaded without its labels (to predict "
                             f"on: load_dataset(..., labels=False)); it cannot be saved or "
                             f"trained on: load it with its labels")
        if p.suffix != ".npz":
            raise ValueError(f"Graph.save({str(path)!r}): the file must end in .npz (the format "
                             f"load_dataset reads); e.g. {p.with_suffix('.npz').name!r}")
        # the loader symmetrises every graph: a directed one would not come back as it was
        if not self.is_undirected():
            raise ValueError(f"Graph {self.name!r} is directed; the .npz format stores undirected "
                             f"graphs (loading adds every reverse edge). Build it with "
                             f"Graph.from_edge_index(..., undirected=True) to save it")
        p.parent.mkdir(parents=True, exist_ok=True)
        x = self.x if self.x.dtype == torch.float32 else self.x.float()
        np.savez(p, edge_index=self.edge_index().numpy(), x=x.numpy(), y=self.y.numpy(),
                 train_mask=self.train_mask.numpy(), val_mask=self.val_mask.numpy(),
                 test_mask=self.test_mask.numpy(), num_classes=np.int64(self.num_classes))
        return p

    def with_split(self, train_mask: Tensor, val_mask: Tensor, test_mask: Tensor) -> "Graph":
        """A copy with other split masks (validated)."""
        return replace(self, train_mask=train_mask, val_mask=val_mask,
                       test_mask=test_mask).validate()


def check_trainable_split(train: int, val: int, test: int, name: str, fix: str = "") -> None:
    """Refuse (``ValueError``) to train on a graph with an empty validation or test set: the
    run selects its model by validation accuracy and reports test accuracy, so it would train
    and end with "test accuracy nan (best val -1 at epoch -1)". (An empty train set is refused
    by :meth:`Graph.validate`; a graph without these splits is still fine to predict on.)
    ``fix``: how to give the graph a split where it came from (default: the loaders')."""
    empty = [what for what, n in (("train", train), ("validation", val), ("test", test))
             if n == 0]
    if empty:
        raise ValueError(f"graph {name!r} has no {' and no '.join(empty)} nodes (train/val/"
                         f"test = {train}/{val}/{test}): a run selects its model on the "
                         f"validation nodes and reports accuracy on the test nodes; " + (
                             fix or "give the graph a split with all three (its masks, or "
                             "--dataset.split per_class:K:V, or a random 60/20/20 split by "
                             "leaving its masks out)"))

