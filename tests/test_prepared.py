"""The prepared format (``quietgnn prepare``: one directory of plain ``.npy`` arrays per rank,
memory-mapped by the worker) holds exactly what the in-memory partitioning builds, `halo`
trains from it to the same logits and gradients, and a directory that is not what it says is
refused with the file and the fix named."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
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
        if f in ("book_id", "features_id"):     # set from the book it was read from
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
    # a value float16 cannot hold (it would be stored as inf) is named before anything is
    # written
    g.x[7, 2] = -70000.0
    with pytest.raises(ValueError, match=r"beyond float16's range \(\|x\| <= 65504\), first at "
                       r"node 7, feature 2 \(value -70000.0\); prepare with --x-dtype float32"):
        make_book(tmp_path / "e", g, "random", 2, x_dtype="float16")
    assert not (tmp_path / "e").exists()


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


def test_overwrite_replaces_only_what_prepare_wrote(tmp_path, capsys):
    """`prepare --overwrite` deleted a directory that merely held a file named book.json
    (beside the user's IMPORTANT.txt), and without --overwrite called it "a prepared graph
    (None parts, None, ? nodes ...)". Only a quietgnn book holding nothing but what prepare
    writes is replaced; anything else is refused naming the directory and what is in it, by
    the command and again where the old directory would be moved aside (finish_book)."""
    from quietgnn.cli import main
    from quietgnn.partition.book import finish_book, new_book_dir
    small = ["prepare", "--dataset", "synthetic", "--synthetic.nodes", "200", "--parts", "2"]
    u = tmp_path / "U"
    u.mkdir()
    (u / "book.json").write_text("{}")
    (u / "IMPORTANT.txt").write_text("x")
    capsys.readouterr()
    for extra in ([], ["--overwrite"]):
        assert main(small + ["--out", str(u)] + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(u) in err and "'IMPORTANT.txt'" in err, err
        assert "not a quietgnn partition book" in err and "None parts" not in err
    tmp = new_book_dir(u)
    with pytest.raises(ValueError, match=r"U' holds 2 entries .*'IMPORTANT\.txt'.* left as it"):
        finish_book(tmp, u, {"num_parts": 1})
    assert (u / "IMPORTANT.txt").read_text() == "x"
    # a real prepared graph with a file of the user's inside is not replaced either
    d = tmp_path / "d"
    assert main(small + ["--out", str(d)]) == 0
    (d / "part-0" / "notes.txt").write_text("mine")
    (d / "part-1" / "link").symlink_to(tmp_path / "U")
    capsys.readouterr()
    assert main(small + ["--out", str(d), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "2 entries ('part-0/notes.txt', 'part-1/link/')" in err, err
    (d / "part-0" / "notes.txt").unlink()
    (d / "part-1" / "link").unlink()
    assert main(small + ["--out", str(d)]) == 2           # a prepared graph: described
    assert "already holds a prepared graph (2 parts, metis, 200 nodes" in \
        capsys.readouterr().err
    assert main(small + ["--out", str(d), "--overwrite"]) == 0
    # a crafted book listing the user's files with their right sizes and checksums does not
    # make them prepare's: only the names a prepare writes count
    (u / "book.json").unlink()
    meta = json.loads((d / "book.json").read_text())
    meta["files"]["IMPORTANT.txt"] = {"bytes": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    shutil.copytree(d, u, dirs_exist_ok=True)
    (u / "book.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(small + ["--out", str(u), "--overwrite"]) == 2
    assert "'IMPORTANT.txt'" in capsys.readouterr().err
    assert (u / "IMPORTANT.txt").read_text() == "x"


@pytest.mark.parametrize("how", ["in-memory", "streamed"])
def test_a_graph_another_prepare_wrote_meanwhile_is_kept(tmp_path, capsys, monkeypatch, how):
    """Two prepares to one --out at once both passed its check, both said "prepared", and the
    one to finish last silently replaced the other's graph. The second to finish is refused
    (one line, exit 2), the first's graph kept whole, its own temporary directory removed;
    with --overwrite it replaces it."""
    from quietgnn.cli import main
    from quietgnn.partition import PartitionBook
    from quietgnn.partition import book as bookmod
    from quietgnn.prepare import tables
    cmd = ["prepare", "--dataset", "synthetic", "--synthetic.nodes", "200"] \
        if how == "in-memory" else ["prepare", "synthetic", "--edges", "600",
                                    "--memory-budget", "1GiB"]
    cmd += ["--parts", "2", "--synthetic.feature_dim", "8"]
    first, d = tmp_path / "first", tmp_path / "d"
    assert main(cmd + ["--synthetic.seed", "1", "--out", str(first)]) == 0
    mod = bookmod if how == "in-memory" else tables
    finish = mod.finish_book

    def other_prepare_finishes_first(tmp, path, *args, **kw):
        shutil.copytree(first, path, dirs_exist_ok=True)
        return finish(tmp, path, *args, **kw)
    monkeypatch.setattr(mod, "finish_book", other_prepare_finishes_first)
    capsys.readouterr()
    assert main(cmd + ["--out", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]      # (the streamed path's progress lines come before it)
    assert "Traceback" not in err and last.startswith("quietgnn: error: --out "), err
    assert "another prepare wrote a prepared graph there" in last, err
    assert "pass --overwrite to replace it" in last, err
    assert (d / "book.json").read_text() == (first / "book.json").read_text()
    PartitionBook.open(d).load_part(1, 2)                   # whole: its checksums hold
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "first"]
    assert main(cmd + ["--out", str(d), "--overwrite"]) == 0
    assert PartitionBook.open(d).book_id != PartitionBook.open(first).book_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "first"]


def test_a_graph_written_just_before_the_rename_is_kept(tmp_path, monkeypatch):
    """Both prepares may find --out free in finish_book's own check: the rename then refuses
    to move onto the graph the other one put there a moment later."""
    from types import SimpleNamespace
    from quietgnn.partition import PartitionBook
    from quietgnn.partition import book as bookmod
    g = small_graph(n=60)
    first = make_book(tmp_path / "first", g, "random", 2).path
    out = tmp_path / "d"

    def stamp(fmt):                 # runs after the check, before the rename
        shutil.copytree(first, out)
        return "then"
    tmp = bookmod.new_book_dir(out)
    (tmp / "assignment.npy").write_bytes(b"x")
    monkeypatch.setattr(bookmod, "time", SimpleNamespace(strftime=stamp))
    with pytest.raises(ValueError, match="another prepare wrote a prepared graph there"):
        bookmod.finish_book(tmp, out, {"num_parts": 1}, overwrite=False)
    assert PartitionBook.open(out).book_id == PartitionBook.open(first).book_id


def _lie(book, k, name, edit):
    """Rewrite ``part-k/<name>`` through ``edit`` and update its size and sha256 in book.json,
    as a tamperer with write access would (the checksums then prove nothing)."""
    f = book / f"part-{k}" / name
    if name == "part.json":
        meta = json.loads(f.read_text())
        edit(meta)
        f.write_text(json.dumps(meta))
    else:
        np.save(f, edit(np.load(f)))
    manifest = json.loads((book / "book.json").read_text())
    manifest["files"][f"part-{k}/{name}"].update(
        bytes=f.stat().st_size, sha256=hashlib.sha256(f.read_bytes()).hexdigest())
    (book / "book.json").write_text(json.dumps(manifest))


def _set(key, value):
    def edit(meta):
        meta[key] = value
    return edit


def _at(i, value):
    def edit(a):
        a = a.copy()
        a[i] = value
        return a
    return edit


#: (file, edit, what the one line says): each reached an IndexError in a kernel, a gloo
#: abort (SIGABRT) or a TypeError before
LIES = {
    "label 99": ("y.npy", _at(3, 99), r"y.npy' holds values in \[0, 99\], expected labels "
                                       r"\(num_classes = 3 in part.json\) in \[0, 3\)"),
    "num_classes 2": ("part.json", _set("num_classes", 2), r"y.npy' holds values in \[0, 2\]"),
    "num_classes '7'": ("part.json", _set("num_classes", "7"),
                        r"part.json': num_classes = \"7\", expected an int >= 2"),
    "num_classes 5": ("part.json", _set("num_classes", 5),
                      r"has num_classes = 5 but book.json says 3"),
    "rank 7": ("part.json", _set("rank", 7), r"rank = 7 is not below num_parts = 2"),
    "index out of range": ("indices.npy", _at(0, 10 ** 6),
                           r"indices.npy' holds values in \[0, 1000000\], expected local node"),
    "x truncated": ("x.npy", lambda a: a[:-1], r"x.npy' has \d+ rows, expected \d+ \(this part"),
    "halo shifted": ("halo.npy", lambda a: np.roll(a, 1), r"halo.npy' is not in \(owner, id\)"),
    "halo one short": ("halo.npy", lambda a: a[1:], r"halo_owner.npy' has \d+ rows, expected"),
    "send plan": ("send_idx.npy", _at(0, -1), r"send_idx.npy' holds values in \[-1, "),
    "indptr": ("indptr.npy", _at(-1, 5), r"indptr.npy' runs from 0 to 5"),
    "mask type": ("train_mask.npy", lambda a: a.astype(np.int64),
                  r"train_mask.npy' has dtype int64 .*expected bool"),
    "owned order": ("owned.npy", lambda a: a[::-1].copy(), r"owned.npy' is not strictly"),
    # silent before: the GCN norm reads the degrees (a wrong weight, no error)
    "in_degree": ("in_degree.npy", lambda a: a + 1, r"in_degree.npy' disagrees with indptr"),
    # gloo aborted (SIGABRT) on the mismatched sizes, or other strategies trained silently
    "halo owned here": ("halo.npy", lambda a: a - 1, r"halo.npy' lists a node this part owns"),
}


@pytest.fixture(scope="module")
def clean_book(tmp_path_factory):
    return make_book(tmp_path_factory.mktemp("lies") / "d", small_graph(n=200, seed=4),
                     "metis", 2).path


@pytest.mark.parametrize("lie", list(LIES))
def test_a_part_that_lies_is_one_line_naming_the_file(tmp_path, clean_book, lie):
    """The arrays of a prepared part, edited with their checksums updated, are checked on
    read as Graph.validate checks a graph (vectorised, over the mapped arrays): one
    ValueError naming the file and the value instead of a traceback from deep inside."""
    import shutil

    from quietgnn.partition import PartitionBook
    name, edit, said = LIES[lie]
    book = tmp_path / "d"
    shutil.copytree(clean_book, book)
    _lie(book, 1, name, edit)
    opened = PartitionBook.open(book)
    opened.load_part(0, 2)                                  # the other part is fine
    for stored in (False, True):
        with pytest.raises(ValueError) as ei:
            opened.load_part(1, 2, stored=stored)
        msg = str(ei.value)
        assert "\n" not in msg and re.search(said, msg), msg
        assert str(book / "part-1") in msg and "quietgnn prepare" in msg


@pytest.mark.parametrize("raised", [
    OSError("64000 requested and 48096 written"),            # numpy's short write
    OSError(28, "No space left on device"),
    RuntimeError('TransactionException: Failed to commit: could not write file "x.tmp": No '
                 'space left on device'),                    # DuckDB's words for it
])
def test_a_full_disk_during_prepare_is_one_line(tmp_path, capsys, monkeypatch, raised):
    """A prepare onto a full disk printed "error: 64000 requested and 48096 written" (no path,
    no reason) in memory, a DuckDB TransactionException traceback out of core. Checked by
    hand on a 300 KiB tmpfs for both; here each writer's words for it."""
    import quietgnn.partition
    from quietgnn.cli import main

    def full(*a, **k):
        raise raised
    monkeypatch.setattr(quietgnn.partition, "make_book", full)
    rc = main(["prepare", "--dataset", "synthetic", "--synthetic.nodes", "200", "--parts", "2",
               "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"could not write the prepared graph '{tmp_path / 'd'}': No space left on device" \
        in err and "MiB free there" in err
