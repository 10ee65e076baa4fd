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
the page cache) before this module maps it. The worker then widens the edges to int64 and
float16 features to float32 (the strategies index and compute in those): those two arrays are
copies in its memory; the rest stays mapped. A strategy that converts what it reads (the
mini-batch paths gather a few rows per step) asks for the part as stored (``stored=True``):
nothing is copied, the edges and features stay mapped.
"""

from __future__ import annotations

import ctypes
import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .local import LocalPartition

__all__ = ["write_part", "read_part", "advise_access", "PART_ARRAYS"]

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


def _array(path: Path, name: str) -> torch.Tensor:
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
    return torch.from_numpy(a) if a.size else torch.from_numpy(np.array(a))


def read_part(path: Path, stored: bool = False) -> LocalPartition:
    """The :class:`LocalPartition` stored in ``path`` (arrays memory-mapped, not read).
    ``stored``: ``indices`` and ``x`` keep the file's dtypes (int32 edges, float16 features)
    and stay mapped instead of being widened to int64 / float32 copies."""
    try:
        scalars: dict[str, Any] = json.loads((path / "part.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"partition file {str(path / 'part.json')!r} is unreadable ({exc}); "
                         f"re-run `quietgnn prepare`") from None
    missing = [k for k in _SCALARS if k not in scalars]
    if missing:
        raise ValueError(f"partition file {str(path / 'part.json')!r} lacks {missing}; it was "
                         f"written by another version or edited: re-run `quietgnn prepare`")
    a = {name: _array(path, name) for name in PART_ARRAYS}
    counts = [int(c) for c in a.pop("send_counts")]
    send_all = a.pop("send_idx")
    if sum(counts) != send_all.numel() or len(counts) != scalars["num_parts"]:
        raise ValueError(f"partition files in {str(path)!r} disagree: send_counts sum to "
                         f"{sum(counts)} over {len(counts)} peers, send_idx has "
                         f"{send_all.numel()} entries for {scalars['num_parts']} parts; re-run "
                         f"`quietgnn prepare`")
    if not stored:
        # Most strategies index with int64 and compute in fp32: widen here (one copy of the
        # part's edges; the mapped int32 file is what stays on disk and in the page cache).
        a["indices"] = a["indices"].to(torch.int64)
        a["x"] = a["x"].to(torch.float32)
    return LocalPartition(send_idx=list(torch.split(send_all, counts)), **a, **scalars)


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
