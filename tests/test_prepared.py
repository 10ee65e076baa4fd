"""The prepared format (``quietgnn prepare``: one directory of plain ``.npy`` arrays per rank,
memory-mapped by the worker) holds exactly what the in-memory partitioning builds, `halo`
trains from it to the same logits and gradients, and a directory that is not what it says is
refused with the file and the fix named."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from quietgnn.datasets import load_dataset
from quietgnn.partition import build_partitions, make_book
from quietgnn.runtime.spawn import spawn_function

from helpers import small_graph
from test_halo import ARCHS, LEAN_MODELS, _lean_step, _one_step

SYN = ["--dataset", "synthetic", "--synthetic.nodes", "300", "--synthetic.feature_dim", "8"]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "quietgnn", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def _same_part(a, b):
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if f == "book_id":
            continue
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f
        elif isinstance(x, list):
            assert len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y)), f
        else:
            assert x == y, f


@pytest.mark.parametrize("P,method", [(2, "metis"), (4, "random"), (4, "metis")])
def test_prepared_parts_equal_the_in_memory_partitions(tmp_path, P, method):
    g = small_graph(n=200, seed=2)
    book = make_book(tmp_path / "d", g, method, P, seed=1)
    ref = build_partitions(g, book.assignment())
    for k in range(P):
        _same_part(book.load_part(k, P), ref[k])
        # the edges are stored as int32 (local ids fit), the features as float32
        assert np.load(tmp_path / "d" / f"part-{k}" / "indices.npy", mmap_mode="r").dtype == \
            np.int32
        assert not any(f.endswith(".pt") for f in book.files)


def test_half_precision_features(tmp_path):
    g = small_graph(n=120, seed=3)
    book = make_book(tmp_path / "d", g, "random", 2, x_dtype="float16")
    ref = build_partitions(g, book.assignment())
    part = book.load_part(1, 2)
    assert np.load(tmp_path / "d" / "part-1" / "x.npy", mmap_mode="r").dtype == np.float16
    assert part.x.dtype == torch.float32
    assert torch.equal(part.x, ref[1].x.half().float())


@pytest.mark.parametrize("P", [2, 4])
def test_halo_from_prepared_equals_in_memory(tmp_path, P):
    g = small_graph(n=150, seed=1)
    book = make_book(tmp_path / "d", g, "metis", P)
    parts = book.assignment()
    mem = spawn_function(_one_step, P, args=(g, parts, ARCHS, 2))
    disk = spawn_function(_one_step, P, args=(g, str(tmp_path / "d"), ARCHS, 2))
    for a in ARCHS:
        for m, d in zip(mem, disk):
            assert torch.equal(m["owned"], d["owned"])
            assert torch.allclose(m[a]["logits"], d[a]["logits"], atol=1e-6), a
            assert m[a]["loss"] == pytest.approx(d[a]["loss"], rel=1e-6)
            for name, grad in m[a]["grads"].items():
                assert torch.allclose(grad, d[a]["grads"][name], atol=1e-6), (a, name)
            assert m[a]["records"] == d[a]["records"]          # the same bytes, too


def test_lean_halo_from_stored_part_equals_in_memory(tmp_path):
    """options.lean reads the part as stored (int32 edges, mapped) and computes what the
    default computes on the in-memory partition."""
    g = small_graph(n=150, seed=1)
    book = make_book(tmp_path / "d", g, "metis", 2)
    assert book.load_part(0, 2, stored=True).indices.dtype == torch.int32
    mem = spawn_function(_lean_step, 2, args=(g, book.assignment(), False))
    disk = spawn_function(_lean_step, 2, args=(g, str(tmp_path / "d"), True))
    for m, d in zip(mem, disk):
        for model in LEAN_MODELS:
            assert torch.allclose(m[model]["logits"], d[model]["logits"], atol=1e-5), model
            for name, grad in m[model]["grads"].items():
                assert torch.allclose(grad, d[model]["grads"][name], atol=1e-5), (model, name)


@pytest.mark.slow   # prepare and train through the CLI: the slow tier (pytest -m slow)
def test_prepare_then_train_with_data(tmp_path):
    r = _cli("prepare", *SYN, "--parts", "2", "--out", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "prepared" in r.stdout and (tmp_path / "d" / "part-1" / "indptr.npy").is_file()
    r = _cli("train", "--data", str(tmp_path / "d"), "--epochs", "2", "--hidden", "8",
             "--runtime.progress", "false", "--out", str(tmp_path / "runs"),
             "--run-name", "r", "--summary-json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    cfg = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())
    assert cfg["partition"]["parts"] == 2 and cfg["dataset"]["name"] == "synthetic"
    assert s["epochs"] == 2 and s["dataset"] == "synthetic" and s["parts"] == 2
    assert s["train_bytes"] > 0 and 0 <= s["test_acc"] <= 1
    # --parts against the directory's: a clear error, nothing trained
    r = _cli("train", "--data", str(tmp_path / "d"), "--parts", "3", "--epochs", "1",
             "--out", str(tmp_path / "runs"), "--run-name", "r3")
    assert r.returncode == 2
    assert "--parts 3 does not match" in r.stderr and "prepared with 2 parts" in r.stderr
    assert not (tmp_path / "runs" / "r3").exists()
    # a dataset name that is not the directory's graph: refused, not silently replaced
    r = _cli("train", "--data", str(tmp_path / "d"), "--dataset", "cora", "--epochs", "1",
             "--out", str(tmp_path / "runs"), "--run-name", "r4")
    assert r.returncode == 2
    assert "--dataset cora does not match" in r.stderr and "'synthetic" in r.stderr
    assert not (tmp_path / "runs" / "r4").exists()


def test_version_1_book_names_the_command_that_rewrites_it(tmp_path):
    book = make_book(tmp_path / "d", load_dataset("synthetic", synthetic={"nodes": 300}),
                     "random", 2)
    meta = json.loads((book.path / "book.json").read_text())
    meta["version"] = 1
    (book.path / "book.json").write_text(json.dumps(meta))
    r = _cli("train", "--data", str(book.path), "--epochs", "1", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert "has version 1" in line and "reads version 2" in line
    assert f"quietgnn prepare --dataset synthetic --parts 2 --partitioner random --out " \
           f"{book.path}" in line


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = tmp_path_factory.mktemp("prep") / "d"
    r = _cli("prepare", *SYN, "--parts", "2", "--out", str(d))
    assert r.returncode == 0, r.stderr
    return d


@pytest.mark.parametrize("strategy", ["halo", "adaqp", "grappa", "tma", "retexo", "minibatch"])
def test_every_strategy_trains_from_a_prepared_directory(tmp_path, prepared, strategy):
    r = _cli("train", "--data", str(prepared), "--strategy", strategy, "--epochs", "2",
             "--hidden", "8", "--runtime.progress", "false", "--out", str(tmp_path),
             "--run-name", "r", "--summary-json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["strategy"] == strategy and s["parts"] == 2 and s["dataset"] == "synthetic"


@pytest.mark.parametrize("strategy", ["halo", "adaqp", "retexo"])
def test_lean_trains_from_a_prepared_directory(tmp_path, prepared, strategy):
    """options.lean reads the part as stored (int32 edges, float16 features, mapped); 8
    features widen to 16 hidden (retexo exchanges layer 0's aggregates)."""
    r = _cli("train", "--data", str(prepared), "--strategy", strategy, "--options.lean", "true",
             "--epochs", "2", "--hidden", "16", "--runtime.progress", "false", "--out",
             str(tmp_path), "--run-name", "r", "--summary-json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["epochs"] == 2 and s["train_bytes"] > 0 and 0 <= s["test_acc"] <= 1
    if strategy == "retexo":
        assert s["strategy_report"]["exchange_widths"] == [8, 8]


def test_prepare_refuses_to_replace_a_prepared_graph_unless_asked(tmp_path, capsys):
    from quietgnn.cli import main
    from quietgnn.partition import PartitionBook
    d = tmp_path / "d"
    small = ["prepare", "--dataset", "synthetic", "--synthetic.nodes", "200", "--out", str(d)]
    assert main(small + ["--parts", "2"]) == 0
    before = (d / "book.json").read_text()
    capsys.readouterr()
    assert main(small + ["--parts", "1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a prepared graph (2 parts" in err and "--overwrite" in err
    assert (d / "book.json").read_text() == before              # untouched
    assert main(small + ["--parts", "1", "--overwrite"]) == 0
    assert PartitionBook.open(d).num_parts == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]    # nothing set aside is left
    (tmp_path / "f").write_text("x")
    assert main(small[:-1] + [str(tmp_path / "f"), "--parts", "1"]) == 2
    assert "is a file" in capsys.readouterr().err
    # a directory of other files is never replaced, --overwrite or not
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("keep")
    capsys.readouterr()
    assert main(small[:-1] + [str(mine), "--parts", "1", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds files that are not a prepared graph" in err and "choose another --out" in err
    assert (mine / "important.txt").read_text() == "keep"
