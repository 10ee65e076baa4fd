"""Size on disk of a graph's ``.npz`` with dense against sparse (CSR) features.

    .venv/bin/python benchmarks/bench_npz_size.py

For each shared dataset found (CiteSeer first: 3,703 binary columns): the graph written with
``x`` dense (``np.savez`` and ``np.savez_compressed``) and with ``x`` as the CSR keys
``x_data``, ``x_indices``, ``x_indptr``, ``x_shape`` (the same two ways); every file is
loaded back with ``quietgnn.datasets.load_dataset`` and checked equal to the graph (features,
edges, labels, masks). Sizes are bytes of the files; nothing is timed.

Writes ``benchmarks/results/npz-size/npz-size.{json,md}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
GRAPHS = [("citeseer", "planetoid"), ("cora", "planetoid")]
FIELDS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


def _arrays(g, sparse: bool) -> dict[str, np.ndarray]:
    import scipy.sparse as sp
    out = {"edge_index": g.edge_index().numpy(), "y": g.y.numpy(),
           "train_mask": g.train_mask.numpy(), "val_mask": g.val_mask.numpy(),
           "test_mask": g.test_mask.numpy(), "num_classes": np.array(g.num_classes)}
    if sparse:
        m = sp.csr_matrix(g.x.numpy())
        out.update(x_data=m.data, x_indices=m.indices, x_indptr=m.indptr,
                   x_shape=np.array(m.shape), x_format=np.array(b"csr"))
    else:
        out["x"] = g.x.numpy()
    return out


def main() -> int:
    import torch

    from quietgnn.datasets import load_dataset
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, sub in GRAPHS:
            if not (DATA / sub).is_dir():
                print(f"skip {name}: {DATA / sub} not found", file=sys.stderr)
                continue
            g = load_dataset(name, DATA / sub)
            row = {"dataset": name, "nodes": g.num_nodes, "features": g.num_features,
                   "edges": g.num_edges, "nonzero_features": int((g.x != 0).sum()),
                   "dense_x_bytes": g.num_nodes * g.num_features * 4}
            for layout in ("dense", "sparse"):
                for save, how in ((np.savez, "savez"), (np.savez_compressed, "compressed")):
                    p = Path(tmp) / f"{name}-{layout}-{how}.npz"
                    save(p, **_arrays(g, layout == "sparse"))
                    back = load_dataset(str(p))
                    for f in FIELDS:
                        if not torch.equal(getattr(back, f), getattr(g, f)):
                            raise SystemExit(f"{p.name}: {f} differs after loading it back")
                    row[f"{layout}_{how}_bytes"] = p.stat().st_size
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    out = ROOT / "benchmarks" / "results" / "npz-size"
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/bench_npz_size.py"
    (out / "npz-size.json").write_text(json.dumps(
        {"command": cmd, "commit": commit, "when": time.strftime("%Y-%m-%d %H:%M"),
         "rows": rows}, indent=1))
    mb = lambda b: f"{b / 1e6:.2f} MB"  # noqa: E731
    md = ["# .npz size: dense vs sparse (CSR) features", "",
          f"`{cmd}` (commit {commit}). Each file loads back equal to the graph "
          f"(`load_dataset`).", "",
          "| dataset | nodes × features | non-zeros | dense savez | dense compressed | "
          "sparse savez | sparse compressed | dense / sparse |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['dataset']} | {r['nodes']} × {r['features']} | "
                  f"{r['nonzero_features']} | {mb(r['dense_savez_bytes'])} | "
                  f"{mb(r['dense_compressed_bytes'])} | {mb(r['sparse_savez_bytes'])} | "
                  f"{mb(r['sparse_compressed_bytes'])} | "
                  f"{r['dense_savez_bytes'] / r['sparse_savez_bytes']:.0f}× |")
    (out / "npz-size.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
