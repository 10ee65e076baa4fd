"""Planetoid (Cora, CiteSeer, PubMed), Amazon (Computers, Photo) and Coauthor (CS, Physics)
from the raw files PyG's dataset classes read, without writing into the user's data folder and
without running anything those files hold.

The raw files are read where they are (a read-only shared folder is fine): Planetoid's pickles
through an unpickler that admits only the numpy/scipy classes they hold
(:mod:`.planetoid`), the Amazon/Coauthor ``.npz`` with ``allow_pickle=False``
(:mod:`.files`). The graph is built as PyG's classes build it (the tests compare the two on
the real datasets), but PyG's ``processed/data.pt`` cache is never written nor read: PyG loads
it with ``torch.load(weights_only=False)`` when the safe load fails, so a planted one would run
code. Converting the raw files takes a second or less, so only downloads are cached:
raw files missing under the root are downloaded (PyG's URLs) into ``$QUIETGNN_CACHE`` (or
``~/.cache/quietgnn``), under ``pyg/<key>/``, the key derived from the resolved root.

``torch_geometric`` is imported only to download: it takes seconds to import and
``import quietgnn`` must stay cheap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..graph import Graph
from .files import NpzArchive, csr_edges, csr_features
from .planetoid import PLANETOID_FILES, read_planetoid

__all__ = ["PYG_DATASETS", "load_pyg", "cache_root", "make_cache_dir"]


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
    files = tuple(f"ind.{stem}.{p}" for p in PLANETOID_FILES)
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


def make_cache_dir(path: Path, what: str) -> None:
    """Create ``path`` under the cache, or refuse (``ValueError``) naming the setting that
    moves the cache: under a read-only home this was a bare ``[Errno 30] … '~/.cache'``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write {what} into the cache {str(cache_root())!r} "
                         f"({exc.strerror or exc}): set QUIETGNN_CACHE to a directory you may "
                         f"write") from None


def cache_root() -> Path:
    """``$QUIETGNN_CACHE`` or (unset or empty) ``~/.cache/quietgnn``: downloads, the
    launcher's partition books. ``ValueError`` when it names something that is not a
    directory (an empty value wrote ``./books`` into the working directory before)."""
    env = os.environ.get("QUIETGNN_CACHE", "")
    path = Path(env).expanduser() if env.strip() else Path.home() / ".cache" / "quietgnn"
    if path.exists() and not path.is_dir():
        raise ValueError(f"QUIETGNN_CACHE = {env!r} is a file; expected a directory quietgnn "
                         f"may write its cache into (or unset it: ~/.cache/quietgnn)"
                         if env.strip() else f"the cache {str(path)!r} is a file; expected a "
                         f"directory: move it away, or set QUIETGNN_CACHE to a directory")
    return path


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


def raw_dir_of(spec: _Spec, root: Path) -> Path | None:
    """The raw folder :func:`load_pyg` reads for ``root`` (under it, or else the downloaded
    copy in the cache), or None when neither is complete."""
    raw = find_raw_dir(spec, root)
    if raw is None:
        cached = _cache_entry(spec, root) / spec.folder / "raw"
        raw = cached if all((cached / f).is_file() for f in spec.raw_files) else None
    return raw


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
    """Hold an exclusive lock on ``cache`` while raw files are downloaded into it: ranks of
    one run (or runs on emulated hosts) that share a cache and start together would otherwise
    download the same files at once."""
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




