"""OGB node-property datasets (``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``).

Loaded with ``ogb.nodeproppred.NodePropPredDataset`` (plain numpy), not
``PygNodePropPredDataset``: the numpy graph dict maps directly onto :class:`Graph`, and the PyG
variant stores a pickled ``Data`` that its bare ``torch.load`` cannot read back under
torch >= 2.6 (``weights_only`` default) - one failure mode fewer, one processed copy fewer.

Two ``ogb`` behaviours would hang a headless run and are kept away from it:

* ``NodePropPredDataset`` asks on stdin whether to re-download when the dataset folder exists
  without its ``RELEASE_v*.txt`` marker, and whether to proceed with a download over 1 GB.
  So the expected files are checked *first*; incomplete folders raise an error naming the
  missing files, and downloads are done here (ogb's own download and unzip helpers, no prompt).
* Offline, a download attempt fails fast (10 s connect timeout) into a ``ValueError`` naming
  the directory and the files OGB expects there. ``QUIETGNN_OFFLINE=1`` skips the attempt.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor

from ..graph import Graph

__all__ = ["load_ogb", "ogb_accuracy", "ogb_node_datasets"]

_CONNECT_TIMEOUT_S = 10.0


def ogb_node_datasets() -> dict[str, dict[str, str]]:
    """OGB's own table of node datasets (``ogb/nodeproppred/master.csv``), read without
    importing ``ogb.nodeproppred`` (which pulls in pandas and scikit-learn: seconds)."""
    spec = importlib.util.find_spec("ogb")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("ogbn-* datasets need the 'ogb' package: pip install ogb==1.3.6")
    path = Path(list(spec.submodule_search_locations)[0]) / "nodeproppred" / "master.csv"
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    names = rows[0][1:]
    return {name: {row[0]: row[i + 1] for row in rows[1:]} for i, name in enumerate(names)}


def _expected_files(info: dict[str, str]) -> list[str]:
    """Files (relative to the dataset folder) that must exist before ``ogb`` is called."""
    raw = ["raw/data.npz", "raw/node-label.npz"] if info["binary"] == "True" else \
        ["raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz",
         "raw/node-label.csv.gz"]
    if info["binary"] != "True" and info["additional node files"] != "None":
        raw += [f"raw/{f}.csv.gz" for f in info["additional node files"].split(",")]
    split = f"split/{info['split']}"
    return [f"RELEASE_v{info['version']}.txt", *raw, f"{split}/train.csv.gz",
            f"{split}/valid.csv.gz", f"{split}/test.csv.gz"]


def _missing(ds_dir: Path, info: dict[str, str]) -> list[str]:
    if (ds_dir / "processed" / "data_processed").is_file():
        # processed once already: only the release marker and the split are still read
        need = [f for f in _expected_files(info) if not f.startswith("raw/")]
        if (ds_dir / "split" / info["split"] / "split_dict.pt").is_file():
            need = need[:1]
    else:
        need = _expected_files(info)
    return [f for f in need if not (ds_dir / f).is_file()]


def _missing_error(name: str, ds_dir: Path, info: dict[str, str], detail: str) -> ValueError:
    return ValueError(
        f"{name}: {detail}. OGB expects the unzipped dataset in {str(ds_dir)!r}: "
        f"{', '.join(_expected_files(info))}. Download {info['url']} on a machine with internet, "
        f"unzip it and rename the folder {info['download_name']!r} to {ds_dir.name!r} inside "
        f"your --root ({str(ds_dir.parent)!r}), or run once with internet access.")


def _download(name: str, root: Path, ds_dir: Path, info: dict[str, str]) -> None:
    """ogb's download + unzip, minus its stdin prompt; any failure -> a clear ValueError."""
    if os.environ.get("QUIETGNN_OFFLINE", "") not in ("", "0"):
        raise _missing_error(name, ds_dir, info, "files not found and QUIETGNN_OFFLINE is set")
    import urllib.request
    try:
        # probe with a short timeout: offline, this fails in well under a second (DNS) or at
        # the timeout, instead of in ogb's un-timed urlopen
        urllib.request.urlopen(info["url"], timeout=_CONNECT_TIMEOUT_S).close()
        from ogb.utils.url import download_url, extract_zip
        root.mkdir(parents=True, exist_ok=True)
        path = download_url(info["url"], str(root))
        extract_zip(path, str(root))
        os.unlink(path)
        shutil.move(str(root / info["download_name"]), str(ds_dir))
    except Exception as exc:  # noqa: BLE001 - URLError, timeouts, disk errors: all fatal here
        shutil.rmtree(ds_dir, ignore_errors=True)
        raise _missing_error(name, ds_dir, info, f"files not found and the download failed "
                                                 f"({type(exc).__name__}: {exc})") from exc


