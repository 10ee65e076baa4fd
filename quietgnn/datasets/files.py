"""Graphs from your own files: one ``.npz`` archive, or an edge list plus companion arrays.

``.npz`` keys (``np.savez(path, edge_index=..., x=..., y=...)``):

* ``edge_index`` int ``[2, E]`` (source, destination), **or** ``src`` and ``dst`` int ``[E]``
* ``y`` int ``[N]`` (or ``[N, 1]``) labels in ``[0, num_classes)``            (required), or
  label *names* (strings): class ``k`` is the ``k``-th name in sorted order, and the mapping
  is kept (``graph.meta["label_names"]``)
* ``x`` float ``[N, F]`` features (bool and integer taken as float32; ``F >= 1``; optional:
  degree-bucket features, see below), **or**
  the same as a sparse CSR matrix: ``x_data``, ``x_indices``, ``x_indptr``, ``x_shape``
  (optional ``x_format`` = ``csr``): the keys :func:`scipy.sparse.save_npz` writes, prefixed
  with ``x_``. A wide binary feature table stays a few MB on disk instead of ``4 N F`` bytes
* ``train_mask``, ``val_mask``, ``test_mask`` bool ``[N]``, or numbers all 0 or 1 (optional,
  all three or none: without them, seeded random 60/20/20)
* ``num_classes`` scalar                 (optional: default ``max(y) + 1``)

The CSR layout of the Shchur et al. / graph2gauss graphs (Amazon, Coauthor, Cora-ML, ...,
as PyG's ``CitationFull`` and ``Amazon`` loaders read them) is read as well: ``adj_data``,
``adj_indices``, ``adj_indptr``, ``adj_shape`` (the adjacency), ``attr_*`` (the features, the
same four keys) and ``labels``.

Edge list ``graph.txt`` / ``.edges`` / ``.csv`` / ``.tsv``: one edge ``u v`` per line, node ids
from 0; whitespace- or comma-separated; lines starting with ``#`` or ``%`` are comments; extra
columns (weights, timestamps) are ignored. Companions next to it, named after the stem:

* ``graph.labels.npy`` int ``[N]`` (required; ``graph.labels.txt``, one per line, also works) -
  it also fixes N, so isolated nodes with high ids are kept;
* ``graph.features.npy`` float ``[N, F]`` (optional; or ``graph.features.txt``, or
  ``graph.features.npz`` written by ``scipy.sparse.save_npz`` - sparse on disk).

A first line that is not two integers (a CSV header such as ``id_1,id_2``) is skipped.

Sparse features are densified to float32 ``[N, F]`` when the graph is loaded (the
:class:`Graph` contract is dense; ``quietgnn prepare`` then writes each part's rows, and
``--x-dtype float16`` halves them): the file stays small, memory holds ``4 N F`` bytes once.

Without features, nodes get one-hot **log2 degree buckets** (16 columns: bucket
``min(floor(log2(deg + 1)), 15)``) rather than a constant: a constant feature makes every node
look alike before aggregation, and degree is the one structural signal that costs nothing.
``meta['features']`` says which was used. Every graph is symmetrised (reverse edges added,
self-loops and duplicates dropped). The arrays are checked as the Python API's are
(:mod:`quietgnn.graphinput`: one check for every way a graph comes in).

To predict on (``quietgnn predict``: ``labels=False``), a file's labels and masks are not
read: only the edges and features, and the labels' length where it fixes the nodes.

Nothing is unpickled (``allow_pickle=False``: an object array is refused), and a file that is
damaged or not what it says (a truncated archive, a pickle named ``.npz``, a sparse shape far
larger than its data) is one ``ValueError`` naming the file and key, before anything is
allocated for it.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..graph import Graph
from ..graphinput import MASKS, class_ids, degree_features
from ..heap import mem_available_mb

__all__ = ["load_npz", "load_edge_list", "degree_features", "csr_features", "csr_edges",
           "NpzArchive", "load_npy", "EDGE_LIST_SUFFIXES"]

EDGE_LIST_SUFFIXES = (".txt", ".edges", ".csv", ".tsv")


#: what numpy's errors say when a file holds a pickle (an object array or a whole pickle)
_PICKLED = "allow_pickle"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")      # a zip member first; an empty archive
_NPY_MAGIC = b"\x93NUMPY"


def _why(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


class NpzArchive:
    """An open ``.npz`` (``np.load(allow_pickle=False)``, as a context manager) whose every read
    that fails is one ``ValueError`` naming the file and the key: a file that is no zip archive,
    a truncated or damaged one, a member holding Python objects (a pickle: never loaded)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            head = f.read(6)
        if not head.startswith(_ZIP_MAGIC):
            what = ("a single array (.npy format), not an archive: save it with np.savez("
                    "path, key=array)" if head == _NPY_MAGIC else
                    f"not a .npz archive (it starts with {head!r}, not a zip header; a pickle "
                    f"is never loaded)")
            raise ValueError(f"{self.path}: {what}; expected a file written by np.savez, "
                             f"np.savez_compressed or scipy.sparse.save_npz")
        try:
            self._z = np.load(self.path, allow_pickle=False)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: a damaged .npz archive ({_why(exc)}): truncated or "
                             f"corrupted; write it again with np.savez") from None
        self.files: list[str] = list(self._z.files)

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self._z[key]
        except KeyError:
            raise
        except ValueError as exc:
            if _PICKLED in str(exc):
                raise ValueError(_objects_error(f"{self.path} key {key!r}")) from None
            raise ValueError(f"{self.path} key {key!r}: not a readable array ({_why(exc)}); "
                             f"the archive is damaged: write it again with np.savez") from None
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, MemoryError) as exc:
            raise ValueError(f"{self.path} key {key!r}: not a readable array ({_why(exc)}); "
                             f"the archive is damaged: write it again with np.savez") from None

    def close(self) -> None:
        self._z.close()

    def __enter__(self) -> "NpzArchive":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _objects_error(where: str) -> str:
    return (f"{where}: holds Python objects (an object array, stored as a pickle), which "
            f"quietgnn never loads, as it could run code; expected numbers (or strings for "
            f"label names): save it with a numeric dtype, e.g. np.asarray(v, dtype=np.int64)")


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """``np.load(path, allow_pickle=False)``, every failure one ``ValueError`` naming the file."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(6)
    if head != _NPY_MAGIC:
        raise ValueError(f"{path}: not a .npy array file (it starts with {head!r}, not "
                         f"{_NPY_MAGIC!r}; a pickle is never loaded); expected a file written "
                         f"by np.save(path, array)")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if _PICKLED in str(exc):
            raise ValueError(_objects_error(str(path))) from None
        raise ValueError(f"{path}: not a readable .npy file ({_why(exc)}); write it again with "
                         f"np.save(path, array)") from None
    except (EOFError, OSError, MemoryError) as exc:
        raise ValueError(f"{path}: not a readable .npy file ({_why(exc)}); write it again with "
                         f"np.save(path, array)") from None


_CSR_KEYS = ("data", "indices", "indptr", "shape")


def csr_features(arrays: Any, prefix: str, where: str,
                 rows: int | None = None) -> np.ndarray | None:
    """Dense float32 ``[N, F]`` from the CSR keys ``<prefix>data``, ``indices``, ``indptr``,
    ``shape`` (and optional ``format``) of ``arrays`` (an open ``.npz``), as
    :func:`scipy.sparse.save_npz` writes them with ``prefix=""``; None when they are absent.
    ``rows``: the number of nodes, when known. The shape is checked before the dense matrix is
    allocated: against ``indptr``, ``rows``, the largest column index and available memory."""
    keys = set(arrays.files)
    present = [k for k in _CSR_KEYS if prefix + k in keys]
    if not present:
        return None
    if len(present) != len(_CSR_KEYS):
        missing = [prefix + k for k in _CSR_KEYS if k not in present]
        raise ValueError(f"{where}: sparse features need keys "
                         f"{[prefix + k for k in _CSR_KEYS]}; {missing} missing (write them "
                         f"with scipy.sparse.save_npz, or np.savez(x_data=m.data, ...))")
    fmt = arrays[prefix + "format"].item() if prefix + "format" in keys else b"csr"
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    if fmt != "csr":
        raise ValueError(f"{where}: sparse features in format {fmt!r}; expected 'csr' "
                         f"(convert with m.tocsr() before saving)")
    import scipy.sparse as sp
    data, indices, indptr = (arrays[prefix + k] for k in ("data", "indices", "indptr"))
    shape = _csr_shape(np.asarray(arrays[prefix + "shape"]), indices, indptr, prefix, where, rows)
    try:
        m = sp.csr_matrix((data, indices, indptr), shape=shape)
        m.check_format(full_check=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: sparse features are not a valid CSR matrix of shape "
                         f"{shape} ({exc}); expected data/indices [nnz], indptr [N+1], shape "
                         f"(N, F)") from exc
    if m.data.dtype.kind not in "biuf":
        raise ValueError(f"{where}: sparse feature values have dtype {m.data.dtype}, expected "
                         f"numbers")
    return m.astype(np.float32).toarray()


def _csr_shape(shape: np.ndarray, indices: np.ndarray, indptr: np.ndarray, prefix: str,
               where: str, rows: int | None) -> tuple[int, int]:
    """``(N, F)`` from the ``shape`` key, refused (naming the wrong value) unless it agrees with
    ``indptr`` and ``rows`` and its dense float32 matrix fits in the memory available."""
    key = f"{prefix}shape"
    vals = shape.reshape(-1)
    if vals.size != 2 or vals.dtype.kind not in "iuf" or not np.isfinite(vals).all() or \
            (vals < 0).any() or (vals != np.round(vals)).any():
        raise ValueError(f"{where}: key {key} = {vals.tolist()}; expected two whole numbers "
                         f">= 0 (rows N, feature columns F)")
    n, f = int(vals[0]), int(vals[1])
    if indptr.ndim != 1 or indptr.size != n + 1:
        raise ValueError(f"{where}: key {key} says {n} rows but {prefix}indptr has "
                         f"{indptr.size} entries (expected N + 1 = {n + 1}); one of the two is "
                         f"wrong: write the matrix again with scipy.sparse.save_npz")
    if rows is not None and n != rows:
        raise ValueError(f"{where}: key {key} says {n} rows but the graph has {rows} nodes (one "
                         f"label each); expected shape [{rows}, F]")
    need = n * f * 4
    avail = mem_available_mb() * 2 ** 20
    if need > avail:
        top = int(indices.max()) + 1 if indices.size and indices.dtype.kind in "iu" else 0
        why = (f"{key}[1] = {f} is wrong: the largest column index in {prefix}indices is "
               f"{top - 1}, so {top} columns would do" if f > 2 * top else
               "the graph's features do not fit in this machine's memory: use fewer feature "
               "columns, or prepare it out of core (quietgnn prepare EDGES --nodes NODES)")
        raise ValueError(f"{where}: key {key} = [{n}, {f}] asks for a dense float32 matrix of "
                         f"{_size(need)}, more than the {_size(avail)} available; {why}")
    return n, f


def _size(b: float) -> str:
    return f"{b / 2 ** 40:.3g} TiB" if b >= 2 ** 40 else f"{b / 2 ** 30:.3g} GiB"


def _finish(path: Path, edge_index: np.ndarray, x: np.ndarray | None, y: np.ndarray,
            masks: list[np.ndarray | None] | None, num_classes: int | None, split_seed: int,
            where: dict[str, str], label_names: list[str] | None = None) -> Graph:
    """The graph of a file's arrays, checked as every graph's inputs are
    (:func:`quietgnn.graphinput.graph_inputs`), errors naming the file and key."""
    masks = masks or [None, None, None]
    split = any(m is not None for m in masks)
    meta = {"source": f"file:{path}", "features": "file" if x is not None else
            "degree-buckets", "split": "file" if split else "random"}
    if not split:
        meta.update(split_seed=split_seed, split_fractions=[0.6, 0.2, 0.2])
    if label_names is not None:
        meta["label_names"] = label_names   # class k is label_names[k]
    # the labels fix the number of nodes (isolated nodes with high ids are kept), so a
    # feature table of other length is the one blamed
    return Graph.from_edge_index(
        edge_index, x, y, num_classes=num_classes, train_mask=masks[0], val_mask=masks[1],
        test_mask=masks[2], undirected=True, name=path.stem, split_seed=split_seed, meta=meta,
        sources={"graph": str(path), "edge_index": str(path), **where}, nodes_from="y")


def _unlabelled(path: Path, edge_index: np.ndarray, x: np.ndarray | None, rows: int | None,
                split_seed: int, where: dict[str, str]) -> Graph:
    """A graph file's edges and features alone, to predict on: a graph without labels (or
    with ``-1`` for the unknown ones) is what one predicts for. The number of nodes is the
    features' rows, else the labels' length (``rows``), else the largest edge id + 1; the
    labels are all 0 and marked absent, so nothing mistakes them for the graph's."""
    n = int(x.shape[0]) if x is not None and np.ndim(x) >= 1 else rows
    if n is None:
        n = int(edge_index.max()) + 1 if edge_index.size else 0
    g = _finish(path, edge_index, x, np.zeros(n, dtype=np.int64), None, 2, split_seed, where)
    g.meta["labels"] = "absent"
    return g


