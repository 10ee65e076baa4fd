"""One rank of the link probe of ``bench_network.py --probe`` (run under torchrun on the
emulated hosts): timed exchanges of known sizes through quietgnn's communicator, printed by
rank 0 as one JSON line (``PROBE {...}``).

- ``single``: rank 0 sends ``3 * BLOCK`` bytes to rank 1, nobody else sends (one TCP flow);
- ``collective``: every rank sends ``BLOCK`` bytes to every other rank at once (gloo's
  all-to-all: one connection per pair carries both directions);
- ``split``: the same exchange with ``runtime.duplex`` on (one connection per direction).

Each host sends ``3 * BLOCK`` bytes in every case, so each takes that over the link's rate
if the link were the only cost. Each is timed between barriers, best of ``REPEATS``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quietgnn.comm import Communicator  # noqa: E402

BLOCK = 2 * 1024 * 1024
REPEATS = 2


def _timed(comm: Communicator, rows: list[int]) -> float:
    send = [torch.ones(n, dtype=torch.float32) for n in rows]
    best = float("inf")
    for _ in range(REPEATS):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_to_all(send, "probe", carries="control")
        comm.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    comm = Communicator.init(rank, world, timeout_s=300)
    n = BLOCK // 4
    _timed(comm, [1] * world)                      # connections up
    single = _timed(comm, [3 * n if (rank, j) == (0, 1) else 0 for j in range(world)])
    balanced = [0 if j == rank else n for j in range(world)]
    collective = _timed(comm, balanced)
    comm.split_duplex("on")
    _timed(comm, [1] * world)
    split = _timed(comm, balanced)
    if rank == 0:
        print("PROBE " + json.dumps({"hosts": world, "bytes_per_host": 3 * BLOCK,
                                     "single_s": single, "collective_s": collective,
                                     "split_s": split}), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
