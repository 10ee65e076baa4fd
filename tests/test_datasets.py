"""quietgnn.datasets: the synthetic generator, the shared real datasets, user files, OGB
(offline errors and a tiny fake OGB folder) and load_dataset's name handling."""

from __future__ import annotations

import gzip
import re
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from quietgnn.datasets import available_datasets, load_dataset
from quietgnn.datasets.synthetic import SyntheticSpec, edge_homophily, make_synthetic

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FIELDS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Nothing a test loads may be written to the home directory."""
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/data not found: real-dataset tests need the shared datasets")
    return SHARED


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory) -> Path:
    """The cache the real datasets are loaded with (it stays empty: their raw files are
    read where they are)."""
    return tmp_path_factory.mktemp("real-cache")


def _load_real(name: str, root: Path, cache: Path, monkeypatch) -> "object":
    monkeypatch.setenv("QUIETGNN_CACHE", str(cache))
    return load_dataset(name, str(root))


# ---------------------------------------------------------------------- synthetic
SMALL = dict(nodes=3000, avg_degree=10.0)


def test_synthetic_deterministic():
    a, b = make_synthetic(SyntheticSpec(**SMALL)), make_synthetic(SyntheticSpec(**SMALL))
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    c = make_synthetic(SyntheticSpec(**SMALL, seed=1))
    assert not torch.equal(a.indices, c.indices) and not torch.equal(a.y, c.y)
    assert not torch.equal(a.x, c.x)


def test_synthetic_chunking_and_direct_csr(monkeypatch):
    """The generator builds its CSR directly and post-processes the draws in chunks: the graph
    must not depend on the chunk size and must equal the generic edge-list route."""
    import quietgnn.datasets.synthetic as syn
    from quietgnn.graph import Graph
    spec = SyntheticSpec(nodes=2000, avg_degree=12.0, homophily=0.6)
    a = make_synthetic(spec)
    monkeypatch.setattr(syn, "_CHUNK", 777)
    b = make_synthetic(spec)
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.meta == b.meta
    c = Graph.from_edge_index(a.edge_index(), a.x, a.y, undirected=True)
    assert torch.equal(a.indptr, c.indptr) and torch.equal(a.indices, c.indices)
    assert a.meta["homophily"] == round(edge_homophily(a), 4)


def test_synthetic_split_seed_changes_split_only():
    a = load_dataset("synthetic", synthetic=SMALL, split_seed=0)
    b = load_dataset("synthetic", synthetic=SMALL, split_seed=1)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.x, b.x)
    assert not torch.equal(a.train_mask, b.train_mask)
    assert b.meta["split"] == "random" and b.meta["split_seed"] == 1


@pytest.mark.parametrize("spec", [dict(SMALL), dict(nodes=5000, avg_degree=4.0, classes=3),
                                  dict(nodes=2000, avg_degree=20.0, degree_skew=0),
                                  dict(nodes=4000, avg_degree=8.0, degree_skew=2.1)])
def test_synthetic_sizes_close_to_spec(spec):
    g = make_synthetic(SyntheticSpec(**spec))
    s = SyntheticSpec(**spec)
    assert g.num_nodes == s.nodes and g.num_features == s.feature_dim
    assert g.num_classes == s.classes and set(g.y.unique().tolist()) == set(range(s.classes))
    assert abs(g.num_edges - s.nodes * s.avg_degree) <= 0.15 * s.nodes * s.avg_degree
    assert g.is_undirected() and g.meta["undirected"] is True
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == \
        [round(0.6 * s.nodes), round(0.2 * s.nodes), s.nodes - round(0.6 * s.nodes) - round(0.2 * s.nodes)]
    assert g.x.dtype == torch.float32 and g.meta["synthetic"]["nodes"] == s.nodes


@pytest.mark.parametrize("h", [0.0, 0.3, 0.8, 1.0])
def test_synthetic_homophily_matches_spec(h):
    g = make_synthetic(SyntheticSpec(**SMALL, homophily=h))
    assert abs(edge_homophily(g) - h) <= 0.05
    assert g.meta["homophily"] == pytest.approx(edge_homophily(g), abs=1e-4)


def test_synthetic_degree_skew_heavy_tail():
    skewed = make_synthetic(SyntheticSpec(nodes=5000, degree_skew=2.5)).in_degree().double()
    flat = make_synthetic(SyntheticSpec(nodes=5000, degree_skew=0)).in_degree().double()
    assert skewed.max() > 8 * skewed.mean()          # hubs
    assert flat.max() < 3 * flat.mean()               # Poisson-like, no hubs
    assert skewed.std() > 3 * flat.std()
    # the cap: no node far beyond sqrt(N * avg_degree) expected edges
    assert skewed.max() <= 2 * (5000 * 10) ** 0.5


def test_synthetic_features_carry_class_signal():
    g = make_synthetic(SyntheticSpec(**SMALL))
    means = torch.stack([g.x[g.y == c].mean(0) for c in range(g.num_classes)])
    nearest = torch.cdist(g.x, means).argmin(1)
    acc = float((nearest == g.y).float().mean())
    assert 0.35 < acc < 0.9      # informative, but not trivially separable
    noiseless = make_synthetic(SyntheticSpec(**SMALL, feature_noise=0.0))
    assert torch.unique(noiseless.x, dim=0).shape[0] == noiseless.num_classes


def test_class_imbalance_and_signal_fraction():
    """class sizes follow (c + 1)^-imbalance; the class means live in the first
    signal_fraction of the columns, at the same norm - in memory and streamed alike"""
    spec = SyntheticSpec(nodes=20000, classes=4, class_imbalance=1.0, feature_dim=16,
                         signal_fraction=0.25, feature_noise=0.0)
    want = torch.tensor([1, 1 / 2, 1 / 3, 1 / 4]) / (1 + 1 / 2 + 1 / 3 + 1 / 4)
    g = make_synthetic(spec)
    assert torch.allclose(torch.bincount(g.y) / g.num_nodes, want, atol=0.01)
    assert (g.x[:, 4:] == 0).all() and (g.x[:, :4] != 0).any(1).all()
    assert torch.allclose(g.x.norm(dim=1), torch.full((g.num_nodes,), 2.0))
    from quietgnn.prepare.synthetic import SyntheticNodes, _labels
    y = torch.from_numpy(_labels(spec).astype("int64"))
    assert torch.allclose(torch.bincount(y) / spec.nodes, want, atol=0.01)
    x = next(iter(SyntheticNodes(spec).blocks(None))).x
    assert (x[:, 4:] == 0).all() and abs(float((x ** 2).sum(1).mean()) - 4.0) < 1e-4
    # balanced and full-width stay the stream they were before the knobs existed
    old = make_synthetic(SyntheticSpec(**SMALL))
    assert torch.equal(old.y, make_synthetic(SyntheticSpec(**SMALL, class_imbalance=0.0,
                                                           signal_fraction=1.0)).y)


@pytest.mark.parametrize("field,value,allowed", [
    ("nodes", 10, r">= 2 \* classes = 16"), ("classes", 1, ">= 2"),
    ("avg_degree", 0, r"in \(0, nodes = 20000\)"), ("avg_degree", 30000.0, r"in \(0, nodes"),
    ("homophily", 1.5, r"in \[0, 1\]"), ("homophily", -0.1, r"in \[0, 1\]"),
    ("degree_skew", 1.5, "power-law exponent > 2"), ("degree_skew", 2.0, "or 0 for no skew"),
    ("feature_dim", 0, ">= 1"), ("feature_noise", -1.0, ">= 0"), ("nodes", 100.5, "an int"),
    ("classes", True, ">= 2"), ("homophily", float("nan"), r"\[0, 1\]"),
    ("signal_fraction", 0.0, r"in \(0, 1\]"), ("class_imbalance", -1.0, r"in \[0, 4\]")])
def test_synthetic_spec_validation(field, value, allowed):
    with pytest.raises(ValueError, match=re.escape(f"synthetic.{field} = {value!r}; expected")
                       + ".*" + allowed):
        SyntheticSpec(**{field: value})


def test_synthetic_dict_spec_and_unknown_key():
    g = load_dataset("SYNTHETIC", synthetic={"nodes": 400, "classes": 4})
    assert g.num_nodes == 400 and g.num_classes == 4 and g.meta["source"] == "synthetic"
    with pytest.raises(ValueError, match=r"unknown synthetic option\(s\) \['node'\]"):
        load_dataset("synthetic", synthetic={"node": 400})


def test_import_quietgnn_does_not_import_pyg_or_ogb():
    code = ("import sys, quietgnn, quietgnn.datasets; "
            "print('torch_geometric' in sys.modules, 'ogb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ---------------------------------------------------------------------- real datasets
def test_cora(shared, real_cache, monkeypatch):
    g = _load_real("cora", shared / "planetoid", real_cache, monkeypatch)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (2708, 10556, 1433, 7)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [140, 500, 1000]
    assert g.meta["split"] == "public" and g.meta["undirected"] and g.is_undirected()
    assert g.meta["source"] == "pyg:Planetoid"
    # root one level higher, name in any case: the same graph, from the same cache entry
    assert _load_real("Cora", shared, real_cache, monkeypatch).fingerprint() == g.fingerprint()


def test_citeseer(shared, real_cache, monkeypatch):
    g = _load_real("citeseer", shared, real_cache, monkeypatch)
    # PyG's 9,104 directed edges are already symmetric, loop- and duplicate-free: kept as is
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (3327, 9104, 3703, 6)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [120, 500, 1000]


def test_computers(shared, real_cache, monkeypatch):
    g = _load_real("computers", shared / "amazon", real_cache, monkeypatch)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (13752, 491722, 767, 10)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [8251, 2750, 2751]
    assert g.meta["split"] == "random" and g.meta["split_seed"] == 0


def test_coauthor_cs(shared, real_cache, monkeypatch):
    g = _load_real("CS", shared, real_cache, monkeypatch)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (18333, 163788, 6805, 15)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [11000, 3667, 3666]


def test_shared_folder_untouched(shared, real_cache, monkeypatch):
    _load_real("cora", shared / "planetoid", real_cache, monkeypatch)
    assert not list(shared.rglob("processed"))
    # raw files found under the root are read where they are: nothing is cached
    assert not (real_cache / "pyg").exists()


@pytest.mark.parametrize("name, family, folder", [("cora", "Planetoid", "Cora"),
                                                  ("citeseer", "Planetoid", "CiteSeer"),
                                                  ("computers", "Amazon", "Computers")])
def test_safe_readers_equal_pyg_on_the_real_datasets(shared, tmp_path, name, family, folder):
    """quietgnn reads the raw files itself (Planetoid's pickles through an unpickler that
    admits only numpy/scipy classes, never PyG's processed cache): the graph is the one PyG's
    own dataset class gives, array for array, and so are the Planetoid arrays before it."""
    import torch_geometric.datasets as pyg_datasets
    from torch_geometric.io.planetoid import read_planetoid_data

    from quietgnn.datasets.planetoid import read_planetoid
    from quietgnn.datasets.pyg import PYG_DATASETS, find_raw_dir
    from quietgnn.graph import Graph
    raw = find_raw_dir(PYG_DATASETS[name], shared)
    shutil.copytree(raw, tmp_path / folder / "raw")     # PyG writes processed/ beside raw/
    data = getattr(pyg_datasets, family)(str(tmp_path), folder)[0]
    if family == "Planetoid":
        ref = Graph.from_pyg(data, name=name)
        ours, theirs = read_planetoid(raw, folder), read_planetoid_data(str(raw), folder)
        for f in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(getattr(ours, f), getattr(theirs, f)), f
        pairs = ours.edge_index[:, ours.edge_index[0] != ours.edge_index[1]].unique(dim=1)
        assert torch.equal(pairs, theirs.edge_index.unique(dim=1))
    else:
        data.train_mask = data.val_mask = data.test_mask = None
        ref = Graph.from_pyg(data, name=name, split_seed=0)
    g = load_dataset(name, shared)
    for f in FIELDS:
        assert torch.equal(getattr(g, f), getattr(ref, f)), f
    assert g.fingerprint() == ref.fingerprint()


def test_missing_raw_files_are_downloaded_into_the_cache_once(shared, tmp_path, monkeypatch):
    """Without raw files under the root they are downloaded (PyG's URLs) into the cache, all
    or none, and read from there afterwards."""
    import torch_geometric.data

    calls = []

    def fake_download(url, folder, log=True):
        calls.append(url)
        name = url.rsplit("/", 1)[1]
        shutil.copyfile(shared / "planetoid" / "Cora" / "raw" / name, Path(folder) / name)
        return str(Path(folder) / name)
    monkeypatch.setattr(torch_geometric.data, "download_url", fake_download)
    root = tmp_path / "empty"
    root.mkdir()
    g = load_dataset("cora", root)
    assert len(calls) == 8 and calls[0].startswith("https://github.com/kimiyoung/planetoid/")
    assert Path(g.meta["raw_dir"]).parent.parent.parent == tmp_path / "cache" / "pyg"
    assert load_dataset("cora", root).fingerprint() == g.fingerprint() and len(calls) == 8
    assert g.fingerprint() == load_dataset("cora", shared).fingerprint()
    assert not list(root.iterdir())
    # the cached copy is what the run reads, so it is what a cached book's key hashes (a raw
    # file replaced in the cache reused the book of the old one)
    from quietgnn.datasets import dataset_files
    raw = Path(g.meta["raw_dir"])
    assert sorted(dataset_files("cora", root)) == sorted(raw / f for f in os.listdir(raw))
    assert len(os.listdir(raw)) == 8


def test_pyg_name_needs_root():
    with pytest.raises(ValueError, match=r"pass --root DIR.*e\.g\. --root ../shared/data/planetoid"):
        load_dataset("cora")


def test_pyg_missing_raw_offline_is_clear_and_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("QUIETGNN_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"Put these files in '.*/Cora/raw': ind\.cora\.x, "
                                         r"ind\.cora\.tx.*ind\.cora\.test\.index"):
        load_dataset("cora", tmp_path)
    assert time.perf_counter() - t0 < 5


def test_pyg_download_failure_is_clear(tmp_path, monkeypatch):
    import torch_geometric.data

    def no_network(*a, **k):
        raise OSError("network unreachable")
    monkeypatch.setattr(torch_geometric.data, "download_url", no_network)
    with pytest.raises(ValueError, match=r"download failed: OSError: network unreachable\)\. Put "
                                         r"these files in '.*/Photo/raw': amazon_electronics_photo"):
        load_dataset("photo", tmp_path)
    assert not list((tmp_path / "cache").rglob("*.npz"))      # no half-downloads kept


# ---------------------------------------------------------------------- user files
def _toy(n=30, seed=0):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, 80))
    return ei, rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 3, n)


def test_npz_round_trip(tmp_path):
    ei, x, y = _toy()
    np.savez(tmp_path / "g.npz", edge_index=ei, x=x, y=y)
    g = load_dataset(str(tmp_path / "g.npz"))
    ref = __import__("quietgnn.graph", fromlist=["Graph"]).Graph.from_edge_index(
        torch.from_numpy(ei), torch.from_numpy(x), torch.from_numpy(y))
    assert torch.equal(g.indices, ref.indices) and torch.equal(g.x, ref.x)
    assert g.meta["split"] == "random" and g.meta["features"] == "file" and g.name == "g"
    # src/dst keys, explicit masks and num_classes are honoured
    masks = {k: np.zeros(30, bool) for k in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][:5], masks["val_mask"][5:10], masks["test_mask"][10:] = True, True, True
    np.savez(tmp_path / "h.npz", src=ei[0], dst=ei[1], x=x, y=y[:, None], num_classes=5, **masks)
    h = load_dataset(tmp_path / "h.npz")
    assert torch.equal(h.indices, g.indices) and h.num_classes == 5 and h.meta["split"] == "file"
    assert h.train_mask.tolist() == masks["train_mask"].tolist()


def test_npz_relative_to_root(tmp_path):
    ei, x, y = _toy()
    np.savez(tmp_path / "g.npz", edge_index=ei, x=x, y=y)
    assert load_dataset("g.npz", root=tmp_path).num_nodes == 30


def test_npz_errors(tmp_path):
    ei, x, y = _toy()
    with pytest.raises(ValueError, match=r"graph file '.*missing\.npz' not found"):
        load_dataset(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "a.npz", x=x, y=y)
    with pytest.raises(ValueError, match=r"a\.npz: no edges: expected key 'edge_index'.*found "
                                         r"keys \['x', 'y'\]"):
        load_dataset(str(tmp_path / "a.npz"))
    np.savez(tmp_path / "b.npz", edge_index=ei, x=x)
    with pytest.raises(ValueError, match=r"b\.npz: missing key 'y'"):
        load_dataset(str(tmp_path / "b.npz"))
    np.savez(tmp_path / "c.npz", edge_index=ei.T, x=x, y=y)
    with pytest.raises(ValueError, match=r"key 'edge_index' has shape \(80, 2\), expected \[2, E\].*"
                                         r"transpose"):
        load_dataset(str(tmp_path / "c.npz"))
    np.savez(tmp_path / "d.npz", edge_index=ei, x=x[:10], y=y)
    with pytest.raises(ValueError, match=r"d\.npz key 'x': features have shape \(10, 5\), "
                                         r"expected \[30, F\]"):
        load_dataset(str(tmp_path / "d.npz"))
    np.savez(tmp_path / "e.npz", edge_index=ei, y=y, train_mask=np.ones(30, bool))
    with pytest.raises(ValueError, match=r"give all three masks or none"):
        load_dataset(str(tmp_path / "e.npz"))
    np.savez(tmp_path / "f.npz", edge_index=ei, y=y[:20])
    with pytest.raises(ValueError, match=r"edge list holds node id \d+ but there are 20 labels"):
        load_dataset(str(tmp_path / "f.npz"))


def test_edge_list_round_trip(tmp_path):
    ei, x, y = _toy()
    lines = ["# a comment", "% another"] + [f"{u} {v}" for u, v in ei.T] + [""]
    (tmp_path / "g.edges").write_text("\n".join(lines))
    np.save(tmp_path / "g.labels.npy", y)
    np.save(tmp_path / "g.features.npy", x)
    g = load_dataset(str(tmp_path / "g.edges"))
    np.savez(tmp_path / "ref.npz", edge_index=ei, x=x, y=y)
    ref = load_dataset(str(tmp_path / "ref.npz"))
    for f in FIELDS:
        assert torch.equal(getattr(g, f), getattr(ref, f)), f
    # comma-separated with a weight column, labels as text, no features -> degree buckets
    (tmp_path / "w.csv").write_text("".join(f"{u}, {v}, 0.5\n" for u, v in ei.T))
    (tmp_path / "w.labels.txt").write_text("\n".join(map(str, y)))
    w = load_dataset(str(tmp_path / "w.CSV".replace("CSV", "csv")))
    assert torch.equal(w.indices, g.indices) and w.meta["features"] == "degree-buckets"
    assert w.x.shape == (30, 16) and torch.all(w.x.sum(1) == 1)
    bucket = w.x.argmax(1)
    deg = w.in_degree()
    assert torch.equal(bucket, torch.clamp(torch.floor(torch.log2(deg.double() + 1)), max=15).long())


def test_edge_list_errors(tmp_path):
    with pytest.raises(ValueError, match=r"edge list '.*nope\.txt' not found"):
        load_dataset(str(tmp_path / "nope.txt"))
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match=r"needs its labels: expected g\.labels\.npy \(int \[N\]\) "
                                         r"or g\.labels\.txt"):
        load_dataset(str(tmp_path / "g.txt"))
    np.save(tmp_path / "g.labels.npy", np.array([0, 1]))
    with pytest.raises(ValueError, match=r"g\.txt: edge list holds node id 2 but there are 2 "
                                         r"labels"):
        load_dataset(str(tmp_path / "g.txt"))
    (tmp_path / "bad.txt").write_text("0 1\n1 x\n")
    np.save(tmp_path / "bad.labels.npy", np.array([0, 1]))
    with pytest.raises(ValueError, match=r"bad\.txt: could not read it as an edge list"):
        load_dataset(str(tmp_path / "bad.txt"))
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match=r"empty\.txt: no edges found"):
        load_dataset(str(tmp_path / "empty.txt"))
    (tmp_path / "f.txt").write_text("0 1\n")
    np.save(tmp_path / "f.labels.npy", np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match=r"f\.labels\.npy: labels must be integer class ids"):
        load_dataset(str(tmp_path / "f.txt"))


# ---------------------------------------------------------------------- names
def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'coraa'; expected one of: synthetic, cora, "
                                         r"citeseer, .*ogbn-<name>, <path>\.npz"):
        load_dataset("coraa")
    with pytest.raises(ValueError, match=r"supported endings are \.npz and \.txt, \.edges"):
        load_dataset("graph.parquet")


def test_available_datasets():
    rows = available_datasets()
    names = [n for n, _ in rows]
    for n in ("synthetic", "cora", "citeseer", "pubmed", "computers", "photo", "cs", "physics"):
        assert n in names
    assert all(isinstance(d, str) and d and "\n" not in d for _, d in rows)


# ---------------------------------------------------------------------- OGB
def test_ogb_offline_error_clear_and_fast(tmp_path, monkeypatch):
    import ogb.utils.url as ogb_url

    def must_not_download(*a, **k):   # with internet, never fetch 80 MB inside a unit test
        raise OSError("download blocked in tests")
    monkeypatch.setattr(ogb_url, "download_url", must_not_download)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("ogb waited for stdin"))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"ogbn-arxiv: files not found and the download failed .*"
                                         r"OGB expects the unzipped dataset in '.*ogbn_arxiv': "
                                         r"RELEASE_v1\.txt, raw/edge\.csv\.gz"):
        load_dataset("OGBN-ARXIV", tmp_path)
    assert time.perf_counter() - t0 < 15
    assert not (tmp_path / "ogbn_arxiv").exists()
    monkeypatch.setenv("QUIETGNN_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"QUIETGNN_OFFLINE is set"):
        load_dataset("ogbn-products", tmp_path)


def test_ogb_incomplete_folder_named_not_prompted(tmp_path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("ogb waited for stdin"))
    (tmp_path / "ogbn_arxiv" / "raw").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"the folder is incomplete, missing RELEASE_v1\.txt, "
                                         r"raw/edge\.csv\.gz"):
        load_dataset("ogbn-arxiv", tmp_path)


def test_ogb_name_errors():
    with pytest.raises(ValueError, match=r"pass --root DIR.*ogbn_arxiv/"):
        load_dataset("ogbn-arxiv")
    with pytest.raises(ValueError, match=r"unknown OGB node dataset 'ogbn-nope'; OGB has "
                                         r"\['ogbn-arxiv'"):
        load_dataset("ogbn-nope", "/nonexistent")
    with pytest.raises(ValueError, match=r"ogbn-proteins is multi-label"):
        load_dataset("ogbn-proteins", "/nonexistent")


def _write_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.writelines(",".join(map(str, np.atleast_1d(r))) + "\n" for r in rows)


def test_ogb_fake_arxiv_loads_with_ogb_split_and_evaluator(tmp_path):
    """A 40-node folder in OGB's arxiv layout: exercises ogb's processing, the second load
    from its processed cache (torch.load under weights_only) and the Evaluator."""
    rng, n, d = np.random.default_rng(0), 40, tmp_path / "ogbn_arxiv"
    d.mkdir()
    (d / "RELEASE_v1.txt").write_text("fake")
    edges = rng.integers(0, n, size=(120, 2))
    y = rng.integers(0, 40, n)
    _write_gz(d / "raw/edge.csv.gz", edges)
    _write_gz(d / "raw/num-node-list.csv.gz", [n])
    _write_gz(d / "raw/num-edge-list.csv.gz", [len(edges)])
    _write_gz(d / "raw/node-feat.csv.gz", rng.normal(size=(n, 3)).round(3))
    _write_gz(d / "raw/node-label.csv.gz", y)
    _write_gz(d / "raw/node_year.csv.gz", np.full(n, 2020))
    perm = rng.permutation(n)
    for part, idx in (("train", perm[:20]), ("valid", perm[20:30]), ("test", perm[30:])):
        _write_gz(d / f"split/time/{part}.csv.gz", idx)
    for _ in range(2):   # first: processed from raw; second: from ogb's processed/ file
        g = load_dataset("ogbn-arxiv", tmp_path)
        assert g.num_nodes == n and g.num_classes == 40 and g.y.tolist() == y.tolist()
        assert g.train_mask.nonzero().view(-1).tolist() == sorted(perm[:20].tolist())
        assert g.meta["evaluator"] == "ogbn-arxiv" and g.meta["split"] == "ogb"
        assert g.is_undirected() and g.meta["undirected"]
    assert (d / "processed" / "data_processed").is_file()
    assert load_dataset("ogbn-arxiv", d).fingerprint() == g.fingerprint()   # root = the folder

    from quietgnn.datasets.ogb import ogb_accuracy
    assert ogb_accuracy("ogbn-arxiv", g.y, g.y) == 1.0
    logits = torch.nn.functional.one_hot(g.y, 40).float()
    logits[:10] = torch.nn.functional.one_hot((g.y[:10] + 1) % 40, 40).float()
    assert ogb_accuracy("ogbn-arxiv", g.y[:, None], logits) == pytest.approx(30 / 40)
    with pytest.raises(ValueError, match="y_true has 40 rows but y_pred has 39"):
        ogb_accuracy("ogbn-arxiv", g.y, g.y[:39])


def test_per_class_split_draws_k_per_class_v_validation_and_the_rest_test(tmp_path):
    """``dataset.split per_class:K:V`` (Planetoid's random split) through every path a run
    loads its graph: the loader, the launcher's book and a worker partitioning in-process."""
    from quietgnn.config import load_config
    from quietgnn.partition import PartitionBook
    from quietgnn.runtime.books import (_build_book, check_book_dataset, dataset_identity_of,
                                        partition_key)
    from quietgnn.runtime.plan import RunPlan
    from quietgnn.runtime.worker import load_local_partition
    syn = {"nodes": 600, "classes": 3}
    g = load_dataset("synthetic", synthetic=syn, split="per_class:7:50", split_seed=1)
    per = [int((g.train_mask & (g.y == c)).sum()) for c in range(3)]
    assert per == [7, 7, 7] and int(g.val_mask.sum()) == 50
    assert not (g.train_mask & g.val_mask).any()
    assert bool((g.test_mask == ~(g.train_mask | g.val_mask)).all())
    again = load_dataset("synthetic", synthetic=syn, split="per_class:7:50", split_seed=1)
    other = load_dataset("synthetic", synthetic=syn, split="per_class:7:50", split_seed=2)
    assert bool((again.train_mask == g.train_mask).all())
    assert not bool((other.train_mask == g.train_mask).all())
    assert (g.meta["split"], g.meta["split_seed"]) == ("per_class:7:50", 1)
    with pytest.raises(ValueError, match="fewer than 9999 validation nodes"):
        load_dataset("synthetic", synthetic=syn, split="per_class:7:9999")
    with pytest.raises(ValueError, match="no node of .* is left for the test set"):
        load_dataset("synthetic", synthetic=syn, split="per_class:7:579")

    def cfg(split: str, seed: int = 1):
        return load_config(None, {"strategy": "halo", "partition": {"parts": 2},
                                  "dataset": {"name": "synthetic", "split": split,
                                              "split_seed": seed}, "synthetic": syn})
    c = cfg("per_class:7:50")
    assert dataset_identity_of(c)["split"] == "per_class:7:50"
    keys = {partition_key(x) for x in (cfg("standard"), c, cfg("per_class:7:50", 2))}
    assert len(keys) == 3
    _build_book(c, tmp_path / "book")
    book = PartitionBook.open(tmp_path / "book")
    assert sum(int(book.load_part(r, 2).train_mask.sum()) for r in range(2)) == 21
    # each rank under torchrun checks the book without loading the graph: another split (or
    # split seed) is refused there too, by name; the same one passes
    check_book_dataset(book, c, load=False)
    for other, says in ((cfg("per_class:7:50", 2), "split_seed"),
                        (cfg("standard"), "dataset.split")):
        with pytest.raises(ValueError, match=says):
            check_book_dataset(book, other, load=False)
    _build_book(cfg("standard"), tmp_path / "std")
    with pytest.raises(ValueError, match="dataset.split: book 'standard'"):
        check_book_dataset(PartitionBook.open(tmp_path / "std"), c, load=False)
    plan = RunPlan(cfg=c, run_dir=tmp_path / "run", dataset=dataset_identity_of(c))
    assert sum(int(load_local_partition(plan, r, 2).train_mask.sum()) for r in range(2)) == 21


@pytest.mark.parametrize("value", ["random", "per_class:0:5", "per_class:3", "per_class:a:b"])
def test_a_bad_split_is_refused_by_name(value):
    from quietgnn.config import load_config
    with pytest.raises(ValueError, match=f"dataset.split = '{re.escape(value)}'"):
        load_config(None, {"dataset": {"split": value}})
    with pytest.raises(ValueError, match="holds the split it was prepared with"):
        load_config(None, {"dataset": {"split": "per_class:2:5", "prepared": "somewhere"}})


def test_a_cache_that_cannot_be_written_is_named_with_its_setting(tmp_path, monkeypatch):
    """Under a read-only home the download cache's mkdir was a bare [Errno 30] naming
    ~/.cache (exit 1); it names the cache and QUIETGNN_CACHE."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("QUIETGNN_CACHE", str(tmp_path / "afile" / "cache"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^cannot write the Cora download into the cache "
                                         r"'.*afile/cache' \(Not a directory\): set "
                                         r"QUIETGNN_CACHE to a directory you may write$"):
        load_dataset("cora", tmp_path / "empty")
