"""Datasets: every loader returns the same validated :class:`~quietgnn.graph.Graph`.

``load_dataset(name, root)`` is the one entry point (the CLI's ``--dataset`` / ``--root``):

* ``synthetic`` - seeded degree-corrected contextual SBM (:mod:`.synthetic`), no files needed;
* ``cora``, ``citeseer``, ``pubmed``, ``computers``, ``photo``, ``cs``, ``physics`` - PyG's
  raw layouts under ``root`` (:mod:`.pyg`), read where they are (``root`` may be read-only)
  without unpickling anything but numpy/scipy arrays;
* ``ogbn-arxiv``, ``ogbn-products``, ... - OGB under ``root`` (:mod:`.ogb`);
* a path ending in ``.npz``, or ``.txt``/``.edges``/``.csv``/``.tsv`` (edge list) - your own
  files (:mod:`.files`).

Common rules, so results are comparable across datasets: every graph is undirected (reverse
edges added, self-loops and duplicates dropped; ``meta['undirected'] = True``); the split is the
dataset's standard one when it has one (Planetoid public, OGB), otherwise seeded random
60/20/20 (``split_seed``); ``meta['split']`` and ``meta['source']`` record both.

Only this module and :mod:`.synthetic` are cheap to import; PyG and OGB load on first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..graph import Graph
from .synthetic import SyntheticSpec, make_synthetic

__all__ = ["load_dataset", "available_datasets", "SyntheticSpec", "make_synthetic",
           "dataset_identity", "dataset_files", "parse_split", "per_class_split"]

# root examples for the "needs --root" error (the layout of ../shared/data in this project)
_ROOT_EXAMPLES = {"Planetoid": "../shared/data/planetoid", "Amazon": "../shared/data/amazon",
                  "Coauthor": "../shared/data/coauthor"}


def available_datasets() -> list[tuple[str, str]]:
    """``(name, one-line description)`` for every accepted name pattern (``quietgnn datasets``)."""
    from .pyg import PYG_DATASETS
    rows = [("synthetic", "seeded degree-corrected contextual SBM (synthetic.* options), "
                          "random 60/20/20; no files needed")]
    rows += [(name, f"{spec.description} (--root)") for name, spec in PYG_DATASETS.items()]
    rows += [("ogbn-<name>", "OGB node classification, e.g. ogbn-arxiv, ogbn-products; OGB "
                             "split and Evaluator (--root)"),
             ("<path>.npz", "your graph: keys edge_index (or src/dst), y, optional x, masks, "
                            "num_classes"),
             ("<path>.txt", "your edge list ('u v' lines; also .edges/.csv/.tsv) with "
                            "<stem>.labels.npy and optional <stem>.features.npy")]
    return rows


def _spec(synthetic: SyntheticSpec | dict[str, Any] | None) -> SyntheticSpec:
    if synthetic is None:
        return SyntheticSpec()
    if isinstance(synthetic, SyntheticSpec):
        return synthetic
    if isinstance(synthetic, dict):
        import dataclasses
        valid = {f.name for f in dataclasses.fields(SyntheticSpec)}
        unknown = sorted(set(synthetic) - valid)
        if unknown:
            raise ValueError(f"unknown synthetic option(s) {unknown}; valid: {sorted(valid)}")
        return SyntheticSpec(**synthetic)
    raise TypeError(f"synthetic = {synthetic!r}: expected a SyntheticSpec, a dict of its fields "
                    f"or None")


def _need_root(name: str, example: str, layout: str) -> ValueError:
    return ValueError(f"dataset {name!r} is read from files: pass --root DIR (Python: "
                      f"root='DIR'), e.g. --root {example} ({layout})")


def _valid_names() -> str:
    return ", ".join(n for n, _ in available_datasets())


def parse_split(split: str) -> tuple[int, int] | None:
    """``dataset.split``: None for ``standard``, ``(K, V)`` for ``per_class:K:V``."""
    if split == "standard":
        return None
    kind, _, rest = str(split).partition(":")
    try:
        k, v = (int(x) for x in rest.split(":"))
    except ValueError:
        k = v = -1
    if kind != "per_class" or k < 1 or v < 0:
        raise ValueError(f"dataset.split = {split!r}; expected standard or per_class:K:V (K "
                         f"training nodes per class, V validation nodes, the rest test; e.g. "
                         f"per_class:20:500, Planetoid's random split)")
    return k, v


def per_class_split(g: Graph, per_class: int, num_val: int, seed: int) -> Graph:
    """``g`` with ``per_class`` random training nodes of every class (all of a smaller
    class), ``num_val`` random validation nodes among the others, every other node test;
    one generator seeded ``seed`` draws the classes in order, then the validation nodes."""
    import torch
    if g.meta.get("unlabeled_nodes"):
        raise ValueError(f"dataset.split per_class:{per_class}:{num_val}: {g.name} has "
                         f"{g.meta['unlabeled_nodes']} unlabelled nodes (stored as class 0), "
                         f"which a per-class draw would train and test on; use its standard "
                         f"split")
    gen = torch.Generator().manual_seed(int(seed))
    train = torch.zeros(g.num_nodes, dtype=torch.bool)
    for c in range(g.num_classes):
        idx = (g.y == c).nonzero().flatten()
        train[idx[torch.randperm(idx.numel(), generator=gen)[:per_class]]] = True
    rest = (~train).nonzero().flatten()
    if num_val > rest.numel():
        raise ValueError(f"dataset.split per_class:{per_class}:{num_val}: {g.name} has "
                         f"{rest.numel()} nodes besides the training ones, fewer than "
                         f"{num_val} validation nodes; ask for fewer")
    rest = rest[torch.randperm(rest.numel(), generator=gen)]
    val = torch.zeros_like(train)
    val[rest[:num_val]] = True
    if not (~(train | val)).any():
        raise ValueError(f"dataset.split per_class:{per_class}:{num_val}: no node of {g.name}'s "
                         f"{g.num_nodes} is left for the test set; ask for fewer training or "
                         f"validation nodes")
    import dataclasses
    return dataclasses.replace(g.with_split(train, val, ~(train | val)), meta={
        **g.meta, "split": f"per_class:{per_class}:{num_val}", "split_seed": int(seed)})


def load_dataset(name: str, root: str | os.PathLike | None = None, *,
                 synthetic: SyntheticSpec | dict[str, Any] | None = None,
                 split_seed: int = 0, split: str = "standard", labels: bool = True) -> Graph:
    """Load dataset ``name`` as a validated, undirected :class:`Graph`.

    ``name`` is case-insensitive (``Cora`` = ``cora``), except file paths, which are used as
    given (relative paths are tried against ``root`` too). ``synthetic`` configures the
    ``synthetic`` dataset and is ignored otherwise; ``split_seed`` seeds the random 60/20/20
    split of datasets without a standard one (the synthetic graph's own shape is seeded by
    ``synthetic.seed``); ``split`` ``per_class:K:V`` replaces any split by
    :func:`per_class_split`, drawn with ``split_seed``. ``labels=False`` (``quietgnn
    predict``): a graph file's labels and masks are not read, so a graph to predict on may have
    none (its ``y`` is then all 0 and ``meta['labels']`` is ``"absent"``: never train on it).
    """
    fixed = parse_split(split)
    g = _load(name, root, synthetic, split_seed, labels)
    return g if fixed is None else per_class_split(g, *fixed, seed=split_seed)


def _load(name: str | os.PathLike, root: str | os.PathLike | None,
          synthetic: SyntheticSpec | dict[str, Any] | None, split_seed: int,
          labels: bool = True) -> Graph:
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"dataset name {name!r} must be a string")
    raw_name = os.fspath(name)
    key = raw_name.strip().lower()
    if key == "synthetic":
        return make_synthetic(_spec(synthetic), split_seed=split_seed)

    from .pyg import PYG_DATASETS
    if key in PYG_DATASETS:
        spec = PYG_DATASETS[key]
        if root is None:
            raise _need_root(key, _ROOT_EXAMPLES[spec.family],
                             f"the folder containing {spec.folder}/raw/{spec.raw_files[0]}")
        from .pyg import load_pyg
        return load_pyg(key, root, split_seed=split_seed)

    if key.startswith("ogbn-"):
        if root is None:
            raise _need_root(key, "data/ogb", f"the folder containing "
                                              f"{key.replace('-', '_')}/; OGB downloads there "
                                              f"when online")
        from .ogb import load_ogb
        return load_ogb(key, root)

    from .files import EDGE_LIST_SUFFIXES, load_edge_list, load_npz
    if key.endswith(".npz") or key.endswith(EDGE_LIST_SUFFIXES):
        path = _file_path(raw_name, root)
        if key.endswith(".npz"):
            return load_npz(path, split_seed=split_seed, labels=labels)
        return load_edge_list(path, split_seed=split_seed, labels=labels)

    if (Path(raw_name).expanduser() / "book.json").is_file():
        raise ValueError(f"{raw_name!r} is a prepared graph (it holds book.json), not a dataset: "
                         f"train takes it with --data {raw_name}; predict reads a graph whole, "
                         f"so give it the graph or tables it was prepared from")
    hint = ""
    if "/" in raw_name or os.sep in raw_name or Path(raw_name).suffix:
        hint = (f" (as a file path: supported endings are .npz and "
                f"{', '.join(EDGE_LIST_SUFFIXES)})")
    raise ValueError(f"unknown dataset {raw_name!r}{hint}; expected one of: {_valid_names()}")


def _file_path(raw_name: str, root: str | os.PathLike | None) -> Path:
    """Where a file dataset's path points (relative paths are tried against ``root`` too)."""
    path = Path(raw_name).expanduser()
    if not path.is_absolute() and not path.exists() and root is not None:
        path = Path(root).expanduser() / path
    return path


