"""One rank's part on disk as plain ``.npy`` arrays that a worker memory-maps.

A part directory (``part-<k>/`` in a partition book) holds one file per array of
:class:`~quietgnn.partition.LocalPartition` and a ``part.json`` with its scalars::

    owned.npy halo.npy halo_owner.npy       int64 global ids
    indptr.npy                              int64 [n_own + 1]
    indices.npy                             int32 local ids (int64 when n_own + n_halo >= 2^31)
    in_degree.npy out_degree.npy            int64 global degrees of the local rows
    x.npy                                   float32 [n_own, F] (or float16: ``x_dtype``)
    y.npy train_mask.npy val_mask.npy test_mask.npy
    send_idx.npy send_counts.npy            every peer's send plan, concatenated, and its sizes
    recv_counts.npy                         int64 [P]

Why plain arrays: ``np.load(mmap_mode="c")`` maps them without copying (copy-on-write, so
nothing a worker does writes back), no file can hold code (``allow_pickle=False``), and any tool
that reads ``.npy`` can inspect a part. The book's manifest holds every file's size and sha256,
which :meth:`PartitionBook.load_part` checks (one sequential read of the part, which also warms
the page cache) before this module maps it; what the part says is then checked too
(:func:`check_part_arrays`: dtypes, shapes, ids, labels and plans in range, counts that add
up), since a checksum updated with the data proves nothing. The worker then widens the edges
to int64 and float16 features to float32 (the strategies index and compute in those): those
two arrays are copies in its memory; the rest stays mapped. A strategy that converts what it
reads (the mini-batch paths gather a few rows per step) asks for the part as stored
(``stored=True``): nothing is copied, the edges and features stay mapped.
"""

from __future__ import annotations

import ctypes
import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..serial import json_excerpt, loads_json
from .local import LocalPartition

__all__ = ["write_part", "read_part", "check_part_arrays", "advise_access", "PART_ARRAYS"]

#: array files of a part, in the order they are written
PART_ARRAYS = ("owned", "halo", "halo_owner", "indptr", "indices", "in_degree", "out_degree",
               "x", "y", "train_mask", "val_mask", "test_mask", "send_idx", "send_counts",
               "recv_counts")
_SCALARS = ("rank", "num_parts", "num_nodes_global", "num_edges_global", "num_classes",
            "num_train_global", "num_val_global", "num_test_global", "graph_name",
            "graph_fingerprint", "book_id", "meta")


def write_part(path: Path, lp: LocalPartition, x_dtype: str = "float32") -> None:
    """Write ``lp`` as ``path/part.json`` + one ``.npy`` per array."""
    if x_dtype not in ("float32", "float16"):
        raise ValueError(f"x_dtype = {x_dtype!r}; expected float32 or float16")
    path.mkdir(parents=True, exist_ok=True)
    wide = lp.n_local >= 2 ** 31
    send_counts = torch.tensor([t.numel() for t in lp.send_idx], dtype=torch.int64)
    send_idx = torch.cat(lp.send_idx) if lp.send_idx else torch.zeros(0, dtype=torch.int64)
    arrays = {
        "owned": lp.owned, "halo": lp.halo, "halo_owner": lp.halo_owner, "indptr": lp.indptr,
        "indices": lp.indices if wide else lp.indices.to(torch.int32),
        "in_degree": lp.in_degree, "out_degree": lp.out_degree,
        "x": lp.x.to(getattr(torch, x_dtype)), "y": lp.y, "train_mask": lp.train_mask,
        "val_mask": lp.val_mask, "test_mask": lp.test_mask, "send_idx": send_idx,
        "send_counts": send_counts, "recv_counts": lp.recv_counts,
    }
    for name in PART_ARRAYS:
        np.save(path / f"{name}.npy", arrays[name].contiguous().numpy(), allow_pickle=False)
    scalars = {k: getattr(lp, k) for k in _SCALARS}
    (path / "part.json").write_text(json.dumps(scalars, indent=1))


