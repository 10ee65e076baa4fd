"""quietgnn/heap.py: the trim hands the heap's freed pages back (glibc only)."""

import sys

import pytest

from quietgnn import heap


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's /proc and glibc")
def test_trim_returns_freed_heap_pages():
    if not heap.trim() and heap._libc is False:
        pytest.skip("no malloc_trim in this C library (not glibc)")
    # 64 KiB blocks sit below glibc's mmap threshold: they come from the heap. Freeing all
    # but the last keeps the heap's top in use, so glibc's automatic top trim cannot give
    # the freed ones back; only malloc_trim(0) can
    blocks = [bytearray(64 << 10) for _ in range(3200)]     # 200 MiB, pages touched
    keep = blocks[-1]
    del blocks
    before = _rss_anon_kib()
    assert heap.trim() is True
    after = _rss_anon_kib()
    assert before - after > 100 << 10, (before, after)
    assert len(keep) == 64 << 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_peak_rss_is_the_process_own_not_its_parents():
    """A worker started by a process that once held a lot of memory (the launcher after
    loading a graph) reports its own peak: ``ru_maxrss`` would report the parent's, since
    Linux carries it across fork and exec."""
    import subprocess
    # heap.py alone (no torch import: the grandchild starts in milliseconds)
    code = f"import runpy; print(runpy.run_path({heap.__file__!r})['peak_rss_mb']())"
    child = ("import sys, subprocess\n"
             "big = bytearray(1 << 30)\n"
             "big[::4096] = b'x' * len(big[::4096])\n"
             "del big\n"
             f"print(subprocess.run([sys.executable, '-c', {code!r}], capture_output=True,"
             " text=True, check=True).stdout)\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True).stdout
    grandchild_peak = float(out)
    assert 0 < grandchild_peak < 256, grandchild_peak   # the parent's peak was above 1 GiB