def _is_file_dataset(key: str) -> bool:
    from .files import EDGE_LIST_SUFFIXES
    return key.endswith(".npz") or key.endswith(EDGE_LIST_SUFFIXES)


def dataset_identity(name: str | os.PathLike, root: str | os.PathLike | None = None, *,
                     synthetic: SyntheticSpec | dict[str, Any] | None = None,
                     split_seed: int = 0, split: str = "standard") -> dict[str, Any]:
    """:func:`_identity`, with ``split`` and its ``split_seed`` where it is not standard."""
    out = _identity(name, root, synthetic, split_seed)
    if out and split != "standard":
        out.update(split=split, split_seed=split_seed)
    return out


def _identity(name: str | os.PathLike, root: str | os.PathLike | None,
              synthetic: SyntheticSpec | dict[str, Any] | None,
              split_seed: int) -> dict[str, Any]:
    """What is known of the graph ``load_dataset`` would return, *without loading it*: its
    ``name`` always; for ``synthetic`` also ``num_nodes``, ``num_features``, ``num_classes``,
    the spec (``synthetic``) and ``split_seed``; for datasets with a random split
    ``split_seed``. Partition books record the same keys (``book.json`` ``graph``), so a book
    can be checked against a requested dataset cheaply (under torchrun, every rank does).
    Unknown names give ``{}`` (``load_dataset`` names the problem)."""
    raw_name = os.fspath(name)
    key = raw_name.strip().lower()
    if key == "synthetic":
        import dataclasses
        spec = _spec(synthetic)
        return {"name": "synthetic", "num_nodes": spec.nodes, "num_features": spec.feature_dim,
                "num_classes": spec.classes, "synthetic": dataclasses.asdict(spec),
                "split_seed": split_seed}
    from .pyg import PYG_DATASETS
    if key in PYG_DATASETS:
        spec_ = PYG_DATASETS[key]
        out: dict[str, Any] = {"name": spec_.folder.lower()}
        if spec_.split == "random":
            out["split_seed"] = split_seed
        return out
    if key.startswith("ogbn-"):
        try:
            from .ogb import ogb_node_datasets
            return {"name": {k.lower(): k for k in ogb_node_datasets()}.get(key, raw_name)}
        except ValueError:      # ogb not installed: loading will say so
            return {}
    if _is_file_dataset(key):
        return {"name": Path(raw_name).stem}   # files.py names the graph after the file
    return {}


