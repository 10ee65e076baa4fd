"""Bad input at every boundary (CLI values, config files, datasets, partition books,
checkpoints, graphs) ends with exit code 2 and one clear line naming the file or field, the
value found and what was expected: never a raw traceback, never a hang.

Most cases call the CLI entry point in-process (same code as ``python -m quietgnn``, minus a
second of interpreter start-up); the ones that only a worker can detect run real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from quietgnn.cli import main
from quietgnn.graph import Graph
from quietgnn.partition import make_book

TINY = ["train", "--strategy", "halo", "--dataset", "synthetic", "--synthetic.nodes", "300",
        "--synthetic.feature_dim", "8", "--parts", "2", "--hidden", "16", "--epochs", "2",
        "--runtime.progress", "false"]


def _run(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, err


def _subprocess(argv, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("QUIETGNN_FAULT", None)
    return subprocess.run([sys.executable, "-m", "quietgnn", *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("extra, message", [
    (["--model.hiden", "16"], "unknown key(s) ['model.hiden']; valid keys in 'model'"),
    (["--epochs", "0"], "train.epochs = 0; expected an int >= 1"),
    (["--lr", "abc"], "train.lr = 'abc' (str); expected a number"),
    (["--resume", "maybe"], "runtime.resume = 'maybe' (str); expected true or false"),
    (["--seed", "1.5"], "train.seed = 1.5 (float); expected an integer"),
    (["--parts", "0"], "partition.parts = 0"),
    (["--strategy", "nosuch"], "unknown strategy 'nosuch'; expected one of"),
    (["--runtime.keep_checkpoints", "1"], "runtime.keep_checkpoints = 1; expected an int >= 2"),
    (["--runtime.timeout_s", "0"], "runtime.timeout_s = 0"),
    (["--options.nosuch", "1"], "unknown option(s) ['nosuch'] for strategy 'halo'"),
    (["--options.lean", "true", "--model", "sage"],
     "options.lean = true needs model.arch in ['gcn']; got model.arch = 'sage'"),
    (["--strategy", "retexo", "--options.lean", "true", "--model", "gin"],
     "retexo: options.lean = true needs model.arch in ['gcn']; got model.arch = 'gin'"),
    (["--strategy", "adaqp", "--options.lean", "true", "--model", "gat"],
     "adaqp: options.lean = true needs model.arch in ['gcn']; got model.arch = 'gat'"),
    (["--strategy", "adaqp", "--options.lean", "true", "--options.cache_inputs", "false"],
     "options.lean = true needs options.cache_inputs = true"),
    (["stray"], "unexpected argument 'stray'"),
    (["--dataset", "nosuch"], "unknown dataset 'nosuch'; expected one of"),
    (["--dataset", "cora", "--root", "/nonexistent/qg"], "/nonexistent/qg"),
    (["--synthetic.nodes", "-5"], "synthetic.nodes = -5"),
    (["--partitioner", "given", "--partition.file", "/nonexistent/a.npy"],
     "partition file '/nonexistent/a.npy' does not exist"),
    (["--config", "/nonexistent/r.yaml"], "config file '/nonexistent/r.yaml' does not exist"),
])
def test_bad_cli_and_config_values(capsys, tmp_path, extra, message):
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path)] + extra)
    assert rc == 2, err
    assert message in err
    assert "Traceback" not in err


def test_bad_recipe_file(capsys, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("model: {hidden: [1, 2\n")
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path), "--config", str(f)])
    assert rc == 2 and f"config file '{f}' is not valid YAML at line 2, column 1: " in err
    assert len(err.strip().splitlines()) == 1, err      # one line, not PyYAML's context


# ---------------------------------------------------------------------- partition books
@pytest.fixture(scope="module")
def book(tmp_path_factory):
    # the graph TINY asks for: a book of another graph is refused before any worker starts
    from quietgnn.datasets import load_dataset
    path = tmp_path_factory.mktemp("book") / "b"
    make_book(path, load_dataset("synthetic", synthetic={"nodes": 300, "feature_dim": 8}),
              "metis", 2)
    return path


def _broken_copy(book, tmp_path, how):
    import shutil
    dst = tmp_path / "book"
    shutil.copytree(book, dst)
    how(dst)
    return dst


def _truncate(d):
    f = d / "part-1" / "indices.npy"
    f.write_bytes(f.read_bytes()[:-50])


def _version(d):
    meta = json.loads((d / "book.json").read_text())
    meta["version"] = 99
    (d / "book.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("how, message", [
    (lambda d: (d / "book.json").unlink(), "no partition book at"),
    (lambda d: (d / "part-0" / "x.npy").unlink(), "part-0/x.npy' is missing (listed in "
                                                    "book.json)"),
    (_truncate, "part-1/indices.npy' has"),
    (_version, "has version 99, this quietgnn reads version 2"),
    (lambda d: (d / "book.json").write_text("{not json"), "book.json' is not valid JSON"),
])
def test_damaged_partition_book(capsys, tmp_path, book, how, message):
    d = _broken_copy(book, tmp_path, how)
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path), "--book", str(d)])
    assert rc == 2, err
    assert message in err and str(d) in err
    assert "Traceback" not in err


def test_book_with_other_part_count(capsys, tmp_path, book):
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path), "--book", str(book), "--parts", "4"])
    assert rc == 2 and "has 2 parts but the run asks for 4" in err


def test_corrupted_part_found_by_the_worker(tmp_path, book):
    """Same size, other bytes: only the worker's checksum sees it; still exit 2 and one clear
    line, no traceback, no hang."""
    def flip(d):
        f = d / "part-1" / "x.npy"
        b = bytearray(f.read_bytes())
        b[len(b) // 2] ^= 0xFF
        f.write_bytes(bytes(b))
    d = _broken_copy(book, tmp_path, flip)
    r = _subprocess(TINY + ["--out", str(tmp_path), "--run-name", "r", "--book", str(d),
                            "--runtime.timeout_s", "20"])
    assert r.returncode == 2, r.stderr
    assert "part-1/x.npy' does not match the checksum" in r.stderr
    assert "rank 1 exited with code 1" in r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------------- checkpoints
def test_resume_with_an_incompatible_config(capsys, tmp_path):
    name = "old-halo-synthetic-p2"     # the pattern of an unnamed run's directory
    r = _subprocess(TINY + ["--out", str(tmp_path), "--run-name", name,
                            "--runtime.checkpoint_every", "1"])
    assert r.returncode == 0, r.stderr
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path), "--run-name", name, "--resume",
                                   "--hidden", "32", "--synthetic.nodes", "320"])
    assert rc == 2, err
    assert "model.hidden: checkpoint 16, this run 32" in err
    assert "synthetic.nodes: checkpoint 300, this run 320" in err
    # without --run-name, --resume finds the newest checkpointed run of this strategy/dataset/P
    rc, err = _run(capsys, TINY + ["--out", str(tmp_path), "--resume", "--hidden", "32"])
    assert rc == 2 and f"--resume: continuing {tmp_path / name}" in err
    assert "model.hidden: checkpoint 16, this run 32" in err


# ---------------------------------------------------------------------- graphs (API)
def test_bad_graph_arrays_are_named():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=r"edge .*id 7 >= num_nodes 3|7"):
        Graph.from_edge_index(torch.tensor([[0, 7], [1, 2]]), x, y, num_classes=2)
    with pytest.raises(ValueError, match=r"labels span \[0, 5\] but num_classes = 2"):
        Graph.from_edge_index(ei, x, torch.tensor([0, 5, 1]), num_classes=2)
    with pytest.raises(ValueError, match=r"outside \[0, 2\) where 2 is the number of feature rows"):
        Graph.from_edge_index(ei, torch.randn(2, 4), y, num_classes=2)
    bad = x.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"x has 1 NaN/Inf value\(s\), first at node 1"):
        Graph.from_edge_index(ei, bad, y, num_classes=2)


@pytest.mark.parametrize("empty", ["val_mask", "test_mask"])
def test_a_graph_without_validation_or_test_nodes_is_refused(capsys, tmp_path, monkeypatch,
                                                             empty):
    """An own graph with an empty val (or test) mask trained and ended with "test accuracy nan
    (best val -1.0000 at epoch -1)", summary.json holding val_acc -1. Refused by name before
    any worker starts, nothing left behind; and by the trainer itself (under torchrun, the
    API), on every rank alike."""
    import numpy as np

    from quietgnn.datasets import load_dataset
    from quietgnn.graph import check_trainable_split
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    g = load_dataset("synthetic", synthetic={"nodes": 300, "feature_dim": 8})
    masks = {m: getattr(g, m).numpy() for m in ("train_mask", "val_mask", "test_mask")}
    masks[empty] = np.zeros(g.num_nodes, dtype=bool)
    np.savez(tmp_path / "g.npz", edge_index=g.edge_index().numpy(), x=g.x.numpy(),
             y=g.y.numpy(), **masks)
    argv = TINY[:TINY.index("--dataset")] + ["--dataset", str(tmp_path / "g.npz")] + \
        TINY[TINY.index("--synthetic.feature_dim") + 2:] + ["--out", str(tmp_path / "runs")]
    rc, err = _run(capsys, argv)
    word = "validation" if empty == "val_mask" else "test"
    assert rc == 2 and f"has no {word} nodes" in err and "--dataset.split" in err, err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="no validation and no test nodes"):
        check_trainable_split(10, 0, 0, "g")
    # the trainer itself (a worker under torchrun, the API): before any traffic
    from quietgnn.comm import Communicator
    from quietgnn.config import load_config
    from quietgnn.partition import build_partitions
    from test_checkpoint import _train
    bad = g.with_split(*(torch.from_numpy(masks[m]) for m in ("train_mask", "val_mask",
                                                                "test_mask")))
    part = build_partitions(bad, np.zeros(g.num_nodes, dtype=np.int64))[0]
    cfg = load_config(None, {"strategy": "halo", "partition": {"parts": 1},
                             "model": {"hidden": 8}, "runtime": {"progress": False}})
    with pytest.raises(ValueError, match=f"has no {word} nodes"):
        _train(Communicator(0, 1), cfg, part, tmp_path / "run", 2, 0, False)
