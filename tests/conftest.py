import os
import sys
import tempfile
from pathlib import Path

# tests import their shared helpers as a top-level module (also inside spawned workers)
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Partition books and dataset copies made by tests go to a throw-away cache, never ~/.cache.
if "QUIETGNN_CACHE" not in os.environ:
    os.environ["QUIETGNN_CACHE"] = tempfile.mkdtemp(prefix="quietgnn-test-cache-")
# One compute thread per process: tests spawn several workers on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# spawn_function keeps its worker processes between tests (quietgnn/runtime/spawn.py): a fresh
# process that imports torch costs 2-3 s of CPU, which was most of the suite's time.
os.environ.setdefault("QUIETGNN_REUSE_WORKERS", "1")
