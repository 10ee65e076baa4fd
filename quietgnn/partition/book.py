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

import errno
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
from ..safefiles import outside
from ..serial import json_excerpt, loads_json
from .local import LocalPartition, iter_partitions, partition_stats
from .partitioners import partition_nodes
from .shards import PART_ARRAYS, read_part, write_part

__all__ = ["PartitionBook", "BOOK_FORMAT", "BOOK_VERSION", "make_book", "new_book_dir",
           "finish_book", "book_id_of", "replace_problem"]

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
              x_dtype: str = "float32", overwrite: bool = True) -> "PartitionBook":
        path = Path(path)
        parts = np.asarray(parts, dtype=np.int64)
        num_parts = int(parts.max()) + 1
        _check_range(graph, x_dtype)
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
                "stats": partition_stats(graph, parts)}, overwrite=overwrite)
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
            meta = loads_json(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"partition book {str(meta_path)!r} is not valid JSON ({exc}); "
                             f"the file is damaged: re-create the book with "
                             f"`quietgnn prepare`") from exc
        if not isinstance(meta, dict) or meta.get("format") != BOOK_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise ValueError(f"{str(meta_path)!r} is not a quietgnn partition book (format "
                             f"{found!r}, expected {BOOK_FORMAT!r})")
        if meta.get("version") == 1:
            graph = meta.get("graph")
            name = graph.get("name", "NAME") if isinstance(graph, dict) else "NAME"
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
        _check_fields(meta_path, meta)
        _check_manifest(meta_path, meta)
        return PartitionBook(path=path, num_parts=meta["num_parts"], method=meta["method"],
                             seed=meta["seed"], graph=meta["graph"], stats=meta["stats"],
                             files=meta["files"], book_id=meta["book_id"])

    def _checked_file(self, name: str) -> Path:
        f = self.path / name
        info = self.files.get(name)
        if info is None:
            raise ValueError(f"partition book {str(self.path)!r} does not list {name!r}")
        away = outside(self.path, name, subdirs=True)
        if away:        # a part file replaced by a link to elsewhere is never read
            raise ValueError(f"partition book {str(self.path)!r}: file name {away}; a book "
                             f"reads only files inside its directory: re-copy the book or "
                             f"re-run `quietgnn prepare`")
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
        part = read_part(self.path / prefix, stored=stored)
        self._check_part(part, rank)
        part.features_id = self.features_identity(rank)
        return part

    def features_identity(self, rank: int) -> str:
        """What a checkpoint records of rank ``rank``'s features, so that a resume on other
        features is refused (:meth:`LocalPartition.features_identity`): ``x.npy:`` and the
        part file's sha256, or ``graph:`` and the whole graph's features digest for a book
        without it; both are in ``book.json`` already (nothing is read). The file's checksum
        comes first: it is verified against the file, so an ``x.npy`` edited and re-hashed
        in the book is caught, where the graph's digest (written once by prepare) is not."""
        sha = (self.files.get(f"part-{rank}/x.npy") or {}).get("sha256")
        digest = self.graph.get("features_digest")
        return f"x.npy:{sha}" if isinstance(sha, str) or not isinstance(digest, str) \
            else f"graph:{digest}"

    def split_counts(self) -> tuple[int, int, int]:
        """The whole graph's train / val / test node counts, from ``part-0/part.json`` (a few
        bytes, checked against the manifest; the arrays are not read)."""
        meta = loads_json(self._checked_file("part-0/part.json").read_text())
        return tuple(int(meta.get(f"num_{s}_global", 0))     # type: ignore[return-value]
                     for s in ("train", "val", "test"))

    def _check_part(self, part: LocalPartition, rank: int) -> None:
        """A part's scalars against ``book.json`` (the part may be consistent in itself and
        still belong to another book, or have been edited with its checksums)."""
        g = self.graph

        def stat(key: str) -> Any:
            v = self.stats.get(key)
            return v[rank] if isinstance(v, list) and len(v) == self.num_parts else None
        pairs = [("rank", part.rank, rank), ("num_parts", part.num_parts, self.num_parts),
                 ("num_nodes_global", part.num_nodes_global, g.get("num_nodes")),
                 ("num_edges_global", part.num_edges_global, g.get("num_edges")),
                 ("num_classes", part.num_classes, g.get("num_classes")),
                 ("features (x.npy columns)", part.num_features, g.get("num_features")),
                 ("owned nodes (owned.npy)", part.n_own, stat("nodes")),
                 ("halo nodes (halo.npy)", part.n_halo, stat("halo")),
                 ("edges (indices.npy)", int(part.indices.numel()), stat("edges")),
                 ("graph_fingerprint", part.graph_fingerprint, g.get("fingerprint")),
                 ("book_id", part.book_id, self.book_id)]
        for what, have, want in pairs:
            if want is not None and have != want:
                raise ValueError(f"partition part {str(self.path / f'part-{rank}')!r} has "
                                 f"{what} = {have!r} but book.json says {want!r}: the part was "
                                 f"edited or comes from another book; re-run `quietgnn prepare`")