def load_npz(path: str | os.PathLike, *, split_seed: int = 0, labels: bool = True) -> Graph:
    """Load a graph from one ``.npz`` archive (keys in the module docstring); ``labels=False``:
    without reading its labels and masks (:func:`_unlabelled`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"graph file {str(path)!r} not found (expected a .npz with keys "
                         f"edge_index (or src, dst), y, optional x and masks)")
    with NpzArchive(path) as z:
        keys = set(z.files)
        if "adj_indptr" in keys:    # the Shchur et al. CSR layout (module docstring)
            ei = csr_edges(z, str(path))
        elif "edge_index" in keys:
            ei = np.asarray(z["edge_index"])
            if ei.ndim != 2 or ei.shape[0] != 2:
                hint = " (transpose it: edge_index.T)" if ei.ndim == 2 and ei.shape[1] == 2 else ""
                raise ValueError(f"{path}: key 'edge_index' has shape {tuple(ei.shape)}, expected "
                                 f"[2, E] (source row, destination row){hint}")
        elif {"src", "dst"} <= keys:
            src, dst = np.asarray(z["src"]).reshape(-1), np.asarray(z["dst"]).reshape(-1)
            if src.shape != dst.shape:
                raise ValueError(f"{path}: keys 'src' ({src.size}) and 'dst' ({dst.size}) differ "
                                 f"in length; they must list the same edges")
            ei = np.stack([src, dst])
        else:
            raise ValueError(f"{path}: no edges: expected key 'edge_index' [2, E] or keys 'src' "
                             f"and 'dst' [E]; found keys {sorted(keys)}")
        if ei.dtype.kind not in "iu":
            raise ValueError(f"{path}: edge ids have dtype {ei.dtype}, expected integers")
        ykey = "y" if "y" in keys or "labels" not in keys else "labels"
        if not labels:
            rows = len(z[ykey]) if ykey in keys else None     # they fix N, as below
            x = np.asarray(z["x"]) if "x" in keys else \
                csr_features(z, "attr_" if "attr_data" in keys else "x_", str(path), rows)
            return _unlabelled(path, ei, x, rows, split_seed, {"x": f"{path} key 'x'"})
        if ykey not in keys:
            raise ValueError(f"{path}: missing key 'y' (int labels [N]); found keys "
                             f"{sorted(keys)}. Node classification needs a label per node")
        y, names = class_ids(z[ykey], f"{path} key {ykey!r}")
        x = np.asarray(z["x"]) if "x" in keys else \
            csr_features(z, "attr_" if "attr_data" in keys else "x_", str(path), y.shape[0])
        masks = [np.asarray(z[k]) if k in keys else None for k in MASKS]
        num_classes = _scalar_int(z["num_classes"], f"{path} key 'num_classes'") \
            if "num_classes" in keys else None
    where = {k: f"{path} key {k!r}" for k in ("x", "num_classes") + MASKS}
    return _finish(path, ei, x, y, masks, num_classes, split_seed,
                   dict(where, y=f"{path} key {ykey!r}"), names)


def _scalar_int(arr: np.ndarray, where: str) -> int:
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{where}: holds {arr.dtype} of shape {tuple(arr.shape)}; expected one "
                         f"integer (np.int64(C))")
    return int(arr.reshape(-1)[0])


def csr_edges(z: Any, where: str) -> np.ndarray:
    """``[2, E]`` edges (source, destination) of the adjacency stored as ``adj_*`` CSR keys
    (row = source, as the Shchur et al. files store it; quietgnn makes the graph undirected)."""
    missing = [f"adj_{k}" for k in ("data", "indices", "indptr", "shape") if f"adj_{k}" not in z]
    if missing:
        raise ValueError(f"{where}: the CSR adjacency needs keys adj_data, adj_indices, "
                         f"adj_indptr, adj_shape; {missing} missing")
    indptr, indices = np.asarray(z["adj_indptr"]), np.asarray(z["adj_indices"])
    if indptr.ndim != 1 or indptr.size < 1 or indptr.dtype.kind not in "iu" or \
            indices.ndim != 1 or indices.dtype.kind not in "iu" or indptr[0] != 0 or \
            (np.diff(indptr) < 0).any() or indptr[-1] != indices.size:
        raise ValueError(f"{where}: adj_indptr and adj_indices are not a CSR adjacency "
                         f"(expected integer indptr [N+1] from 0, non-decreasing, ending at "
                         f"len(adj_indices) = {indices.size}); write it with "
                         f"scipy.sparse.save_npz")
    src = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr.astype(np.int64)))
    return np.stack([src, indices.astype(np.int64)])


def _read_array(stem_path: Path, what: str, required: bool,
                rows: int | None = None) -> tuple[np.ndarray | None, str]:
    for suffix in (".npy", ".txt", ".npz"):
        p = stem_path.with_name(f"{stem_path.name}.{what}{suffix}")
        if p.is_file():
            if suffix == ".npz":    # scipy.sparse.save_npz's keys
                with NpzArchive(p) as z:
                    arr = csr_features(z, "", str(p), rows)
                if arr is None:
                    raise ValueError(f"{p}: expected a sparse matrix written by "
                                     f"scipy.sparse.save_npz (keys data, indices, indptr, "
                                     f"shape); found keys {sorted(z.files)}")
            elif suffix == ".npy":
                arr = load_npy(p)
            else:
                try:
                    arr = np.loadtxt(p, ndmin=1)
                except ValueError as exc:
                    if what != "labels":
                        raise ValueError(f"{p}: {exc} (expected numbers, one row per node)") \
                            from None
                    arr = np.loadtxt(p, ndmin=1, dtype=str)   # label names, one per line
            return arr, str(p)
    if required:
        raise ValueError(f"{stem_path.parent / stem_path.name}: edge list needs its labels: "
                         f"expected {stem_path.name}.{what}.npy (int [N]) or "
                         f"{stem_path.name}.{what}.txt (one label per line) in "
                         f"{str(stem_path.parent)!r}")
    return None, ""


def _parse_edges(path: Path) -> np.ndarray:
    """int64 ``[2, E]`` from a text edge list (C parser; comma or whitespace separated)."""
    delimiter, skip = None, 0
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            s = line.strip()
            if s and s[0] not in "#%":
                delimiter = "," if "," in s else None
                first = s.split(delimiter)[:2]
                if not all(_is_int(v) for v in first):
                    skip = lineno     # a header such as id_1,id_2 (CSV exports have one)
                break
        else:
            raise ValueError(f"{path}: no edges found (only blank or comment lines); expected "
                             f"one 'u v' pair per line")
    try:
        arr = np.loadtxt(path, comments=("#", "%"), delimiter=delimiter, dtype=np.int64,
                         ndmin=2, usecols=(0, 1), skiprows=skip)
    except ValueError as exc:
        raise ValueError(f"{path}: could not read it as an edge list ({exc}); expected one "
                         f"'u v' pair of integer node ids per line, '#' for comments") from exc
    return arr.T.copy()


def _is_int(v: str) -> bool:
    try:
        int(v.strip().strip('"'))
        return True
    except ValueError:
        return False


def load_edge_list(path: str | os.PathLike, *, split_seed: int = 0,
                   labels: bool = True) -> Graph:
    """Load ``path`` (edge list) with ``<stem>.labels.npy`` and optional
    ``<stem>.features.npy`` next to it (see the module docstring); ``labels=False``: the
    labels file is optional and only its length is read (:func:`_unlabelled`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"edge list {str(path)!r} not found (expected 'u v' lines, with "
                         f"{path.stem}.labels.npy next to it)")
    ei = _parse_edges(path)
    stem = path.with_suffix("")
    y_raw, where_y = _read_array(stem, "labels", required=labels)
    if not labels:
        rows = None if y_raw is None else len(y_raw)
        x, where_x = _read_array(stem, "features", required=False, rows=rows)
        if x is not None and x.ndim == 1:
            x = x[:, None]
        return _unlabelled(path, ei, x, rows, split_seed, {"x": where_x})
    y, names = class_ids(y_raw, where_y)
    x, where_x = _read_array(stem, "features", required=False, rows=y.shape[0])
    if x is not None and x.ndim == 1:
        x = x[:, None]
    return _finish(path, ei, x, y, None, None, split_seed, {"x": where_x, "y": where_y}, names)