@contextmanager
def _trusting_torch_load(module: Any) -> Iterator[None]:
    """ogb 1.3.6 caches numpy arrays with ``torch.save`` and reads them back with a bare
    ``torch.load``, which torch >= 2.6 refuses (``weights_only=True`` by default). Give only
    ogb's module a ``torch`` whose ``load`` passes ``weights_only=False``: the file is ogb's own
    cache inside the dataset folder the user chose, trusted exactly as much as before."""
    class _Torch:
        def __getattr__(self, attr: str) -> Any:
            return getattr(torch, attr)

        @staticmethod
        def load(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("weights_only", False)
            return torch.load(*args, **kwargs)

    saved = module.torch
    module.torch = _Torch()
    try:
        yield
    finally:
        module.torch = saved


def load_ogb(name: str, root: str | os.PathLike) -> Graph:
    """Load ``ogbn-*`` as an undirected :class:`Graph` with OGB's split.

    ``root`` is OGB's root: the dataset lives in ``<root>/ogbn_arxiv/`` (hyphens become
    underscores); ``root`` may also point at that folder itself. Labels ``[N, 1]`` are squeezed
    to ``[N]``; nodes without a label (ogbn-papers100M) get label 0 and are in no split.
    ``meta['evaluator']`` names the OGB evaluator (see :func:`ogb_accuracy`).
    """
    table = ogb_node_datasets()
    canonical = {k.lower(): k for k in table}.get(name.lower())
    if canonical is None:
        raise ValueError(f"unknown OGB node dataset {name!r}; OGB has {sorted(table)}")
    info = table[canonical]
    if info["is hetero"] == "True" or int(info["num tasks"]) != 1:
        kind = "heterogeneous" if info["is hetero"] == "True" else "multi-label"
        raise ValueError(f"{canonical} is {kind}"
                         f"; quietgnn trains single-label node classification on homogeneous "
                         f"graphs (ogbn-arxiv, ogbn-products, ogbn-papers100M)")
    root = Path(root).expanduser().resolve()
    dir_name = canonical.replace("-", "_")
    if root.name == dir_name:
        root = root.parent
    ds_dir = root / dir_name
    if not ds_dir.exists():
        _download(canonical, root, ds_dir, info)
    missing = _missing(ds_dir, info)
    if missing:
        raise _missing_error(canonical, ds_dir, info, f"the folder is incomplete, missing "
                                                      f"{', '.join(missing)}")
    if not (ds_dir / "processed" / "data_processed").is_file() and not os.access(ds_dir, os.W_OK):
        root = _shadow(ds_dir, dir_name)   # read-only folder: let ogb write processed/ elsewhere
    # ogb saves into processed/ without creating it (the official zips ship it empty)
    (root / dir_name / "processed").mkdir(exist_ok=True)

    import ogb.nodeproppred.dataset as ogb_dataset
    with _trusting_torch_load(ogb_dataset):
        dataset = ogb_dataset.NodePropPredDataset(name=canonical, root=str(root))
        split = dataset.get_idx_split()
    graph_dict, labels = dataset[0]
    n = int(graph_dict["num_nodes"])
    y = np.asarray(labels, dtype=np.float64).reshape(n, -1)[:, 0]
    unlabeled = ~np.isfinite(y)
    y = np.where(unlabeled, 0, y).astype(np.int64)
    masks = []
    for key in ("train", "valid", "test"):
        m = torch.zeros(n, dtype=torch.bool)
        m[torch.from_numpy(np.array(split[key], dtype=np.int64).reshape(-1))] = True
        masks.append(m)
    x = graph_dict["node_feat"]
    if x is None:   # not the case for the supported datasets; keep the contract anyway
        x = np.ones((n, 1), dtype=np.float32)
    meta = {"source": "ogb", "evaluator": canonical, "split": "ogb",
            "split_type": info["split"], "unlabeled_nodes": int(unlabeled.sum())}
    return Graph.from_edge_index(torch.from_numpy(np.asarray(graph_dict["edge_index"])),
                                 torch.from_numpy(np.asarray(x, dtype=np.float32)),
                                 torch.from_numpy(y), num_classes=int(info["num classes"]),
                                 train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                                 undirected=True, name=canonical, meta=meta)


def _shadow(ds_dir: Path, dir_name: str) -> Path:
    """A writable stand-in for a read-only OGB folder: symlinks to its files, own processed/."""
    from .pyg import cache_root, make_cache_dir
    import hashlib
    key = hashlib.sha256(str(ds_dir).encode()).hexdigest()[:12]
    shadow_root = cache_root() / "ogb" / key
    shadow = shadow_root / dir_name
    make_cache_dir(shadow, f"a writable stand-in for {str(ds_dir)!r}")
    for entry in ds_dir.iterdir():
        if entry.name != "processed" and not (shadow / entry.name).exists():
            (shadow / entry.name).symlink_to(entry)
    return shadow_root


def ogb_accuracy(name: str, y_true: Tensor | np.ndarray, y_pred: Tensor | np.ndarray) -> float:
    """Accuracy by OGB's own ``Evaluator`` (what OGB leaderboards report).

    ``y_true``: labels ``[M]`` or ``[M, 1]``; ``y_pred``: predicted classes ``[M]`` / ``[M, 1]``
    or logits ``[M, C]`` (arg-maxed here).
    """
    from ogb.nodeproppred import Evaluator
    name = {k.lower(): k for k in ogb_node_datasets()}.get(name.lower(), name)
    y_true_t, y_pred_t = torch.as_tensor(y_true), torch.as_tensor(y_pred)
    if y_pred_t.dim() == 2 and y_pred_t.shape[1] > 1:
        y_pred_t = y_pred_t.argmax(dim=1)
    y_true_t, y_pred_t = y_true_t.reshape(-1, 1).long(), y_pred_t.reshape(-1, 1).long()
    if y_true_t.shape != y_pred_t.shape:
        raise ValueError(f"ogb_accuracy: y_true has {y_true_t.shape[0]} rows but y_pred has "
                         f"{y_pred_t.shape[0]}; pass predictions for the same nodes")
    return float(Evaluator(name).eval({"y_true": y_true_t, "y_pred": y_pred_t})["acc"])
