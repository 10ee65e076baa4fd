"""Dataset loaders: every one returns a validated :class:`quietgnn.graph.Graph`.

(Interim entry point: synthetic graphs and the PyG datasets; the OGB and file loaders follow.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from ..graph import Graph
from .synthetic import SyntheticSpec, make_synthetic

__all__ = ["load_dataset", "available_datasets", "SyntheticSpec", "make_synthetic"]

# name -> (PyG class, PyG name, folder under a common data root, standard split?)
_PYG = {
    "cora": ("Planetoid", "Cora", "planetoid", True),
    "citeseer": ("Planetoid", "CiteSeer", "planetoid", True),
    "pubmed": ("Planetoid", "PubMed", "planetoid", True),
    "computers": ("Amazon", "Computers", "amazon", False),
    "photo": ("Amazon", "Photo", "amazon", False),
    "cs": ("Coauthor", "CS", "coauthor", False),
    "physics": ("Coauthor", "Physics", "coauthor", False),
}


def available_datasets() -> list[tuple[str, str]]:
    out = [("synthetic", "seeded contextual stochastic block model (built in, no download)")]
    for name, (cls, pyg_name, _, std) in _PYG.items():
        split = "public split" if std else "random 60/20/20 split (seed 0)"
        out.append((name, f"{cls} {pyg_name} via PyG, {split}; needs --root"))
    return out


def _cache_dir() -> Path:
    return Path(os.environ.get("QUIETGNN_CACHE", Path.home() / ".cache" / "quietgnn"))


def _load_pyg(name: str, root: Optional[str], split_seed: int) -> Graph:
    cls_name, pyg_name, folder, standard = _PYG[name]
    if root is None:
        raise ValueError(f"dataset {name!r} needs --root (the folder holding {pyg_name}/raw/, "
                         f"e.g. --root ../shared/data/{folder})")
    base = Path(root)
    if not (base / pyg_name / "raw").is_dir() and (base / folder / pyg_name / "raw").is_dir():
        base = base / folder           # a root one level up (e.g. ../shared/data) also works
    raw = base / pyg_name / "raw"
    if not raw.is_dir():
        raise ValueError(f"dataset {name!r}: no raw files at {str(raw)!r}; put the {cls_name} "
                         f"{pyg_name} raw files there (PyG's layout) or point --root at the "
                         f"folder that holds {pyg_name}/raw/")
    # PyG writes processed/ next to raw/: work on a copy so the given root stays read-only.
    key = hashlib.sha256(str(raw.resolve()).encode()).hexdigest()[:10]
    work = _cache_dir() / "pyg" / f"{folder}-{key}"
    if not (work / pyg_name / "raw").is_dir():
        (work / pyg_name).mkdir(parents=True, exist_ok=True)
        shutil.copytree(raw, work / pyg_name / "raw.tmp", dirs_exist_ok=True)
        os.replace(work / pyg_name / "raw.tmp", work / pyg_name / "raw")
    import torch_geometric.datasets as pyg_datasets
    ds = getattr(pyg_datasets, cls_name)(root=str(work), name=pyg_name)
    data = ds[0]
    if not standard:
        for k in ("train_mask", "val_mask", "test_mask"):
            if k in data:
                del data[k]
    g = Graph.from_pyg(data, name=name, split_seed=split_seed)
    g.meta.update(source=f"torch_geometric.datasets.{cls_name}",
                  split="public" if standard else f"random 60/20/20 (seed {split_seed})")
    return g


def load_dataset(name: str, root: Optional[str] = None, *,
                 synthetic: SyntheticSpec | dict[str, Any] | None = None,
                 split_seed: int = 0) -> Graph:
    """Load ``name`` (see :func:`available_datasets`) as a validated, undirected Graph."""
    key = str(name).lower()
    if key == "synthetic":
        spec = synthetic if isinstance(synthetic, SyntheticSpec) else SyntheticSpec(**(synthetic or {}))
        return make_synthetic(spec)
    if key in _PYG:
        return _load_pyg(key, root, split_seed)
    raise ValueError(f"unknown dataset {name!r}; expected one of "
                     f"{[n for n, _ in available_datasets()]}")