def dataset_files(name: str | os.PathLike, root: str | os.PathLike | None = None) -> list[Path]:
    """The files ``load_dataset(name, root)`` reads, those that exist (for cache keys that
    must change when a file's content does): a ``.npz``; an edge list with its
    ``<stem>.labels`` / ``<stem>.features`` companions; a PyG dataset's raw files under
    ``root`` (or their downloaded copy in the cache); an OGB dataset's raw and split files.
    ``synthetic`` (and names not found) read none: ``[]``."""
    raw_name = os.fspath(name)
    key = raw_name.strip().lower()
    if key == "synthetic":
        return []
    from .pyg import PYG_DATASETS, raw_dir_of
    if key in PYG_DATASETS:
        if root is None:
            return []
        spec = PYG_DATASETS[key]
        # the downloaded copy counts too: a file replaced in the cache must not reuse a book
        raw = raw_dir_of(spec, Path(root).expanduser().resolve())
        return [raw / f for f in spec.raw_files] if raw is not None else []
    if key.startswith("ogbn-"):
        if root is None:
            return []
        try:
            from .ogb import _expected_files, ogb_node_datasets
            table = ogb_node_datasets()
        except ValueError:
            return []
        canonical = {k.lower(): k for k in table}.get(key)
        if canonical is None:
            return []
        base = Path(root).expanduser().resolve()
        dir_name = canonical.replace("-", "_")
        ds_dir = base if base.name == dir_name else base / dir_name
        return [ds_dir / f for f in _expected_files(table[canonical]) if (ds_dir / f).is_file()]
    if _is_file_dataset(key):
        path = _file_path(raw_name, root)
        files = [path] if path.is_file() else []
        if not key.endswith(".npz"):
            stem = path.with_suffix("")
            for what in ("labels", "features"):
                for suffix in (".npy", ".txt", ".npz"):
                    p = stem.with_name(f"{stem.name}.{what}{suffix}")
                    if p.is_file():
                        files.append(p)
        return files
    return []
