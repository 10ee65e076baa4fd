"""Where sparse input features stop paying: dense vs sparse first layer on random matrices.

    .venv/bin/python benchmarks/calibrate_sparse.py            # densities 0.01 .. 0.8
    .venv/bin/python benchmarks/calibrate_sparse.py --fresh    # a new matrix every step

For a random ``[N, F]`` feature matrix of each density (uniform non-zero positions, no real
dataset involved) times, on one thread, what the first layer of a training step costs both
ways: dense (``F.dropout`` + ``x W^T`` forward and weight gradient) and sparse
(:class:`quietgnn.nn.SparseFeatures`: dropout of the non-zeros + the same two products).
``quietgnn.nn.sparse.SPARSE_MAX_DENSITY`` is set from where the two cross.

``--fresh``: every step gathers its rows anew (``x[idx]`` dense, ``rows(idx)`` sparse), as a
mini-batch's fetched input is: the sparse matrix then has no transposed structure cached from
an earlier step and builds it (a sort of its non-zeros) for the weight gradient. Where the two
cross then sets ``quietgnn.nn.sparse.BATCH_MAX_DENSITY``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _cpu_ms(fn, reps: int) -> float:
    fn()
    c0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - c0) / reps * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--features", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--densities", default="0.01,0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh", action="store_true", help="a newly gathered matrix every step")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import warnings
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    from quietgnn.nn import SparseFeatures
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(args.hidden, args.features, requires_grad=True)
    print("| density | dense ms | sparse ms | sparse / dense |\n|---|---|---|---|")
    for d in (float(v) for v in args.densities.split(",")):
        x = (torch.rand(args.nodes, args.features, generator=gen) < d).float()
        xs = SparseFeatures.from_dense(x)

        idx = torch.randperm(args.nodes, generator=gen)

        def dense():
            w.grad = None
            out = F.linear(F.dropout(x[idx] if args.fresh else x, 0.5, True), w)
            out.backward(torch.ones_like(out))

        def sparse():
            w.grad = None
            out = (xs.rows(idx) if args.fresh else xs).dropout(0.5).linear(w)
            out.backward(torch.ones_like(out))
        a, b = _cpu_ms(dense, args.reps), _cpu_ms(sparse, args.reps)
        print(f"| {d:.2f} | {a:.1f} | {b:.1f} | {b / a:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
