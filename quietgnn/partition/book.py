"""The partition book: which node lives where, on disk, versioned.

Layout of a book directory (written atomically: a temp directory renamed into place)::

    book.json        format, version, num_parts, method, seed, graph identity, stats, and the
                     size + sha256 of every file below
    assignment.npy   int64 [N] part of every node
    part-<k>/        rank k's LocalPartition as plain .npy arrays + part.json
                     (:mod:`~quietgnn.partition.shards`; memory-mapped by the worker)

A multi-host run reads ``book.json`` and maps its own ``part-<rank>/`` only. Every way a book
can be unusable (missing, truncated, edited, other version, other world size) gives a
``ValueError`` naming the file, what was found and what to do. Version 1 books (one pickled
torch archive per part) are refused with the command that rewrites them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ..graph import Graph
from .local import LocalPartition, iter_partitions, partition_stats
from .partitioners import partition_nodes
from .shards import PART_ARRAYS, read_part, write_part

__all__ = ["PartitionBook", "BOOK_FORMAT", "BOOK_VERSION", "make_book", "new_book_dir",
           "finish_book", "book_id_of"]

BOOK_FORMAT = "quietgnn-partition-book"
BOOK_VERSION = 2


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def book_id_of(fingerprint: str, assignment: Iterable[np.ndarray]) -> str:
    """The identity of a graph + node assignment: ``sha256(fingerprint + int64 assignment
    bytes)``, the assignment given in one or more chunks. Every producer of a partition uses
    this one function (a written book, the out-of-core prepare, a worker partitioning in
    process), so a checkpoint taken on one resumes on another for the same graph and
    assignment."""
    h = hashlib.sha256(fingerprint.encode())
    for chunk in assignment:
        h.update(np.ascontiguousarray(chunk, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass
class PartitionBook:
    """Metadata of a saved partitioning (``book.json``) plus its directory."""

    path: Path
    num_parts: int
    method: str
    seed: int
    graph: dict[str, Any]
    stats: dict[str, Any]
    files: dict[str, dict[str, Any]]
    book_id: str

    # ------------------------------------------------------------------ writing
    @staticmethod
    def write(path: str | Path, graph: Graph, parts: np.ndarray, method: str, seed: int,
              options: dict[str, Any] | None = None,
              x_dtype: str = "float32") -> "PartitionBook":
        path = Path(path)
        parts = np.asarray(parts, dtype=np.int64)
        num_parts = int(parts.max()) + 1
        fingerprint = graph.fingerprint()
        book_id = book_id_of(fingerprint, [parts])
        tmp = new_book_dir(path)
        try:
            np.save(tmp / "assignment.npy", parts)
            # one part at a time: saved, then dropped (the graph + one part in memory, not P)
            for lp in iter_partitions(graph, parts, book_id=book_id, fingerprint=fingerprint):
                write_part(tmp / f"part-{lp.rank}", lp, x_dtype=x_dtype)
                del lp
            finish_book(tmp, path, {
                "book_id": book_id, "num_parts": num_parts, "method": method, "seed": seed,
                "options": options or {}, "graph": _graph_identity(graph, fingerprint),
                "stats": partition_stats(graph, parts)})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return PartitionBook.open(path)

    # ------------------------------------------------------------------ reading
    @staticmethod
    def open(path: str | Path) -> "PartitionBook":
        path = Path(path)
        meta_path = path / "book.json"
        if not meta_path.is_file():
            raise ValueError(f"no partition book at {str(path)!r}: {meta_path.name} is missing; "
                             f"create one with `quietgnn prepare --out {path} ...`")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"partition book {str(meta_path)!r} is not valid JSON ({exc}); "
                             f"the file is damaged: re-create the book with "
                             f"`quietgnn prepare`") from exc
        if not isinstance(meta, dict) or meta.get("format") != BOOK_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise ValueError(f"{str(meta_path)!r} is not a quietgnn partition book (format "
                             f"{found!r}, expected {BOOK_FORMAT!r})")
        if meta.get("version") == 1:
            name = (meta.get("graph") or {}).get("name", "NAME")
            raise ValueError(f"partition book {str(path)!r} has version 1 (a pickled archive "
                             f"per part), this quietgnn reads version {BOOK_VERSION} "
                             f"(memory-mapped arrays); rewrite it with `quietgnn prepare "
                             f"--dataset {name} --parts {meta.get('num_parts', 'P')} "
                             f"--partitioner {meta.get('method', 'metis')} --out {path}`")
        if meta.get("version") != BOOK_VERSION:
            raise ValueError(f"partition book {str(path)!r} has version {meta.get('version')!r}, "
                             f"this quietgnn reads version {BOOK_VERSION}; re-create it with "
                             f"`quietgnn prepare`")
        for key in ("num_parts", "method", "seed", "graph", "stats", "files", "book_id"):
            if key not in meta:
                raise ValueError(f"partition book {str(meta_path)!r} lacks field {key!r}; "
                                 f"re-create it with `quietgnn prepare`")
        _check_manifest(meta_path, meta)
        return PartitionBook(path=path, num_parts=int(meta["num_parts"]), method=meta["method"],
                             seed=int(meta["seed"]), graph=meta["graph"], stats=meta["stats"],
                             files=meta["files"], book_id=meta["book_id"])

    def _checked_file(self, name: str) -> Path:
        f = self.path / name
        info = self.files.get(name)
        if info is None:
            raise ValueError(f"partition book {str(self.path)!r} does not list {name!r}")
        if not f.is_file():
            raise ValueError(f"partition file {str(f)!r} is missing; copy it from where the book "
                             f"was created or re-run `quietgnn prepare`")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise ValueError(f"partition file {str(f)!r} has {size} bytes, the book records "
                             f"{info['bytes']}: it is truncated or was replaced; re-copy it or "
                             f"re-run `quietgnn prepare`")
        if _sha256(f) != info["sha256"]:
            raise ValueError(f"partition file {str(f)!r} does not match the checksum in "
                             f"book.json: it was modified or damaged; re-run `quietgnn prepare`")
        return f

    def assignment(self) -> np.ndarray:
        return np.load(self._checked_file("assignment.npy"), allow_pickle=False)

    def mapped(self, name: str) -> np.ndarray:
        """One listed array of the book, checked against the manifest, memory-mapped read-only
        (as stored: int32 edges, fp16 features stay so; nothing is read until indexed)."""
        return np.load(self._checked_file(name), mmap_mode="r", allow_pickle=False)

    def load_part(self, rank: int, world_size: int | None = None,
                  stored: bool = False) -> LocalPartition:
        """Load one rank's partition, checking the world size against the book (``stored``:
        edges and features as stored, see :func:`~quietgnn.partition.shards.read_part`)."""
        if world_size is not None and world_size != self.num_parts:
            raise ValueError(f"world size {world_size} does not match the partition book "
                             f"{str(self.path)!r}, which has {self.num_parts} parts; run with "
                             f"{self.num_parts} processes or re-partition with --parts "
                             f"{world_size}")
        if not 0 <= rank < self.num_parts:
            raise ValueError(f"rank {rank} is outside the book's {self.num_parts} parts")
        # every file of this part against the manifest (size, then sha256) before it is mapped;
        # one line on failure: the launcher reports a worker's ValueError as an input error
        # (every file the part is read from must be listed: an unlisted one is never mapped)
        prefix = f"part-{rank}/"
        for name in [f"{prefix}part.json"] + [f"{prefix}{a}.npy" for a in PART_ARRAYS]:
            if name not in self.files:
                raise ValueError(f"partition book {str(self.path)!r} does not list {name}; "
                                 f"book.json was edited or is from another version: re-run "
                                 f"`quietgnn prepare`")
            self._checked_file(name)
        return read_part(self.path / prefix, stored=stored)


def new_book_dir(path: Path) -> Path:
    """A temporary directory beside ``path`` for a book being written (renamed into place by
    :func:`finish_book`, so a reader never sees half a book)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))