def _downloaded(spec: _Spec, root: Path) -> Path:
    """The raw folder in the cache, downloaded into it (from PyG's URLs) unless it is there:
    all files or none (a temporary folder renamed into place), one process at a time."""
    entry = _cache_entry(spec, root)
    raw = entry / spec.folder / "raw"
    make_cache_dir(entry, f"the {spec.folder} download")
    with _locked(entry):
        if all((raw / f).is_file() for f in spec.raw_files):
            return raw
        if os.environ.get("QUIETGNN_OFFLINE", "") not in ("", "0"):
            raise _missing_error(spec, root, None)
        tmp = Path(tempfile.mkdtemp(prefix="download.tmp", dir=entry))   # a new, unguessable name
        try:
            import torch_geometric.datasets as pyg_datasets
            from torch_geometric.data import download_url
            url = getattr(pyg_datasets, spec.family).url.rstrip("/")
            print(f"quietgnn: downloading {spec.folder} into {raw}", file=sys.stderr, flush=True)
            for f in spec.raw_files:
                download_url(f"{url}/{f}", str(tmp), log=False)
            shutil.rmtree(raw, ignore_errors=True)
            raw.parent.mkdir(parents=True, exist_ok=True)
            tmp.rename(raw)
        except Exception as exc:  # noqa: BLE001 - offline downloads fail in many ways (URLError,
            # socket errors, fsspec/aiohttp errors): all mean "the raw files are not there"
            raise _missing_error(spec, root, exc) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)       # no half-downloads kept
    return raw


def _planetoid_graph(spec: _Spec, raw: Path) -> Graph:
    a = read_planetoid(raw, spec.folder)
    return Graph.from_edge_index(a.edge_index, a.x, a.y, train_mask=a.train_mask,
                                 val_mask=a.val_mask, test_mask=a.test_mask, undirected=True,
                                 name=spec.folder.lower())


def _shchur_graph(spec: _Spec, raw: Path, split_seed: int) -> Graph:
    """PyG's ``read_npz`` (Amazon, Coauthor): the ``adj_*`` CSR adjacency, the ``attr_*`` CSR
    features binarised (``x > 0`` -> 1), ``labels``; no split."""
    path = raw / spec.raw_files[0]
    with NpzArchive(path) as z:
        missing = [k for k in ("labels", "attr_data", "adj_indptr") if k not in z]
        if missing:
            raise ValueError(f"{path}: keys {missing} missing (found {sorted(z.files)}); "
                             f"expected the Shchur et al. layout: adj_*, attr_* (CSR) and "
                             f"labels. Replace it with the original ({spec.family} in PyG)")
        y = np.asarray(z["labels"])
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ValueError(f"{path}: key 'labels' holds {y.dtype} of shape {y.shape}; "
                             f"expected integer class ids [N]")
        x = csr_features(z, "attr_", str(path), rows=y.size)
        ei = csr_edges(z, str(path))
    x[x > 0] = 1
    return Graph.from_edge_index(torch.from_numpy(ei), torch.from_numpy(x),
                                 torch.from_numpy(y.astype(np.int64)), undirected=True,
                                 name=spec.folder.lower(), split_seed=split_seed)


def load_pyg(name: str, root: str | os.PathLike, *, split_seed: int = 0) -> Graph:
    """Load a PyG dataset as an undirected :class:`Graph`.

    Split: the Planetoid public split (20 per class / 500 / 1000) for Cora, CiteSeer and
    PubMed; seeded random 60/20/20 (``split_seed``) for Amazon and Coauthor, which have no
    standard split. Raw files missing under ``root`` are downloaded into the cache (when
    online and ``QUIETGNN_OFFLINE`` is unset); failing that, the error says where to put them.
    """
    spec = PYG_DATASETS[name.lower()]
    root = Path(root).expanduser().resolve()
    raw = find_raw_dir(spec, root) or _downloaded(spec, root)
    if spec.split == "public":
        graph = _planetoid_graph(spec, raw)
        meta: dict[str, object] = {"split": "public"}
    else:
        graph = _shchur_graph(spec, raw, split_seed)
        meta = {"split": "random", "split_seed": split_seed, "split_fractions": [0.6, 0.2, 0.2]}
    graph.meta.update(meta, source=f"pyg:{spec.family}", undirected=True, raw_dir=str(raw))
    return graph
