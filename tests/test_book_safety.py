"""A partition book is only used for the graph it was made from (issue #19, items 5, 6, 8).

* a book of another graph (Cora book, ``--dataset citeseer``; another synthetic spec or split;
  a file edited since) is refused before any worker starts, and under torchrun by each rank;
* the launcher's book cache is keyed on the content of the dataset's files and of
  ``partition.file``: a file replaced in place (same size, same mtime) gets a new book;
* a ``book.json`` whose ``num_parts`` disagrees with the part files it lists is named at once.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from quietgnn.cli import main
from quietgnn.config import load_config
from quietgnn.datasets import load_dataset
from quietgnn.partition import PartitionBook, make_book
from quietgnn.runtime.launcher import prepare_book

from helpers import SHARED_DATA

PLANETOID = SHARED_DATA / "planetoid"
needs_planetoid = pytest.mark.skipif(
    not ((PLANETOID / "Cora").is_dir() and (PLANETOID / "CiteSeer").is_dir()),
    reason=f"{PLANETOID} not found: the Cora/CiteSeer book tests need the shared datasets")

SYN = {"nodes": 300, "feature_dim": 8}
TINY = ["train", "--strategy", "halo", "--dataset", "synthetic", "--synthetic.nodes", "300",
        "--synthetic.feature_dim", "8", "--parts", "2", "--hidden", "16", "--epochs", "2",
        "--runtime.progress", "false"]


def _cfg(**sections):
    sections.setdefault("partition", {})
    sections["partition"].setdefault("parts", 2)
    return load_config(None, sections)


def _run(capsys, argv):
    rc = main(argv)
    return rc, capsys.readouterr().err


def _no_worker_started(out_dir):
    return not list(out_dir.glob("*/logs/rank-*")) and not list(out_dir.glob("*/metrics/*"))


@pytest.fixture(scope="module")
def syn_book(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "book"
    make_book(path, load_dataset("synthetic", synthetic=SYN), "metis", 2)
    return path


# ---------------------------------------------------------------------- 5: book vs dataset
@needs_planetoid
def test_cora_book_with_citeseer_is_refused_before_any_worker(capsys, tmp_path):
    book = tmp_path / "cora-p2"
    make_book(book, load_dataset("cora", PLANETOID), "metis", 2)
    out = tmp_path / "runs"
    rc, err = _run(capsys, ["train", "--dataset", "citeseer", "--root", str(PLANETOID),
                            "--parts", "2", "--epochs", "1", "--runtime.progress", "false",
                            "--book", str(book), "--out", str(out)])
    assert rc == 2, err
    line = err.strip().splitlines()[-1]
    assert str(book) in line and "'cora'" in line and "'citeseer'" in line
    assert "name: book 'cora', dataset 'citeseer'" in line and "quietgnn prepare" in line
    assert "Traceback" not in err and _no_worker_started(out)
    # the book's own dataset passes (the check is not a blanket refusal)
    cfg = _cfg(dataset={"name": "cora", "root": str(PLANETOID)},
               partition={"parts": 2, "book": str(book)})
    assert prepare_book(cfg, log=lambda m: None) == book


@pytest.mark.parametrize("extra, message", [
    (["--synthetic.seed", "1"], "synthetic.seed: book 0, dataset 1"),
    (["--synthetic.nodes", "320"], "num_nodes: book 300, dataset 320"),
    (["--dataset.split_seed", "3"], "split_seed: book 0, dataset 3"),
])
def test_book_of_another_synthetic_graph_is_refused(capsys, tmp_path, syn_book, extra, message):
    # "synthetic" names every spec: the book records the spec and split seed it was made with
    out = tmp_path / "runs"
    rc, err = _run(capsys, TINY + extra + ["--book", str(syn_book), "--out", str(out)])
    assert rc == 2, err
    assert message in err and str(syn_book) in err and "Traceback" not in err
    assert _no_worker_started(out)


def test_matching_synthetic_book_is_accepted(syn_book):
    cfg = _cfg(synthetic=SYN, partition={"parts": 2, "book": str(syn_book)})
    assert prepare_book(cfg, log=lambda m: None) == syn_book


def test_fingerprint_catches_what_the_manifest_does_not_say(tmp_path, syn_book):
    # a book written before books recorded the synthetic spec / split seed: name and sizes
    # agree, only the loaded graph's fingerprint tells the graphs apart
    book = tmp_path / "old"
    shutil.copytree(syn_book, book)
    meta = json.loads((book / "book.json").read_text())
    del meta["graph"]["synthetic"], meta["graph"]["split_seed"]
    (book / "book.json").write_text(json.dumps(meta))
    ok = _cfg(synthetic=SYN, partition={"parts": 2, "book": str(book)})
    assert prepare_book(ok, log=lambda m: None) == book
    other = _cfg(synthetic=dict(SYN, seed=5), partition={"parts": 2, "book": str(book)})
    with pytest.raises(ValueError, match=r"fingerprint: book [0-9a-f]+, dataset [0-9a-f]+"):
        prepare_book(other, log=lambda m: None)


def test_book_of_an_edited_npz_is_refused(tmp_path):
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    book = tmp_path / "book"
    make_book(book, load_dataset(str(f)), "random", 2)
    _write_npz(f, seed=0, label_seed=1)     # same name, edges and sizes; other labels
    cfg = _cfg(dataset={"name": str(f)}, partition={"parts": 2, "book": str(book)})
    with pytest.raises(ValueError, match=r"made from graph 'g'.*fingerprint: book"):
        prepare_book(cfg, log=lambda m: None)


def test_torchrun_rank_checks_the_book_without_loading(monkeypatch, syn_book):
    """Under torchrun there is no launcher: each rank compares the book with the requested
    dataset from what is known without loading it (name, synthetic spec and sizes)."""
    from quietgnn.runtime import worker
    from quietgnn.runtime.plan import plan_worker
    monkeypatch.delenv("QUIETGNN_BOOK", raising=False)
    import quietgnn.datasets as ds

    def no_load(*a, **k):
        raise AssertionError("the graph must not be loaded when a book is given")
    monkeypatch.setattr(ds, "load_dataset", no_load)
    cfg = _cfg(synthetic=SYN, partition={"parts": 2, "book": str(syn_book)})
    part = worker.load_local_partition(plan_worker(cfg, "run"), 1, 2)
    assert part.rank == 1
    bad = _cfg(synthetic=dict(SYN, feature_dim=16), partition={"parts": 2, "book": str(syn_book)})
    with pytest.raises(ValueError, match=r"num_features: book 8, dataset 16"):
        worker.load_local_partition(plan_worker(bad, "run"), 1, 2)
    cora = _cfg(dataset={"name": "cora", "root": "/nonexistent"},
                partition={"parts": 2, "book": str(syn_book)})
    with pytest.raises(ValueError, match=r"name: book 'synthetic', dataset 'cora'"):
        worker.load_local_partition(plan_worker(cora, "run"), 0, 2)


# ---------------------------------------------------------------------- 6: cache key on content
def _write_npz(path, seed, n=60, e=150, label_seed=None):
    """A graph of exactly ``n`` nodes and ``e`` listed edges: the same file size for every
    seed (fixed shapes and dtypes, stored uncompressed). ``label_seed``: other labels only."""
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, e)).astype(np.int64)
    y = rng.integers(0, 3, size=n).astype(np.int64)
    if label_seed is not None:
        y = np.random.default_rng(label_seed).integers(0, 3, size=n).astype(np.int64)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(buf, edge_index=ei, y=y, x=x)
    if path.exists():                      # rewrite in place: same inode
        with open(path, "r+b") as fh:
            fh.write(buf.getvalue())
            fh.truncate()
    else:
        path.write_bytes(buf.getvalue())


def test_one_graph_file_in_two_places_shares_its_cached_book(tmp_path):
    """The API stages an in-memory graph in each run's directory: keyed by path, every call
    built and kept a book of its own in the cache."""
    from quietgnn.runtime.books import partition_key
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
        _write_npz(tmp_path / d / "g.npz", seed=1 if d == "c" else 0)
    key = [partition_key(_cfg(dataset={"name": str(tmp_path / d / "g.npz")},
                              partition={"method": "random", "parts": 2})) for d in "abc"]
    assert key[0] == key[1] != key[2]         # the same bytes share; other bytes do not


def test_books_cached_before_an_upgrade_are_reused_and_another_versions_left_alone(
        tmp_path, monkeypatch):
    """After the graph-file rekeying every cached book of a file dataset was partitioned
    again (Cora's too); a cached book of another format version was deleted, though a host of
    that version sharing the cache may be training on it: it is left, this version's beside."""
    import json as _json
    from quietgnn.runtime.books import cached_book_path, partition_key
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    cfg = _cfg(dataset={"name": str(f)}, partition={"method": "random", "parts": 2})
    made = prepare_book(cfg, log=lambda m: None)
    earlier = cached_book_path(cfg, partition_key(cfg, earlier=True))
    assert earlier != made
    made.rename(earlier)                               # as the earlier version cached it
    logs = []
    assert prepare_book(cfg, log=logs.append) == earlier and not logs     # not partitioned
    assert not made.exists()
    earlier.rename(made)
    meta = _json.loads((made / "book.json").read_text())
    for version in (1, 3):       # an older quietgnn's, a newer one's: left, ours beside it
        (made / "book.json").write_text(_json.dumps(dict(meta, version=version)))
        (made / "theirs.txt").write_text("x")
        beside = prepare_book(cfg, log=lambda m: None)
        assert beside == made.with_name(made.name + "-v2") and PartitionBook.open(beside)
        assert (made / "theirs.txt").is_file() and \
            _json.loads((made / "book.json").read_text())["version"] == version
        assert prepare_book(cfg, log=logs.append) == beside and not logs      # reused
    (made / "theirs.txt").unlink()
    (made / "book.json").write_text("{torn")              # damaged: still rebuilt
    assert PartitionBook.open(prepare_book(cfg, log=lambda m: None)).num_parts == 2


def test_npz_replaced_in_place_gets_a_new_book(tmp_path):
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    st = f.stat()
    cfg = _cfg(dataset={"name": str(f)}, partition={"method": "random", "parts": 2})
    first = prepare_book(cfg, log=lambda m: None)
    assert prepare_book(cfg, log=lambda m: None) == first          # unchanged file: reused
    _write_npz(f, seed=1)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = f.stat()
    assert (st2.st_size, st2.st_mtime_ns, st2.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    second = prepare_book(cfg, log=lambda m: None)
    assert second != first
    new_graph = load_dataset(str(f))
    b = PartitionBook.open(second)
    assert b.graph["fingerprint"] == new_graph.fingerprint()        # trains on the new graph
    assert PartitionBook.open(first).graph["fingerprint"] != new_graph.fingerprint()


def test_the_file_hash_table_is_not_written_through_a_planted_link(tmp_path, monkeypatch):
    """<cache>/file-hashes.json was written through the predictable temporary name
    .file-hashes.json.<pid>: a link planted there redirected the write."""
    from quietgnn.runtime.books import _content_sha256, cache_dir
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    (cache_dir() / f".file-hashes.json.{os.getpid()}").symlink_to(victim)
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    digest = _content_sha256(f)
    assert victim.read_text() == "the user's file"
    table = json.loads((cache_dir() / "file-hashes.json").read_text())
    assert table[str(f.resolve())]["sha256"] == digest


def test_edge_list_companion_replaced_gets_a_new_book(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("\n".join(f"{i} {(i * 7 + 1) % 40}" for i in range(40)) + "\n")
    labels = tmp_path / "g.labels.npy"
    np.save(labels, np.arange(40) % 3)
    st = labels.stat()
    cfg = _cfg(dataset={"name": str(f)}, partition={"method": "random", "parts": 2})
    first = prepare_book(cfg, log=lambda m: None)
    buf = io.BytesIO()
    np.save(buf, (np.load(labels) + 1) % 3)   # other labels, same size ...
    assert len(buf.getvalue()) == st.st_size
    with open(labels, "r+b") as fh:           # ... written in place, then the old mtime back
        fh.write(buf.getvalue())
    os.utime(labels, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = prepare_book(cfg, log=lambda m: None)
    assert second != first
    assert PartitionBook.open(second).graph["fingerprint"] == load_dataset(str(f)).fingerprint()


def test_partition_file_replaced_in_place_gets_a_new_book(tmp_path):
    a = tmp_path / "assign.npy"
    n = SYN["nodes"]
    np.save(a, np.arange(n) % 2)
    st = a.stat()
    cfg = _cfg(synthetic=SYN, partition={"method": "given", "parts": 2, "file": str(a)})
    first = prepare_book(cfg, log=lambda m: None)
    buf = io.BytesIO()
    np.save(buf, (np.arange(n) // (n // 2)).clip(0, 1))
    with open(a, "r+b") as fh:
        fh.write(buf.getvalue())
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = prepare_book(cfg, log=lambda m: None)
    assert second != first
    assert np.array_equal(PartitionBook.open(second).assignment(), np.load(a))


def test_unchanged_files_are_hashed_once(tmp_path, monkeypatch):
    import quietgnn.partition.book as book_mod
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    cfg = _cfg(dataset={"name": str(f)}, partition={"method": "random", "parts": 2})
    first = prepare_book(cfg, log=lambda m: None)
    calls = []
    real = book_mod._sha256
    monkeypatch.setattr(book_mod, "_sha256", lambda p: calls.append(p) or real(p))
    assert prepare_book(cfg, log=lambda m: None) == first
    assert calls == []            # the cached book was found from a stat, not a re-read


# ---------------------------------------------------------------------- 8: edited manifest
def _edit_num_parts(src, dst, n):
    shutil.copytree(src, dst)
    meta = json.loads((dst / "book.json").read_text())
    meta["num_parts"] = n
    (dst / "book.json").write_text(json.dumps(meta))
    return dst


@pytest.mark.parametrize("n", [1, 4, 10**12])
def test_edited_num_parts_is_named(capsys, tmp_path, syn_book, n):
    book = _edit_num_parts(syn_book, tmp_path / "book", n)
    with pytest.raises(ValueError) as exc:
        PartitionBook.open(book)
    msg = str(exc.value)
    assert str(book / "book.json") in msg and f"says num_parts = {n}" in msg
    assert "lists 2 part(s) (part-0/, part-1/)" in msg and "quietgnn prepare" in msg
    if n > 4:       # built no list of 10**12 parts (MemoryError before); no run asks for them
        return
    out = tmp_path / "runs"
    argv = list(TINY)
    argv[argv.index("--parts") + 1] = str(n)       # even a run asking for the edited count
    rc, err = _run(capsys, argv + ["--book", str(book), "--out", str(out)])
    assert rc == 2, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and str(book / "book.json") in lines[0] and "Traceback" not in err
    assert _no_worker_started(out)


def test_stats_that_disagree_with_num_parts_are_named(tmp_path, syn_book):
    book = tmp_path / "book"
    shutil.copytree(syn_book, book)
    meta = json.loads((book / "book.json").read_text())
    meta["stats"]["nodes"] = meta["stats"]["nodes"] + [0]
    (book / "book.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"says num_parts = 2 but stats.nodes has 3 entries"):
        PartitionBook.open(book)


@pytest.mark.parametrize("field, value, said", [
    ("graph", "x", 'graph = "x" (str), expected a JSON object'),
    ("seed", "abc", 'seed = "abc" (str), expected an integer'),
    ("method", 3, "method = 3 (int), expected a string"),
    ("book_id", None, "book_id = null (NoneType), expected a string"),
    ("graph.num_nodes", "300", 'graph.num_nodes = "300" (str), expected an integer'),
    ("files.part-0/x.npy", [1], 'files[\'part-0/x.npy\'] = [1], expected {"bytes": int'),
])
def test_a_book_json_of_the_wrong_types_is_named(capsys, tmp_path, syn_book, field, value,
                                                 said):
    """book.json with "graph": "x" gave a raw AttributeError, "seed": "abc" an "invalid
    literal for int()" that named no file: one line naming book.json and the field."""
    book = tmp_path / "book"
    shutil.copytree(syn_book, book)
    meta = json.loads((book / "book.json").read_text())
    *path, key = field.split(".", 1) if field.startswith(("graph.", "files.")) else [field]
    (meta[path[0]] if path else meta)[key] = value
    (book / "book.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as exc:
        PartitionBook.open(book)
    msg = str(exc.value)
    assert "\n" not in msg and str(book / "book.json") in msg and said in msg, msg
    out = tmp_path / "runs"
    rc, err = _run(capsys, TINY + ["--book", str(book), "--out", str(out)])
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and said in lines[0] and "Traceback" not in err, err
    if field == "graph":            # the version-1 refusal reads the graph's name too
        meta["version"] = 1
        (book / "book.json").write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=r"has version 1 .* --dataset NAME"):
            PartitionBook.open(book)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link"])
def test_book_file_names_stay_inside_the_book(tmp_path, syn_book, how):
    """A name in book.json, or a part file replaced by a link, must not lead out of the book:
    refused by name, and the file outside is never read."""
    book = tmp_path / "book"
    shutil.copytree(syn_book, book)
    outside = tmp_path / "outside.npy"
    outside.write_bytes((book / "part-1" / "x.npy").read_bytes())
    meta = json.loads((book / "book.json").read_text())
    if how == "link":
        (book / "part-1" / "x.npy").unlink()
        os.symlink(outside, book / "part-1" / "x.npy")
        name, said = "part-1/x.npy", "leads out of"
    else:
        name = "../outside.npy" if how == "dotdot" else str(outside)
        meta["files"][name] = dict(meta["files"]["part-1/x.npy"])
        said = "no '..', no absolute path"
        (book / "book.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as exc:
        PartitionBook.open(book).load_part(1, 2)
    msg = str(exc.value)
    assert "\n" not in msg and f"file name {name!r}" in msg and said in msg, msg


def test_edited_cached_book_is_rebuilt(tmp_path):
    cfg = _cfg(synthetic=SYN, partition={"method": "random", "parts": 2})
    path = prepare_book(cfg, log=lambda m: None)
    meta = json.loads((path / "book.json").read_text())
    meta["num_parts"] = 4
    (path / "book.json").write_text(json.dumps(meta))
    assert prepare_book(cfg, log=lambda m: None) == path
    assert PartitionBook.open(path).num_parts == 2


def test_a_cache_that_cannot_hold_books_is_named(tmp_path, monkeypatch):
    """QUIETGNN_CACHE set but empty wrote ./books into the working directory; a file or an
    unwritable directory failed the run with a bare errno line that named no setting."""
    from quietgnn.runtime import books
    cfg = _cfg(synthetic=SYN, partition={"method": "random", "parts": 2})
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUIETGNN_CACHE", "")
    monkeypatch.chdir(tmp_path)
    path = prepare_book(cfg, log=lambda m: None)
    assert path.is_relative_to(tmp_path / "home" / ".cache" / "quietgnn" / "books")
    assert not (tmp_path / "books").exists()
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "afile"))
    with pytest.raises(ValueError, match=r"QUIETGNN_CACHE = '.*afile' is a file; expected a "
                                         r"directory"):
        prepare_book(cfg, log=lambda m: None)
    cache = tmp_path / "ro"
    monkeypatch.setenv("QUIETGNN_CACHE", str(cache))

    def refused(cfg, path, *_):      # as root, permission bits cannot make it read-only
        raise PermissionError(13, "Permission denied", str(path.parent))
    monkeypatch.setattr(books, "_build_book", refused)
    with pytest.raises(ValueError, match=r"cannot write the partition book into the cache "
                                         r".*ro/books' \(Permission denied\): set "
                                         r"QUIETGNN_CACHE to a directory you may write"):
        prepare_book(cfg, log=lambda m: None)


def test_a_read_only_home_names_quietgnn_cache(tmp_path, monkeypatch):
    """With QUIETGNN_CACHE unset under a read-only home, creating ~/.cache/quietgnn/books
    fails on ~/.cache, above the cache: that was a bare errno line (exit 1) rather than the
    setting to change. A file beside the cache that merely shares its prefix is not it."""
    import errno
    from quietgnn.runtime import books
    cfg = _cfg(synthetic=SYN, partition={"method": "random", "parts": 2})
    home = tmp_path / "rohome"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("QUIETGNN_CACHE", "")
    failed = [home / ".cache"]

    def read_only(cfg, path, *_):   # what mkdir(parents=True) raises (root ignores modes)
        raise OSError(errno.EROFS, "Read-only file system", str(failed[0]))
    monkeypatch.setattr(books, "_build_book", read_only)
    for failed[0] in (home / ".cache", home, home / ".cache" / "quietgnn" / "books" / "x"):
        with pytest.raises(ValueError, match=r"cannot write the partition book into the cache "
                                             r".*rohome/\.cache/quietgnn/books' \(Read-only "
                                             r"file system\): set QUIETGNN_CACHE to a"):
            prepare_book(cfg, log=lambda m: None)
    for failed[0] in (home / ".cache" / "quietgnn2", tmp_path / "data.npz"):
        with pytest.raises(OSError, match="Read-only"):
            prepare_book(cfg, log=lambda m: None)


def test_a_book_refuses_a_dataset_whose_features_were_edited(tmp_path):
    """--book with the dataset the book was made from, but its features edited in place (the
    same graph, labels and split): refused by name, not trained on the book's old features."""
    from quietgnn.partition import make_book
    from quietgnn.runtime.books import check_book_dataset
    f = tmp_path / "g.npz"
    _write_npz(f, seed=0)
    graph = load_dataset(str(f))
    book = make_book(tmp_path / "book", graph, "random", 2)
    cfg = _cfg(dataset={"name": str(f)}, partition={"parts": 2, "book": str(tmp_path / "book")})
    check_book_dataset(book, cfg, load=True)                # the same file: accepted
    with np.load(f) as z:
        arrays = dict(z)
    arrays["x"][7, 2] += 1.0                                # one value of one node
    np.savez(f, **arrays)
    assert load_dataset(str(f)).fingerprint() == graph.fingerprint()   # topology, labels alike
    with pytest.raises(ValueError, match=r"features: book [0-9a-f]+, dataset [0-9a-f]+ .*edited"):
        check_book_dataset(book, cfg, load=True)


def test_the_features_digest_is_the_same_in_any_chunking_and_sees_one_value():
    import torch

    from quietgnn.graph import Graph
    x = torch.randn(500, 6)
    y = torch.zeros(500, dtype=torch.int64)
    ei = torch.stack([torch.arange(499), torch.arange(1, 500)])
    a = Graph.from_edge_index(ei, x, y, num_classes=2)
    b = Graph.from_edge_index(ei, x.clone(), y, num_classes=2)
    assert a.features_digest() == b.features_digest() == a.features_digest(chunk_rows=7)
    b.x[123, 4] = torch.nextafter(b.x[123, 4], torch.tensor(float("inf")))   # one ulp
    assert a.features_digest() != b.features_digest()
    c = Graph.from_edge_index(ei, x[torch.randperm(500)], y, num_classes=2)   # rows reordered
    assert c.features_digest() != a.features_digest()


#: a JSON value nested deeper than Python's parser follows: 200 KB of brackets
DEEP = "[" * 100_000 + "]" * 100_000


def test_json_nested_too_deep_is_damage_in_every_file_quietgnn_reads(tmp_path, syn_book):
    """A file nested 100,000 deep (book.json, part.json, COMMIT.json, a metrics line, a
    results line, model.json, config.json) was a RecursionError with a traceback past every
    reader's handler; it is now damage like any other bad JSON (one line, or a skipped line)."""
    from quietgnn.analysis.inputs import load_results
    from quietgnn.api import _run_config
    from quietgnn.nn.export import load_model
    from quietgnn.partition.shards import read_part
    from quietgnn.runtime.checkpoint import _read_marker
    from quietgnn.runtime.metrics import metrics_lines
    from quietgnn.serial import MAX_JSON_DEPTH, loads_json
    # ~990 deep still parses, and would overflow the next recursive reader: capped at 64
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(f'{{"a": 1, "b": {ok[1:-1]}}}')["a"] == 1
    with pytest.raises(ValueError, match="^nested deeper than 64 levels"):
        loads_json(f'{{"a": 1, "b": {ok}}}')
    book = tmp_path / "book"
    shutil.copytree(syn_book, book)
    (book / "part-0" / "part.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"part-0/part.json' is unreadable \(nested deeper "):
        read_part(book / "part-0")
    (book / "book.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"book.json' is not valid JSON \(nested deeper than 64 "
                                         r"levels, where no quietgnn file nests more"):
        PartitionBook.open(book)
    ck = tmp_path / "epoch-000001"
    ck.mkdir()
    (ck / "COMMIT.json").write_text(DEEP)
    assert _read_marker(ck) == (None, "commit marker unreadable (JSONNestedTooDeep)")
    metrics = tmp_path / "rank-0.jsonl"
    metrics.write_text(f'{DEEP}\n{{"epoch": 0}}\n')
    assert [rec for _, rec in metrics_lines(metrics)] == [{"epoch": 0}]
    results = tmp_path / "results.jsonl"
    results.write_text(DEEP + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl' line 1 is not JSON \(nested deeper"):
        load_results([results])
    (tmp_path / "model.json").write_text(DEEP)
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"model.json' is not a model description .*nested"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"config.json' is not JSON \(nested deeper"):
        _run_config(tmp_path / "config.json")


def test_a_cached_book_another_run_wrote_meanwhile_is_used_not_replaced(tmp_path,
                                                                       monkeypatch):
    """Two runs of one cache key both built its book; the second moved the first's aside
    and deleted it while the first run's workers could be opening it."""
    import quietgnn.partition as partition
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))
    real = partition.make_book

    def raced(path, graph, *a, **k):       # the other run finishes first
        real(path, graph, *a, **{**k, "overwrite": True})
        (path / "theirs").write_text("")       # marks the other run's directory
        return real(path, graph, *a, **k)
    monkeypatch.setattr(partition, "make_book", raced)
    cfg = _cfg(dataset={"name": "synthetic"}, synthetic=SYN, partition={"parts": 2})
    path = prepare_book(cfg, log=lambda m: None)
    assert (path / "theirs").exists()         # kept: the other run's workers read it
    PartitionBook.open(path)


def test_a_full_cache_is_named_with_the_setting_that_moves_it(tmp_path, monkeypatch):
    """Writing a book into a full cache ended the run with numpy's words alone ('600000
    requested and 161760 written': no file, no setting); nothing half-written is kept."""
    import quietgnn.partition.book as book_mod
    from quietgnn.safefiles import WriteError
    cfg = _cfg(synthetic=SYN, partition={"method": "random", "parts": 2})
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))

    def short_write(path, *args, **kwargs):
        (Path(path) / "x.npy").parent.mkdir(parents=True, exist_ok=True)
        (Path(path) / "x.npy").write_bytes(b"partial")
        raise OSError("600000 requested and 161760 written")

    monkeypatch.setattr(book_mod, "write_part", short_write)
    with pytest.raises(WriteError, match=r"could not write the partition book into the cache "
                                         r"'.*cache/books': No space left on device; .* free "
                                         r"there; .* set QUIETGNN_CACHE to a directory with "
                                         r"room"):
        prepare_book(cfg, log=lambda m: None)
    assert list((tmp_path / "cache" / "books").iterdir()) == []