def finish_book(tmp: Path, path: Path, meta: dict[str, Any],
                files: dict[str, dict[str, Any]] | None = None) -> None:
    """Write ``book.json`` (``meta`` + format, version, the size and sha256 of every file in
    ``tmp``, the date) and move ``tmp`` to ``path``, replacing what was there. ``files``: the
    sizes and checksums when the writers of the files computed them (the distributed prepare:
    each rank its own part's)."""
    if files is None:
        files = {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size,
                                                 "sha256": _sha256(f)}
                 for f in sorted(tmp.rglob("*")) if f.is_file()}
    files = dict(sorted(files.items()))
    meta = {"format": BOOK_FORMAT, "version": BOOK_VERSION, **meta, "files": files,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / "book.json").write_text(json.dumps(meta, indent=1))
    if not path.exists():
        os.replace(tmp, path)
        return
    # the old directory is moved aside, not removed, before the new one takes its place: a
    # crash in between leaves one whole graph (the old one beside it), never half of one
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, old / "graph")
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _graph_identity(graph: Graph, fingerprint: str) -> dict[str, Any]:
    """``book.json``'s ``graph`` entry: what a run checks its requested dataset against
    (the keys of :func:`quietgnn.datasets.dataset_identity`, plus sizes and fingerprint)."""
    ident: dict[str, Any] = {"name": graph.name, "num_nodes": graph.num_nodes,
                             "num_edges": graph.num_edges, "num_features": graph.num_features,
                             "num_classes": graph.num_classes, "fingerprint": fingerprint,
                             "features_digest": graph.features_digest()}
    if graph.meta.get("split") == "random" and "split_seed" in graph.meta:
        ident["split_seed"] = graph.meta["split_seed"]      # the masks in the parts depend on it
    if str(graph.meta.get("split", "")).startswith("per_class:"):    # dataset.split
        ident["split"], ident["split_seed"] = graph.meta["split"], graph.meta["split_seed"]
    if isinstance(graph.meta.get("synthetic"), dict):
        ident["synthetic"] = graph.meta["synthetic"]        # the name alone does not say which
    return ident