def _array(path: Path, name: str) -> np.ndarray:
    f = path / f"{name}.npy"
    try:
        # "c": mapped copy-on-write (writable for torch, never written back); no pickles
        a = np.load(f, mmap_mode="c", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise ValueError(f"partition file {str(f)!r} holds pickled Python objects, which "
                             f"quietgnn never loads (they can run code); re-run `quietgnn "
                             f"prepare` from the data") from None
        raise ValueError(f"partition file {str(f)!r} is not a readable .npy array ({exc}); "
                         f"re-run `quietgnn prepare`") from None
    return a


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a) if a.size else torch.from_numpy(np.array(a))


def read_part(path: Path, stored: bool = False) -> LocalPartition:
    """The :class:`LocalPartition` stored in ``path`` (arrays memory-mapped, not copied;
    ``part.json`` and the arrays checked first: :func:`check_part_arrays`). ``stored``:
    ``indices`` and ``x`` keep the file's dtypes (int32 edges, float16 features) and stay
    mapped instead of being widened to int64 / float32 copies."""
    try:
        scalars: dict[str, Any] = loads_json((path / "part.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"partition file {str(path / 'part.json')!r} is unreadable ({exc}); "
                         f"re-run `quietgnn prepare`") from None
    _check_scalars(path / "part.json", scalars)
    scalars = {k: scalars[k] for k in _SCALARS}
    a = {name: _array(path, name) for name in PART_ARRAYS}
    check_part_arrays(path, scalars, a)
    t = {name: _tensor(v) for name, v in a.items()}
    counts = [int(c) for c in a["send_counts"]]
    send_all = t.pop("send_idx")
    del t["send_counts"]
    if not stored:
        # Most strategies index with int64 and compute in fp32: widen here (one copy of the
        # part's edges; the mapped int32 file is what stays on disk and in the page cache).
        t["indices"] = t["indices"].to(torch.int64)
        t["x"] = t["x"].to(torch.float32)
    return LocalPartition(send_idx=list(torch.split(send_all, counts)), **t, **scalars)


def _check_scalars(f: Path, scalars: Any) -> None:
    """``part.json``: every scalar present with its type and range (one line naming it)."""
    fix = "the part was edited or is damaged: re-run `quietgnn prepare`"
    if not isinstance(scalars, dict):
        raise ValueError(f"partition file {str(f)!r} holds a {type(scalars).__name__}, "
                         f"expected a JSON object of the part's scalars; {fix}")
    missing = [k for k in _SCALARS if k not in scalars]
    if missing:
        raise ValueError(f"partition file {str(f)!r} lacks {missing}; it was written by "
                         f"another version or edited: re-run `quietgnn prepare`")
    for key in _SCALARS:
        v, low = scalars[key], _LOW.get(key)
        want = "an object" if key == "meta" else "a string" if low is None else \
            f"an int >= {low}"
        ok = isinstance(v, dict) if key == "meta" else isinstance(v, str) if low is None \
            else isinstance(v, int) and not isinstance(v, bool) and v >= low
        if not ok:
            raise ValueError(f"partition file {str(f)!r}: {key} = {json_excerpt(v)}, "
                             f"expected {want}; {fix}")
    if scalars["rank"] >= scalars["num_parts"]:
        raise ValueError(f"partition file {str(f)!r}: rank = {scalars['rank']} is not below "
                         f"num_parts = {scalars['num_parts']}; {fix}")


#: the least value of every integer scalar of ``part.json`` (the others are strings)
_LOW = {"rank": 0, "num_parts": 1, "num_nodes_global": 1, "num_edges_global": 0,
        "num_classes": 2, "num_train_global": 0, "num_val_global": 0, "num_test_global": 0}
#: dtypes of a part's arrays (``x``: float32 or float16; ``indices``: int32 or int64)
_DTYPES = {**{k: ("int64",) for k in PART_ARRAYS}, "indices": ("int32", "int64"),
           "x": ("float32", "float16"), "train_mask": ("bool",), "val_mask": ("bool",),
           "test_mask": ("bool",)}


def check_part_arrays(path: Path, sc: dict[str, Any], a: dict[str, np.ndarray]) -> None:
    """A part's arrays against each other and its scalars, as :meth:`Graph.validate` checks a
    graph: dtypes, shapes, ids, labels and plans in range, counts that add up. Vectorised
    over the mapped arrays (min / max and a few per-node passes; the edges are scanned for
    their range, nothing of edge size is allocated), so a part that lies is one
    ``ValueError`` naming the file and the value, not an ``IndexError`` in a kernel or a
    collective that aborts the process. Not checked: finite features (a NaN reaches the
    loss, which the trainer's finite-value check stops on every rank) and what only the
    peers know (that a send plan matches the peer's halo: :mod:`.plans` checks it at set-up,
    on every rank)."""
    def bad(name: str, what: str) -> ValueError:
        return ValueError(f"partition file {str(path / (name + '.npy'))!r} {what}; the part "
                          f"is damaged or was edited: re-run `quietgnn prepare`")

    for name, v in a.items():
        if str(v.dtype) not in _DTYPES[name] or v.ndim != (2 if name == "x" else 1):
            raise bad(name, f"has dtype {v.dtype} shape {list(v.shape)}, expected "
                            f"{' or '.join(_DTYPES[name])} with {2 if name == 'x' else 1} "
                            f"dimension(s)")
    P, N, n_own, n_halo = sc["num_parts"], sc["num_nodes_global"], a["owned"].size, a["halo"].size
    n_local = n_own + n_halo
    sizes = {"halo_owner": n_halo, "indptr": n_own + 1, "in_degree": n_local,
             "out_degree": n_local, "x": n_own, "y": n_own, "train_mask": n_own,
             "val_mask": n_own, "test_mask": n_own, "recv_counts": P, "send_counts": P}
    for name, want in sizes.items():
        if a[name].shape[0] != want:
            raise bad(name, f"has {a[name].shape[0]} rows, expected {want} (this part owns "
                            f"{n_own} nodes (owned.npy) and has {n_halo} halo nodes "
                            f"(halo.npy), of {P} parts)")

    def within(name: str, lo: int, hi: int, what: str) -> None:
        v = a[name]
        if v.size and (int(v.min()) < lo or int(v.max()) >= hi):
            raise bad(name, f"holds values in [{int(v.min())}, {int(v.max())}], expected "
                            f"{what} in [{lo}, {hi})")
    within("owned", 0, N, "node ids")
    within("halo", 0, N, "node ids")
    within("halo_owner", 0, P, "part ids")
    within("indices", 0, n_local, "local node ids (owned + halo)")
    within("send_idx", 0, n_own, "owned rows")
    within("y", 0, sc["num_classes"], f"labels (num_classes = {sc['num_classes']} in "
                                      f"part.json)")
    for name in ("in_degree", "out_degree", "send_counts"):
        if a[name].size and int(a[name].min()) < 0:
            raise bad(name, f"holds the count {int(a[name].min())}, expected counts >= 0")
    if n_own > 1 and not bool((np.diff(a["owned"]) > 0).all()):
        raise bad("owned", "is not strictly ascending (the local numbering needs it)")
    ptr = a["indptr"]
    rows = np.diff(ptr)                 # each owned row's in-edges (read twice below)
    if int(ptr[0]) != 0 or int(ptr[-1]) != a["indices"].size or not bool((rows >= 0).all()):
        raise bad("indptr", f"runs from {int(ptr[0])} to {int(ptr[-1])} (or decreases), "
                            f"expected a non-decreasing 0 .. {a['indices'].size} (indices.npy)")
    if not np.array_equal(rows, a["in_degree"][:n_own]):
        # an owned row's in-edges are all in this part: its degree is its row's length (the
        # GCN norm reads the degrees; edited ones would weigh the edges wrongly, silently)
        raise bad("in_degree", "disagrees with indptr.npy on an owned row's in-edges (every "
                               "in-edge of an owned node is in its part)")
    if a["indices"].size > sc["num_edges_global"]:
        raise bad("indices", f"holds {a['indices'].size} edges, more than num_edges_global = "
                             f"{sc['num_edges_global']} (part.json)")
    if n_own and a["halo"].size:
        # a halo node is another part's: one this part owns means the halo was edited (its
        # rows would be received for a node held here; the peers' send plans would not fit)
        at = np.minimum(np.searchsorted(a["owned"], a["halo"]), n_own - 1)
        if bool((a["owned"][at] == a["halo"]).any()):
            raise bad("halo", "lists a node this part owns (owned.npy): a halo node is "
                              "another part's")
    if bool((a["halo_owner"] == sc["rank"]).any()):
        raise bad("halo_owner", f"names this part ({sc['rank']}) as a halo node's owner")
    step = np.diff(a["halo_owner"])
    if not bool(((step > 0) | ((step == 0) & (np.diff(a["halo"]) > 0))).all()):
        raise bad("halo", "is not in (owner, id) order (halo_owner.npy), which is the order "
                          "its rows arrive in")
    have = np.bincount(a["halo_owner"], minlength=P)
    if not np.array_equal(have, a["recv_counts"]):
        raise bad("recv_counts", f"says {a['recv_counts'].tolist()[:8]} rows arrive from each "
                                 f"peer, halo_owner.npy says {have.tolist()[:8]}")
    if int(a["send_counts"].sum()) != a["send_idx"].size:
        raise bad("send_counts", f"sums to {int(a['send_counts'].sum())} but send_idx.npy has "
                                 f"{a['send_idx'].size} entries")
    rises = np.diff(a["send_idx"]) > 0          # ascending within each peer's plan
    ends = np.cumsum(a["send_counts"])[:-1] - 1
    rises[ends[(ends >= 0) & (ends < rises.size)]] = True
    if not bool(rises.all()):
        raise bad("send_idx", "is not ascending within each peer's plan (the order the peer "
                              "stores the rows in)")
    masks = [a[m] for m in ("train_mask", "val_mask", "test_mask")]
    for m, name in zip(masks, ("train", "val", "test")):
        if int(m.sum()) > sc[f"num_{name}_global"]:
            raise bad(f"{name}_mask", f"selects {int(m.sum())} nodes, more than "
                                      f"num_{name}_global = {sc[f'num_{name}_global']} "
                                      f"(part.json)")
    if bool((masks[0] & masks[1]).any() | (masks[0] & masks[2]).any() |
            (masks[1] & masks[2]).any()):
        raise bad("train_mask", "overlaps val_mask or test_mask (the splits must be disjoint)")
    if a["x"].shape[1] < 1:
        raise bad("x", f"has shape {list(a['x'].shape)}, expected at least one feature")


_libc: Any = None


def advise_access(tensors: Any, random: bool) -> None:
    """Tell the kernel how the pages under ``tensors`` (mapped files, typically) will be read:
    ``random=True`` for a few rows at scattered places (a sampler's steps), which turns off
    read-around for them; ``random=False`` restores the default, for sequential scans.

    Why: a fault on a mapped file's page reads the device's ``read_ahead_kb`` around it (8 MiB
    on some virtual disks), so once a rank's mapped arrays exceed the page cache, a step that
    gathers 10^5 random rows reads gigabytes to use kilobytes. Harmless on anonymous memory;
    does nothing where ``madvise`` is not available (not Linux)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return
    advice = mmap.MADV_RANDOM if random else mmap.MADV_NORMAL
    page = mmap.PAGESIZE
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        addr, n = storage.data_ptr(), storage.nbytes()
        start = addr & ~(page - 1)
        # a failure (memory that is not mapped as pages, e.g. a tensor of another device)
        # only means no advice: reading is correct either way
        _libc.madvise(start, addr + n - start, advice)
