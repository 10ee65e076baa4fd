"""This process's memory: its resident set now and at its peak, and handing freed heap memory
back to the system after a phase that allocated and dropped a lot.

The peak is the kernel's high-water mark of this process's own address space (``VmHWM``).
``getrusage``'s ``ru_maxrss`` is not: Linux carries it across ``fork`` and ``exec``, so a
worker the launcher starts after loading a graph reports the launcher's peak as its own.

glibc's malloc serves allocations below its mmap threshold from the process heap, and raises
that threshold (up to 32 MiB) each time a larger mmapped block is freed, so after a set-up
that built and dropped many temporaries of a few MiB each (sorts, masks, id maps) the freed
memory stays in the heap: resident, counted in the rank's RSS, unused until something of the
right size is allocated again. Measured with the memory ledger (QUIETGNN_MEM_LEDGER) on
grappa's mini-batch set-up, that retained heap was most of what the ledger could not name.
``malloc_trim(0)`` returns every free page of the heap, not only its top. Lowering the mmap
threshold for the whole run would also avoid it, but every step's activations would then be
fresh mappings (page faults on each use), so the trim runs once per phase instead.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from typing import Any

__all__ = ["trim", "peak_rss_mb", "rss_mb", "mem_available_mb"]

_libc: Any = None


def trim() -> bool:
    """Return the heap's free pages to the system; True when glibc released some. A no-op
    (False) where the C library has no ``malloc_trim`` (not Linux, or not glibc)."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL("libc.so.6")
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                lib.malloc_trim.restype = ctypes.c_int
                _libc = lib
            except (OSError, AttributeError):   # musl and others: nothing to call
                _libc = False
    return bool(_libc.malloc_trim(0)) if _libc else False


def _status_kib(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident set of this process (not of the one that started it), MiB. Where there
    is no ``/proc`` (not Linux) ``ru_maxrss``, which may include the parent's peak."""
    kib = _status_kib("VmHWM")
    if kib is None:
        # macOS reports bytes, Linux KiB
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib /= 1024.0 if sys.platform == "darwin" else 1.0
    return kib / 1024.0


def rss_mb() -> float:
    """Resident set of this process now, MiB (NaN where there is no ``/proc``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):
        return float("nan")


def mem_available_mb() -> float:
    """The machine's memory available without swapping (the kernel's ``MemAvailable``; other
    users' memory counts), inf where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("inf")