def _check_manifest(meta_path: Path, meta: dict[str, Any]) -> None:
    """``num_parts`` against what the rest of ``book.json`` describes: the parts it lists
    (exactly ``part-0/`` .. ``part-<P-1>/``) and the per-part statistics. An edited or
    mixed-up manifest is named here instead of failing inside a collective with P ranks."""
    fix = ("book.json was edited or mixed up with another book's: restore it, or re-create "
           "the book with `quietgnn prepare`")
    n = meta["num_parts"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"partition book {str(meta_path)!r} has num_parts = {n!r}, expected an "
                         f"int >= 1; {fix}")
    files = meta["files"]
    if not isinstance(files, dict):
        raise ValueError(f"partition book {str(meta_path)!r}: 'files' is "
                         f"{type(files).__name__}, expected a mapping of file names; {fix}")
    listed = sorted(int(m.group(1)) for m in
                    (re.fullmatch(r"part-(\d+)/part\.json", f) for f in files) if m)
    if listed != list(range(n)):
        shown = ", ".join(f"part-{k}/" for k in listed[:6]) + (", ..." if len(listed) > 6 else "")
        raise ValueError(f"partition book {str(meta_path)!r} says num_parts = {n} but lists "
                         f"{len(listed)} part(s) ({shown or 'none'}), expected part-0/ .. "
                         f"part-{n - 1}/; {fix}")
    stats = meta["stats"]
    if isinstance(stats, dict):
        if "num_parts" in stats and stats["num_parts"] != n:
            raise ValueError(f"partition book {str(meta_path)!r} says num_parts = {n} but its "
                             f"stats describe {stats['num_parts']!r} parts; {fix}")
        for key in ("nodes", "edges", "halo"):
            if isinstance(stats.get(key), list) and len(stats[key]) != n:
                raise ValueError(f"partition book {str(meta_path)!r} says num_parts = {n} but "
                                 f"stats.{key} has {len(stats[key])} entries; {fix}")
        graph = meta["graph"]
        nodes = stats.get("nodes")
        if isinstance(graph, dict) and isinstance(graph.get("num_nodes"), int) and \
                isinstance(nodes, list) and all(isinstance(x, int) for x in nodes) and \
                sum(nodes) != graph["num_nodes"]:
            raise ValueError(f"partition book {str(meta_path)!r}: its parts hold {sum(nodes)} "
                             f"nodes (stats.nodes) but graph.num_nodes = {graph['num_nodes']}; "
                             f"{fix}")


def make_book(path: str | Path, graph: Graph, method: str, num_parts: int, seed: int = 0,
              x_dtype: str = "float32", **options: Any) -> PartitionBook:
    """Partition ``graph`` and write the book (convenience for CLI and launcher)."""
    parts = partition_nodes(graph, method, num_parts, seed=seed, **options)
    clean = {k: v for k, v in options.items() if v is not None and k != "assignment"}
    return PartitionBook.write(path, graph, parts, method, seed, options=clean, x_dtype=x_dtype)
