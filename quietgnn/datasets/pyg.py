"""Planetoid (Cora, CiteSeer, PubMed), Amazon (Computers, Photo) and Coauthor (CS, Physics)
through PyG's own dataset classes, without ever writing into the user's data folder.

PyG writes a ``processed/`` folder next to ``raw/``, which fails on a read-only root (a shared
data folder) and litters one that is not. So the dataset's ``raw/`` files are copied into a
cache directory (``$QUIETGNN_CACHE`` or ``~/.cache/quietgnn``, under ``pyg/<key>/``, the key
derived from the resolved root so two roots never share a cache entry) and PyG reads, and
processes, only that copy. The copy is refreshed when the source files change (size/mtime).

``torch_geometric`` is imported inside functions: it takes seconds to import and
``import quietgnn`` must stay cheap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..graph import Graph

__all__ = ["PYG_DATASETS", "load_pyg", "cache_root"]


@dataclass(frozen=True)
class _Spec:
    family: str          # PyG class: Planetoid | Amazon | Coauthor
    folder: str          # dataset folder name PyG expects under the root (holds raw/)
    family_dir: str      # conventional parent folder (root may point one level higher)
    raw_files: tuple[str, ...]
    description: str

    @property
    def split(self) -> str:
        return "public" if self.family == "Planetoid" else "random"


def _planetoid(folder: str, desc: str) -> _Spec:
    stem = folder.lower()
    files = tuple(f"ind.{stem}.{p}" for p in ("x", "tx", "allx", "y", "ty", "ally", "graph",
                                              "test.index"))
    return _Spec("Planetoid", folder, "planetoid", files, desc)


#: lower-case name -> how to find and load it
PYG_DATASETS: dict[str, _Spec] = {
    "cora": _planetoid("Cora", "Planetoid citation graph, 2,708 nodes, 7 classes, public split"),
    "citeseer": _planetoid("CiteSeer", "Planetoid citation graph, 3,327 nodes, 6 classes, "
                                       "public split"),
    "pubmed": _planetoid("PubMed", "Planetoid citation graph, 19,717 nodes, 3 classes, "
                                   "public split"),
    "computers": _Spec("Amazon", "Computers", "amazon", ("amazon_electronics_computers.npz",),
                       "Amazon co-purchase graph, 13,752 nodes, 10 classes, random 60/20/20"),
    "photo": _Spec("Amazon", "Photo", "amazon", ("amazon_electronics_photo.npz",),
                   "Amazon co-purchase graph, 7,650 nodes, 8 classes, random 60/20/20"),
    "cs": _Spec("Coauthor", "CS", "coauthor", ("ms_academic_cs.npz",),
                "Coauthor co-authorship graph, 18,333 nodes, 15 classes, random 60/20/20"),
    "physics": _Spec("Coauthor", "Physics", "coauthor", ("ms_academic_phy.npz",),
                     "Coauthor co-authorship graph, 34,493 nodes, 5 classes, random 60/20/20"),
}


def cache_root() -> Path:
    """``$QUIETGNN_CACHE`` or ``~/.cache/quietgnn`` (the same rule as the launcher's cache)."""
    return Path(os.environ.get("QUIETGNN_CACHE", Path.home() / ".cache" / "quietgnn"))


def _child(parent: Path, name: str) -> Path | None:
    """``parent/name`` matched case-insensitively (users write ``cora/`` as often as ``Cora/``)."""
    exact = parent / name
    if exact.is_dir():
        return exact
    if parent.is_dir():
        for p in parent.iterdir():
            if p.name.lower() == name.lower() and p.is_dir():
                return p
    return None


def find_raw_dir(spec: _Spec, root: Path) -> Path | None:
    """The folder holding all of ``spec.raw_files``, or None.

    Accepted roots, for Cora: ``<root>/Cora/raw`` (PyG's own layout), ``<root>/planetoid/
    Cora/raw`` (root one level higher, e.g. ../shared/data) and ``<root>/raw`` with root =
    the Cora folder itself.
    """
    candidates = []
    for base in (root, _child(root, spec.family_dir)):
        ds = _child(base, spec.folder) if base is not None else None
        if ds is not None:
            candidates.append(ds / "raw")
    if root.name.lower() == spec.folder.lower():
        candidates.append(root / "raw")
    for raw in candidates:
        if all((raw / f).is_file() for f in spec.raw_files):
            return raw
    return None


def _sync_raw(src: Path, dst_ds: Path, files: tuple[str, ...]) -> None:
    """Copy ``files`` from ``src`` into ``dst_ds/raw`` unless an identical copy is there; a
    changed source also drops the stale ``processed/`` folder."""
    stamp = "\n".join(f"{f} {(src / f).stat().st_size} {(src / f).stat().st_mtime_ns}"
                      for f in files)
    stamp_file = dst_ds / "source.txt"
    if stamp_file.is_file() and stamp_file.read_text() == stamp and \
            all((dst_ds / "raw" / f).is_file() for f in files):
        return
    shutil.rmtree(dst_ds, ignore_errors=True)
    tmp = dst_ds.with_name(dst_ds.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "raw").mkdir(parents=True)
    for f in files:
        shutil.copyfile(src / f, tmp / "raw" / f)   # copyfile: no permission bits (read-only src)
    (tmp / "source.txt").write_text(stamp)
    try:
        tmp.rename(dst_ds)       # atomic: concurrent workers never see a half-copied folder
    except OSError:              # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)


def _missing_error(spec: _Spec, root: Path, cause: BaseException | None) -> ValueError:
    expected = root / spec.folder / "raw"
    why = f" (download failed: {type(cause).__name__}: {cause})" if cause else ""
    return ValueError(
        f"dataset {spec.folder!r}: raw files not found under root {str(root)!r} and could not "
        f"be downloaded{why}. Put these files in {str(expected)!r}: {', '.join(spec.raw_files)} "
        f"(or pass --root pointing at the folder that contains {spec.folder}/raw/, or at its "
        f"parent holding {spec.family_dir}/{spec.folder}/raw/).")


def _cache_entry(spec: _Spec, source: Path) -> Path:
    key = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    return cache_root() / "pyg" / f"{spec.family.lower()}-{key}"


@contextmanager
def _locked(cache: Path):
    """Hold an exclusive lock on ``cache`` while its raw copy is refreshed and PyG processes
    it: ranks of one run (or runs on emulated hosts) that share a cache and start together
    would otherwise read a ``processed/`` file another rank is still writing (an ``EOFError``
    from ``torch.load``), or delete a copy another rank is reading."""
    try:
        import fcntl
    except ImportError:          # not POSIX: no lock (the race stays, as PyG has it)
        yield
        return
    with open(cache / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _open(spec: _Spec, cache: Path, root: Path, raw: Path | None):
    import torch_geometric.datasets as pyg_datasets
    cls = getattr(pyg_datasets, spec.family)
    try:
        # with raw/ in place PyG only processes; without it, this is where it downloads
        return cls(str(cache), spec.folder)
    except Exception as exc:  # noqa: BLE001 - offline downloads fail in many ways (URLError,
        # socket errors, fsspec/aiohttp errors): all mean "the raw files are not there"
        if raw is None:
            shutil.rmtree(cache / spec.folder, ignore_errors=True)   # no half-downloads kept
            raise _missing_error(spec, root, exc) from exc
        raise


def load_pyg(name: str, root: str | os.PathLike, *, split_seed: int = 0) -> Graph:
    """Load a PyG dataset as an undirected :class:`Graph`.

    Split: the Planetoid public split (20 per class / 500 / 1000) for Cora, CiteSeer and
    PubMed; seeded random 60/20/20 (``split_seed``) for Amazon and Coauthor, which have no
    standard split. Raw files missing under ``root`` are downloaded into the cache (when
    online and ``QUIETGNN_OFFLINE`` is unset); failing that, the error says where to put them.
    """
    spec = PYG_DATASETS[name.lower()]
    root = Path(root).expanduser().resolve()
    raw = find_raw_dir(spec, root)
    cache = _cache_entry(spec, raw or root)
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache):
        if raw is not None:
            _sync_raw(raw, cache / spec.folder, spec.raw_files)
        elif not all((cache / spec.folder / "raw" / f).is_file() for f in spec.raw_files) and \
                os.environ.get("QUIETGNN_OFFLINE", "") not in ("", "0"):
            raise _missing_error(spec, root, None)
        if not (cache / spec.folder / "processed").is_dir():
            # PyG prints its own "Processing..." / "Done!" below: say what it is, once
            print(f"quietgnn: first use of {spec.folder} in this cache ({cache}): PyG converts "
                  f"its raw files once", file=sys.stderr, flush=True)
        dataset = _open(spec, cache, root, raw)
    data = dataset[0]
    if spec.split == "public":
        graph = Graph.from_pyg(data, name=spec.folder.lower())   # keeps PyG's public masks
        meta = {"split": "public"}
    else:
        data.train_mask = data.val_mask = data.test_mask = None   # none exist; be explicit
        graph = Graph.from_pyg(data, name=spec.folder.lower(), split_seed=split_seed)
        meta = {"split": "random", "split_seed": split_seed, "split_fractions": [0.6, 0.2, 0.2]}
    graph.meta.update(meta, source=f"pyg:{spec.family}", undirected=True,
                      raw_dir=str(raw or cache / spec.folder / "raw"))
    return graph
