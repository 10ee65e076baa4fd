"""The partition book a run reads, resolved before any worker starts.

A configured book (``--book``, ``--data``) is checked against the requested dataset; without
one the launcher partitions the graph once into a cache directory keyed by everything that
determines the assignment (:func:`partition_key`), so a second run of the same graph and
partitioner reuses it. Under torchrun nothing here runs before the workers: each rank checks a
configured book without loading the graph, or partitions in process.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import heap
from ..heap import peak_rss_mb, rss_mb
from ..safefiles import WriteError, atomic_write
from ..serial import loads_json

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["cache_dir", "dataset_identity_of", "partition_key", "cached_book_path",
           "resolve_book", "prepare_book", "check_book_dataset", "check_book_partition",
           "release_free_memory"]


def cache_dir() -> Path:
    """Where the launcher keeps partition books (:func:`quietgnn.datasets.pyg.cache_root`)."""
    from ..datasets.pyg import cache_root
    return cache_root()


def dataset_identity_of(cfg: RunConfig) -> dict[str, Any]:
    """:func:`quietgnn.datasets.dataset_identity` of the graph ``cfg`` asks for (not loaded)."""
    from ..datasets import dataset_identity
    return dataset_identity(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                            split_seed=cfg.dataset.split_seed, split=cfg.dataset.split)


def partition_key(cfg: RunConfig, earlier: bool = False) -> str:
    """The cache key of the book the launcher makes for ``cfg``: a hash of everything that
    determines the assignment, the content of the files read included. ``earlier``: the key
    a graph file's book had before it was keyed by the file's name (the path as given), which
    :func:`resolve_book` still reuses."""
    from ..datasets import dataset_files
    # the standard split is left out of the key: books cached before dataset.split keep theirs
    data = {k: v for k, v in asdict(cfg.dataset).items() if (k, v) != ("split", "standard")}
    key_src = {"dataset": data, "method": cfg.partition_method,
               "parts": cfg.num_parts, "seed": cfg.partition.seed,
               "clusters": cfg.partition.clusters, "file": cfg.partition.file,
               "root": str(Path(cfg.dataset.root).resolve()) if cfg.dataset.root else None}
    if cfg.dataset.name == "synthetic":
        key_src["synthetic"] = asdict(cfg.synthetic)
    # The content of every file the graph and the assignment are read from: a file replaced
    # in place (same path, even the same size and mtime) gets a new book, not the old one.
    # A graph file is keyed by its name and content, not where it lies: the Python API stages
    # an in-memory graph in each run's own directory, and each call made a book of its own.
    # (A named dataset's files are keyed by their path, as they always were: its root is in the
    # key anyway, and the books cached before stay theirs.)
    by_name = Path(cfg.dataset.name).is_file() and not earlier
    if by_name:
        data["name"] = Path(cfg.dataset.name).name
    key_src["content"] = [[f.name if by_name else str(f), _content_sha256(f)]
                          for f in dataset_files(cfg.dataset.name, cfg.dataset.root)]
    if cfg.partition.file:
        f = Path(cfg.partition.file)
        key_src["file_sha256"] = _content_sha256(f) if f.is_file() else None
    blob = json.dumps(key_src, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def cached_book_path(cfg: RunConfig, key: str) -> Path:
    return cache_dir() / "books" / f"{Path(cfg.dataset.name).name}-{cfg.partition_method}-" \
                                   f"p{cfg.num_parts}-{key}"


def resolve_book(cfg: RunConfig, log: Callable[[str], None] = print,
                 identity: Optional[dict[str, Any]] = None) -> tuple[Path, Optional[str]]:
    """The partition book for ``cfg`` and its cache key: the configured book (key ``None``),
    checked against the dataset (``identity``: :func:`dataset_identity_of`, computed when not
    given), or a cached one created on first use."""
    from ..partition import PartitionBook
    if cfg.partition.book:
        book = PartitionBook.open(cfg.partition.book)
        if book.num_parts != cfg.num_parts:
            raise ValueError(f"partition book {cfg.partition.book!r} has {book.num_parts} parts "
                             f"but the run asks for {cfg.num_parts}; pass --parts "
                             f"{book.num_parts} or re-partition")
        _check_book_files(book)
        check_book_partition(book, cfg)
        if not cfg.dataset.prepared:   # prepared: the book *is* the dataset
            check_book_dataset(book, cfg, load=True, identity=identity)
        return Path(cfg.partition.book), None
    key = partition_key(cfg)
    path = cached_book_path(cfg, key)
    if not path.is_dir() and Path(cfg.dataset.name).is_file():
        earlier = cached_book_path(cfg, partition_key(cfg, earlier=True))
        if _usable(earlier):       # the same graph and assignment, cached before the rekeying
            return earlier, earlier.name.rsplit("-", 1)[-1]
    from ..partition.book import BOOK_VERSION
    if path.is_dir() and _other_version(path):
        # another quietgnn's book (a host of that version sharing the cache may be training
        # on it): left as it is, and this version's kept beside it
        path = path.with_name(f"{path.name}-v{BOOK_VERSION}")
    if path.is_dir():
        try:
            PartitionBook.open(path)
            return path, key
        except ValueError:
            # a damaged entry of quietgnn's own cache: rebuilt below, from nothing (writing
            # a book never replaces a directory that is not a whole book: it may be a user's)
            shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    # loaded outside the write's error handling: a full disk while a dataset downloads is
    # its root's, not the cache's
    graph = _load_graph(cfg)
    name, nodes, edges = graph.name, graph.num_nodes, graph.num_edges
    try:
        _build_book(cfg, path, graph)
    except OSError as exc:
        from ..safefiles import disk_reason, free_space_note
        full = disk_reason(exc)
        if full is not None and full[0] != errno.EROFS and not _outside_cache(exc.filename):
            # (the book is the one thing written here: a full disk is the cache's, whoever's
            # words the writer used; numpy's short write names no file)
            raise WriteError(full[0], f"could not write the partition book into the cache "
                                      f"{str(path.parent)!r}: {full[1]}"
                                      f"{free_space_note(path.parent)}; free space there, or "
                                      f"set QUIETGNN_CACHE to a directory with room (or pass "
                                      f"--book DIR of a prepared graph); nothing half-written "
                                      f"is kept") from exc
        if not _in_cache(exc.filename):
            raise
        # the cache, not the run or its data: say which setting moves it
        raise ValueError(f"cannot write the partition book into the cache {str(path.parent)!r} "
                         f"({exc.strerror}): set QUIETGNN_CACHE to a directory you may write "
                         f"(or pass --book DIR of a prepared graph)") from exc
    # Let the graph go and hand its pages back to the OS so that the launcher, which idles
    # while the workers train, does not sit on the heap that loading and partitioning left
    # behind (hundreds of MiB at 10^7 edges).
    del graph
    release_free_memory()
    log(f"partitioned {name} ({nodes} nodes, {edges} edges) with {cfg.partition_method} into "
        f"{cfg.num_parts} in {time.perf_counter() - t0:.1f}s -> {path} (peak memory "
        f"{peak_rss_mb():.0f} MiB, {rss_mb():.0f} MiB after)")
    return path, key


def _in_cache(name: Any) -> bool:
    """Whether ``name`` (an ``OSError``'s file) is the cache directory, inside it, or above it:
    creating the cache (``mkdir(parents=True)``) names the first missing directory it could
    not make, ``~/.cache`` under a read-only home."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    path, cache = Path(os.path.abspath(name)), Path(os.path.abspath(cache_dir()))
    return path == cache or cache in path.parents or path in cache.parents


def _usable(path: Path) -> bool:
    from ..partition import PartitionBook
    try:
        return path.is_dir() and PartitionBook.open(path) is not None
    except ValueError:
        return False


def _other_version(path: Path) -> bool:
    """Whether the cached entry ``path`` is whole but of another format version than this
    quietgnn's (a damaged one is this version's to rebuild)."""
    from ..partition.book import BOOK_VERSION
    try:
        version = loads_json((path / "book.json").read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(version, int) and version != BOOK_VERSION


def _outside_cache(name: Any) -> bool:
    """Whether ``name`` (an ``OSError``'s file) names a file elsewhere than the cache."""
    return isinstance(name, (str, os.PathLike)) and not _in_cache(name)


def prepare_book(cfg: RunConfig, log: Callable[[str], None] = print) -> Path:
    """The partition book for ``cfg``: the configured one, or a cached one keyed by everything
    that determines the assignment (created on first use)."""
    return resolve_book(cfg, log)[0]


def _content_sha256(path: Path) -> str:
    """sha256 of ``path``'s bytes (streamed), remembered in ``<cache>/file-hashes.json`` per
    (resolved path, size, mtime_ns, ctime_ns, inode): a run whose cached book is reused then
    costs one ``stat`` per dataset file instead of re-reading gigabytes. ctime is part of the
    key because mtime is not evidence: a file rewritten in place and given its old mtime back
    (``touch -r``, ``os.utime``, ``cp -p``, ``rsync -t``) keeps size, mtime and inode, but every
    write or utime sets ctime to now, and ctime cannot be set back from user space."""
    from ..partition.book import _sha256
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    table_path = cache_dir() / "file-hashes.json"
    try:
        table = loads_json(table_path.read_text())
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    entry = table.get(str(path))
    if isinstance(entry, dict) and entry.get("stat") == stamp and \
            isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = _sha256(path)
    table[str(path)] = {"stat": stamp, "sha256": digest}
    try:   # best effort, atomic (a concurrent run's entry may be lost: it is re-hashed later)
        table_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(table_path, json.dumps(table).encode())    # never through a planted link
    except OSError:
        pass
    return digest


def check_book_partition(book: Any, cfg: RunConfig) -> None:
    """A configured book's partition is the run's, whatever the command line says: an explicit
    ``--partitioner`` or ``--partition.file`` must be the book's (they were silently ignored),
    and the residency level is checked against the book's partitioner, not the command line's
    (``--partitioner given`` beside a METIS book passed a residency run that placed nodes)."""
    from ..partition.partitioners import read_assignment
    from ..strategies.base import check_residency
    where, part = str(book.path), cfg.partition
    if part.method and part.method != book.method:
        raise ValueError(f"--partitioner {part.method} does not match the partition book "
                         f"{where!r}, which was partitioned with {book.method}; leave out "
                         f"--partitioner, or pass a book made with it")
    if part.file and (book.method != "given" or not _same_assignment(
            read_assignment(part.file), book.mapped("assignment.npy"))):
        raise ValueError(f"--partition.file {str(part.file)!r} is not the assignment the "
                         f"partition book {where!r} was made with ({book.method}); leave out "
                         f"--partition.file, or pass a book made from that file")
    check_residency(cfg.strategy_cls, cfg.runtime.residency, book.method)


def _same_assignment(given: Any, have: Any) -> bool:
    """``given`` equals the mapped ``have``, compared in blocks (``have`` is never read whole)."""
    import numpy as np
    given = np.asarray(given).reshape(-1)
    if given.shape != have.shape:
        return False
    step = 1 << 22
    return all(np.array_equal(given[i:i + step], have[i:i + step])
               for i in range(0, len(have), step))


def check_book_dataset(book: Any, cfg: RunConfig, load: bool,
                       identity: Optional[dict[str, Any]] = None) -> None:
    """Refuse a partition book made from another graph than the one ``cfg`` asks for (a Cora
    book run as ``--dataset citeseer`` would train on Cora and label the run CiteSeer).

    First what is known without loading (:func:`quietgnn.datasets.dataset_identity`: the
    name; for synthetic also its sizes, spec and split seed); then, with ``load``, the loaded
    graph's sizes and fingerprint (catches an edited file or another split). The launcher
    checks with ``load=True`` before any worker starts; under torchrun each rank checks
    without loading (the point of a book there is not to load the graph). ``identity``: the
    run plan's :func:`dataset_identity_of`, computed when not given."""
    have = book.graph if isinstance(book.graph, dict) else {}
    want = dataset_identity_of(cfg) if identity is None else identity
    diffs = _identity_diffs(have, want)
    if have and want and have.get("split", "standard") != want.get("split", "standard"):
        # a book records a split only when it is not the standard one
        diffs.append(f"dataset.split: book {have.get('split', 'standard')!r}, dataset "
                     f"{want.get('split', 'standard')!r}")
    if not diffs and load:
        from ..datasets import load_dataset
        graph = load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                             split_seed=cfg.dataset.split_seed, split=cfg.dataset.split)
        want = {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "num_features": graph.num_features, "num_classes": graph.num_classes}
        diffs = _identity_diffs(have, want)
        if not diffs and "fingerprint" in have:
            fp = graph.fingerprint()
            if fp != have["fingerprint"]:
                diffs = [f"fingerprint: book {have['fingerprint']}, dataset {fp} (same name and "
                         f"sizes, other edges, labels or split: an edited file, another "
                         f"split_seed or another dataset.split)"]
        # books written before the features were hashed (or out of core) have no digest
        if not diffs and "features_digest" in have:
            fd = graph.features_digest()
            if fd != have["features_digest"]:
                diffs = [f"features: book {have['features_digest']}, dataset {fd} (same "
                         f"graph, other feature values: an edited feature file)"]
        del graph
        release_free_memory()
    if diffs:
        desc = f"{have.get('name')!r}"
        if "num_nodes" in have and "num_edges" in have:
            desc += f" ({have['num_nodes']} nodes, {have['num_edges']} edges)"
        raise ValueError(
            f"partition book {str(book.path)!r} was made from graph {desc}, but this run asks "
            f"for dataset {cfg.dataset.name!r}: {'; '.join(diffs)}. Pass the dataset the book "
            f"was made from ({have.get('name')!r}, with the options it was partitioned with), "
            f"or partition "
            f"{cfg.dataset.name!r} for this run (`quietgnn prepare ... --out DIR`, or leave "
            f"out --book and the launcher partitions it)")


def _identity_diffs(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """'key: book X, dataset Y' for every key known on both sides that differs."""
    diffs = []
    for k, w in want.items():
        if k not in have:
            continue
        h = have[k]
        if isinstance(h, dict) and isinstance(w, dict):
            sub = [f"{k}.{kk}: book {h[kk]!r}, dataset {w[kk]!r}" for kk in sorted(set(h) & set(w))
                   if h[kk] != w[kk]]
            diffs += sub
        elif h != w:
            diffs.append(f"{k}: book {h!r}, dataset {w!r}")
    return diffs


def _load_graph(cfg: RunConfig) -> Any:
    from ..datasets import load_dataset
    return load_dataset(cfg.dataset.name, cfg.dataset.root, synthetic=cfg.synthetic,
                        split_seed=cfg.dataset.split_seed, split=cfg.dataset.split)


def _build_book(cfg: RunConfig, path: Path, graph: Any = None) -> None:
    """The book of ``cfg``'s graph (``graph``, or loaded) written at ``path``."""
    from ..partition import PartitionBook, make_book
    graph = _load_graph(cfg) if graph is None else graph
    try:
        # never replacing an entry: another run's workers may be reading it already
        make_book(path, graph, cfg.partition_method, cfg.num_parts, seed=cfg.partition.seed,
                  clusters=cfg.partition.clusters, file=cfg.partition.file, overwrite=False)
    except ValueError:
        try:    # a run of the same key wrote it meanwhile: the same graph and assignment
            PartitionBook.open(path)
        except ValueError:
            pass
        else:
            return
        raise


def release_free_memory() -> None:
    """Collect garbage and return freed heap pages to the OS (:func:`quietgnn.heap.trim`):
    the many mid-sized tensors of a graph pipeline leave a fragmented heap that otherwise
    stays resident."""
    import gc
    gc.collect()
    heap.trim()


def _check_book_files(book: Any) -> None:
    """Missing or truncated part files are found here, before any worker starts (a cheap size
    check; each worker verifies its own file's checksum when it loads it)."""
    for name, info in sorted(book.files.items()):
        f = Path(book.path) / name
        if not f.is_file():
            raise ValueError(f"partition file {str(f)!r} is missing (listed in book.json); copy "
                             f"it from where the book was created or re-run `quietgnn prepare`")
        size = f.stat().st_size
        if size != info.get("bytes"):
            raise ValueError(f"partition file {str(f)!r} has {size} bytes, book.json records "
                             f"{info.get('bytes')}: it is truncated or was replaced; re-copy it "
                             f"or re-run `quietgnn prepare`")