def _check_range(graph: Graph, x_dtype: str) -> None:
    """Features past ``x_dtype``'s range are refused before anything is written (float16
    would store 70000 as inf, and training would fail far from the cause)."""
    x = graph.x
    if x_dtype != "float16" or not x.is_floating_point():
        return      # float32 holds every finite feature Graph.validate lets through
    big = float(np.finfo(x_dtype).max)
    step = max(1, (1 << 22) // max(1, x[0].numel() if x.shape[0] else 1))
    for a in range(0, x.shape[0], step):        # in row blocks: no whole copy of x
        over = x[a:a + step].abs() > big
        if not bool(over.any()):
            continue
        r, c = (int(v) for v in over.nonzero()[0])
        r += a
        raise ValueError(f"x has value(s) beyond {x_dtype}'s range (|x| <= {big:g}), first at "
                         f"node {r}, feature {c} (value {float(graph.x[r, c])}); prepare with "
                         f"--x-dtype float32, or scale the features")


def new_book_dir(path: Path) -> Path:
    """A temporary directory beside ``path`` for a book being written (renamed into place by
    :func:`finish_book`, so a reader never sees half a book)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))


def finish_book(tmp: Path, path: Path, meta: dict[str, Any],
                files: dict[str, dict[str, Any]] | None = None, *,
                overwrite: bool = True) -> None:
    """Write ``book.json`` (``meta`` + format, version, the size and sha256 of every file in
    ``tmp``, the date) and move ``tmp`` to ``path``, replacing what was there. ``files``: the
    sizes and checksums when the writers of the files computed them (the distributed prepare:
    each rank its own part's). ``overwrite=False`` (``prepare`` without ``--overwrite``, whose
    check found ``path`` free): a graph there now was written by another prepare meanwhile,
    and is kept (``ValueError``; the caller removes ``tmp``)."""
    if files is None:
        files = {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size,
                                                 "sha256": _sha256(f)}
                 for f in sorted(tmp.rglob("*")) if f.is_file()}
    files = dict(sorted(files.items()))
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        why = replace_problem(path)
        if why:     # found there since the command checked --out: never delete it
            raise ValueError(f"{str(path)!r} {why}; it was left as it is: move those files "
                             f"away, or choose another output directory")
        if not overwrite:
            raise _written_meanwhile(path, overwrite)
    meta = {"format": BOOK_FORMAT, "version": BOOK_VERSION, **meta, "files": files,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / "book.json").write_text(json.dumps(meta, indent=1))
    if not overwrite or not path.exists():
        _move_in(tmp, path, overwrite)
        return
    # the old directory is moved aside, not removed, before the new one takes its place: a
    # crash in between leaves one whole graph (the old one beside it), never half of one
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, old / "graph")
    try:
        _move_in(tmp, path, overwrite)
    except ValueError:      # another prepare's graph took the old one's place, as this would
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _move_in(tmp: Path, path: Path, overwrite: bool) -> None:
    """``tmp`` renamed to ``path``, which is an empty directory or none: rename(2) never
    replaces a full one, so of two prepares finishing at once the second is refused even when
    both found ``path`` free a moment before."""
    try:
        os.rename(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise _written_meanwhile(path, overwrite) from None


def _written_meanwhile(path: Path, overwrite: bool) -> ValueError:
    again = "run this prepare again to replace it" if overwrite else \
        "pass --overwrite to replace it"
    return ValueError(f"--out {str(path)!r}: another prepare wrote a prepared graph there while "
                      f"this one ran (after --out was checked); that one was kept and this "
                      f"one's output removed: {again}, or choose another --out")


def replace_problem(path: Path) -> str:
    """Why the existing directory ``path`` is not a prepared graph that may be replaced by a
    new one ("" when it is): its ``book.json`` must parse as a quietgnn partition book (this
    version's or version 1) and the directory hold nothing but what a prepare writes (the
    files the book lists, their directories and ``book.json``; no symbolic link). Anything
    else may be the user's own files, which a replacement would delete."""
    if path.is_symlink() or not path.is_dir():
        return "is a symbolic link or no directory (prepare replaces only a directory it wrote)"
    meta: Any = None
    try:
        meta = loads_json((path / "book.json").read_text())
        why = "" if isinstance(meta, dict) and meta.get("format") == BOOK_FORMAT and \
            meta.get("version") in (1, BOOK_VERSION) and isinstance(meta.get("files"), dict) \
            else (f"format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                  f"expected {BOOK_FORMAT!r} of version 1 or {BOOK_VERSION} with its files")
    except FileNotFoundError:
        return f"holds {_entries(path, set(), set())} and no book.json"
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = f"unreadable: {type(exc).__name__}"
    if why:         # not a book: every entry is the user's as far as anyone knows
        return (f"holds {_entries(path, set(), set())}, and its book.json is not a quietgnn "
                f"partition book ({why})")
    # only the names a prepare writes count as its own: a crafted book listing the user's
    # files (with their right checksums) must not make --overwrite delete them
    files = {n for n in meta["files"] if isinstance(n, str) and _PREPARED.fullmatch(n) and
             not outside(path, n, subdirs=True)} | {"book.json"}
    dirs = {Path(n).parent.as_posix() for n in files} - {"."}
    extra = _entries(path, files, dirs)
    return f"holds {extra} beside its prepared graph, which prepare does not write" \
        if extra else ""


#: every file name a prepare writes (this version's part directories, version 1's archives)
_PREPARED = re.compile(r"assignment\.npy|part-\d+\.pt|part-\d+/(part\.json|(%s)\.npy)"
                       % "|".join(PART_ARRAYS))


def _entries(path: Path, files: set[str], dirs: set[str]) -> str:
    """The entries under ``path`` other than ``files`` and ``dirs`` (relative POSIX names;
    symbolic links always count), said in a few words ("" when there are none)."""
    extra = []
    for top, subdirs, names in os.walk(path):       # links to directories are not followed
        rel = Path(top).relative_to(path)
        for name in sorted(subdirs) + sorted(names):
            r, full = (rel / name).as_posix(), Path(top) / name
            known = dirs if name in subdirs else files
            if r not in known or full.is_symlink():
                extra.append(r + ("/" if name in subdirs else ""))
        subdirs[:] = [d for d in subdirs if (rel / d).as_posix() in dirs]
    if not extra:
        return ""
    shown = ", ".join(repr(e) for e in extra[:5]) + (f" and {len(extra) - 5} more"
                                                     if len(extra) > 5 else "")
    return f"{len(extra)} entr{'y' if len(extra) == 1 else 'ies'} ({shown})"


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


#: the types of ``book.json``'s fields and of its ``graph`` entry's (where present)
_FIELDS = {"method": str, "seed": int, "graph": dict, "stats": dict, "files": dict,
           "book_id": str}
_GRAPH_FIELDS = {"name": str, "num_nodes": int, "num_edges": int, "num_features": int,
                 "num_classes": int, "fingerprint": str, "features_digest": str}


def _check_fields(meta_path: Path, meta: dict[str, Any]) -> None:
    """Every field of ``book.json`` of its type, and every file it lists a plain relative
    name inside the book with a size and checksum (one line naming the file and the field)."""
    fix = "book.json was edited or is damaged: restore it, or re-create the book with " \
          "`quietgnn prepare`"

    def check(key: str, v: Any, want: type) -> None:
        if not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise ValueError(f"partition book {str(meta_path)!r}: {key} = {json_excerpt(v)} "
                             f"({type(v).__name__}), expected {_TYPE_WORDS[want]}; {fix}")
    for key, want in _FIELDS.items():
        check(key, meta[key], want)
    for key, want in _GRAPH_FIELDS.items():
        if key in meta["graph"]:
            check(f"graph.{key}", meta["graph"][key], want)
    for name, info in meta["files"].items():
        # the spelling here; links are resolved where a file is read (_checked_file)
        away = outside(meta_path.parent, name, subdirs=True, resolve=False)
        if away:
            raise ValueError(f"partition book {str(meta_path)!r}: file name {away}; {fix}")
        if not isinstance(info, dict) or not isinstance(info.get("bytes"), int) or \
                not isinstance(info.get("sha256"), str):
            raise ValueError(f"partition book {str(meta_path)!r}: files[{name!r}] = "
                             f"{json_excerpt(info)}, expected {{\"bytes\": int, \"sha256\": "
                             f"str}}; {fix}")


_TYPE_WORDS = {str: "a string", int: "an integer", dict: "a JSON object"}


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
    # compared without building range(n): an edited num_parts of 10**12 must not allocate
    if len(listed) != n or any(k != i for i, k in enumerate(listed)):
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
              x_dtype: str = "float32", overwrite: bool = True,
              **options: Any) -> PartitionBook:
    """Partition ``graph`` and write the book (convenience for CLI and launcher;
    ``overwrite``: :func:`finish_book`'s)."""
    parts = partition_nodes(graph, method, num_parts, seed=seed, **options)
    clean = {k: v for k, v in options.items() if v is not None and k != "assignment"}
    return PartitionBook.write(path, graph, parts, method, seed, options=clean, x_dtype=x_dtype,
                               overwrite=overwrite)
