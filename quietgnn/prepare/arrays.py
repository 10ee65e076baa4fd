"""Plain ``.npy`` arrays written and read in a stream (the out-of-core prepare's file I/O):
front-to-back writes instead of writable memory maps, chunked reads instead of mapped ones,
so the bytes go through the page cache and never count as the process's resident memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = ["NpyWriter", "npy_chunks", "lookup", "BATCH_ROWS"]

#: rows per record batch streamed out of DuckDB and per chunk read back from a temporary array
#: (bounds Python's per-batch temporaries)
BATCH_ROWS = 1 << 20


class NpyWriter:
    """A ``.npy`` file of known dtype and shape written front to back with plain writes, not
    through a writable memory map: mapped pages being written count as the process's resident
    memory (GiBs of features at 10^8 nodes), appended bytes go to the page cache only."""

    def __init__(self, path: Path, dtype: Any, shape: tuple[int, ...]) -> None:
        self.dtype, self.path = np.dtype(dtype), path
        self.left = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self.f = open(path, "wb")
        np.lib.format.write_array_header_1_0(self.f, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": tuple(int(v) for v in shape)})

    def write(self, a: np.ndarray) -> None:
        b = np.ascontiguousarray(a, dtype=self.dtype)
        self.left -= b.nbytes
        self.f.write(memoryview(b).cast("B"))

    def close(self) -> None:
        self.f.close()
        if self.left != 0:
            raise RuntimeError(f"{self.path}: {self.left} bytes short of its declared shape")


def lookup(table: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``searchsorted(table, queries)`` with the queries sorted first: sorted queries walk the
    table in order and stay in cache (several times faster than random ones on tables of
    10^7 entries, sort included)."""
    perm = np.argsort(queries, kind="stable")
    out = np.empty(queries.size, dtype=np.int64)
    out[perm] = np.searchsorted(table, queries[perm])
    return out


def npy_chunks(path: Path) -> Iterator[np.ndarray]:
    """A 1-d ``.npy`` file in chunks of ``BATCH_ROWS``, read (not mapped)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                       np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(f)
        left = int(np.prod(shape))
        while left:
            chunk = np.fromfile(f, dtype=dtype, count=min(left, BATCH_ROWS))
            left -= chunk.size
            yield chunk
