"""Your own graph files: sparse features in ``.npz`` (kept sparse on disk), CSV edge lists with
a header line, and the user guide's conversion recipe, run on files in the public format."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from quietgnn.datasets import dataset_files, load_dataset

# the recipe lives in the user guide (the README links to it)
README = Path(__file__).resolve().parents[1] / "docs" / "guide" / "running.md"


def _sparse_toy(n: int = 40, f: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, 120))
    x = (rng.random((n, f)) < 0.02).astype(np.float32) * rng.integers(1, 4, (n, f))
    return ei, x, rng.integers(0, 4, n)


def test_sparse_npz_features_load_equal_to_dense_and_stay_small(tmp_path):
    ei, x, y = _sparse_toy()
    np.savez(tmp_path / "dense.npz", edge_index=ei, x=x, y=y)
    m = sp.csr_matrix(x)
    np.savez(tmp_path / "sparse.npz", edge_index=ei, y=y, x_data=m.data, x_indices=m.indices,
             x_indptr=m.indptr, x_shape=np.array(m.shape), x_format=np.array(b"csr"))
    dense, sparse = load_dataset(tmp_path / "dense.npz"), load_dataset(tmp_path / "sparse.npz")
    for f in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(dense, f), getattr(sparse, f)), f
    assert sparse.x.dtype == torch.float32 and sparse.x.shape == (40, 300)
    assert (tmp_path / "sparse.npz").stat().st_size < (tmp_path / "dense.npz").stat().st_size / 5


def test_edge_list_with_a_scipy_save_npz_feature_file(tmp_path):
    ei, x, y = _sparse_toy(seed=1)
    (tmp_path / "g.txt").write_text("".join(f"{u} {v}\n" for u, v in ei.T))
    np.save(tmp_path / "g.labels.npy", y)
    sp.save_npz(tmp_path / "g.features.npz", sp.csr_matrix(x))
    g = load_dataset(tmp_path / "g.txt")
    assert torch.equal(g.x, torch.from_numpy(x)) and g.meta["features"] == "file"
    # the cache key of the partition book covers the feature file
    assert tmp_path / "g.features.npz" in dataset_files(tmp_path / "g.txt")


def test_bad_sparse_features_are_named(tmp_path):
    ei, x, y = _sparse_toy()
    m = sp.csr_matrix(x)
    np.savez(tmp_path / "a.npz", edge_index=ei, y=y, x_data=m.data, x_indices=m.indices,
             x_shape=np.array(m.shape))
    with pytest.raises(ValueError, match=r"a\.npz: sparse features need keys .*\['x_indptr'\] "
                                         r"missing"):
        load_dataset(tmp_path / "a.npz")
    bad = m.indices.copy()
    bad[0] = 5000
    np.savez(tmp_path / "b.npz", edge_index=ei, y=y, x_data=m.data, x_indices=bad,
             x_indptr=m.indptr, x_shape=np.array(m.shape))
    with pytest.raises(ValueError, match=r"b\.npz: sparse features are not a valid CSR matrix "
                                         r"of shape \(40, 300\)"):
        load_dataset(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", edge_index=ei, y=y, x_data=m.data, x_indices=m.indices,
             x_indptr=m.indptr, x_shape=np.array([30, 300]))
    with pytest.raises(ValueError, match=r"c\.npz"):
        load_dataset(tmp_path / "c.npz")
    sp.save_npz(tmp_path / "d.features.npz", sp.csc_matrix(x))
    (tmp_path / "d.txt").write_text("0 1\n")
    np.save(tmp_path / "d.labels.npy", y)
    with pytest.raises(ValueError, match=r"format 'csc'; expected 'csr'"):
        load_dataset(tmp_path / "d.txt")


def test_csv_edge_list_with_a_header_line_loads(tmp_path):
    ei, _, y = _sparse_toy()
    (tmp_path / "h.csv").write_text("id_1,id_2\n" + "".join(f"{u},{v}\n" for u, v in ei.T))
    (tmp_path / "p.csv").write_text("".join(f"{u},{v}\n" for u, v in ei.T))
    for stem in ("h", "p"):
        np.save(tmp_path / f"{stem}.labels.npy", y)
    h, p = load_dataset(tmp_path / "h.csv"), load_dataset(tmp_path / "p.csv")
    assert torch.equal(h.indptr, p.indptr) and torch.equal(h.indices, p.indices)
    # a second line that is not an edge is still an error, naming the file
    (tmp_path / "two.csv").write_text("id_1,id_2\nfrom,to\n0,1\n")
    np.save(tmp_path / "two.labels.npy", y[:2])
    with pytest.raises(ValueError, match=r"two\.csv: could not read it as an edge list"):
        load_dataset(tmp_path / "two.csv")


def _readme_recipe() -> str:
    text = README.read_text()
    m = re.search(r"<!-- recipe: own-graph -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/guide/running.md lost its own-graph recipe (marker <!-- recipe: own-graph -->)"
    return m.group(1)


def test_readme_recipe_converts_an_edge_csv_and_feature_lists(tmp_path, monkeypatch):
    """Files in the layout of SNAP's MUSAE Facebook page-page graph (edges CSV with header,
    per-node feature-id lists as JSON, a target CSV with a class name per node)."""
    rng = np.random.default_rng(3)
    n, kinds = 50, ["company", "government", "politician", "tvshow"]
    d = tmp_path / "facebook_large"
    d.mkdir()
    ei = rng.integers(0, n, size=(2, 200))
    with open(d / "musae_facebook_edges.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id_1", "id_2"])
        w.writerows(ei.T.tolist())
    label = rng.integers(0, 4, n)
    with open(d / "musae_facebook_target.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "facebook_id", "page_name", "page_type"])
        for i in rng.permutation(n):         # not in id order
            w.writerow([i, 1000 + i, f"page {i}", kinds[label[i]]])
    feats = {str(i): sorted(set(rng.integers(0, 80, rng.integers(1, 6)).tolist()))
             for i in range(n)}
    (d / "musae_facebook_features.json").write_text(json.dumps(feats))
    monkeypatch.chdir(tmp_path)
    exec(compile(_readme_recipe(), "README recipe", "exec"), {})
    g = load_dataset("facebook_large/musae_facebook_edges.csv")
    assert g.num_nodes == n and g.y.tolist() == label.tolist()
    width = max(max(v) for v in feats.values()) + 1
    assert g.x.shape == (n, width)
    for i in (0, 7, 49):
        assert torch.nonzero(g.x[i]).flatten().tolist() == feats[str(i)]


def test_label_names_become_classes_and_the_mapping_is_kept(tmp_path):
    """Labels given as names (a .npy of strings, or a .txt of words) map to classes in sorted
    order; graph.meta['label_names'] keeps the mapping."""
    from quietgnn.datasets import load_dataset
    (tmp_path / "g.txt").write_text("0 1\n1 2\n2 3\n")
    names = np.array(["tvshow", "company", "tvshow", "politician"])
    np.save(tmp_path / "g.labels.npy", names)
    g = load_dataset(str(tmp_path / "g.txt"))
    assert g.meta["label_names"] == ["company", "politician", "tvshow"]
    assert g.y.tolist() == [2, 0, 2, 1] and g.num_classes == 3
    (tmp_path / "g.labels.npy").unlink()
    (tmp_path / "g.labels.txt").write_text("\n".join(names) + "\n")
    assert load_dataset(str(tmp_path / "g.txt")).y.tolist() == [2, 0, 2, 1]
    (tmp_path / "g.features.txt").write_text("1 2\n3 x\n5 6\n7 8\n")
    with pytest.raises(ValueError, match=r"g\.features\.txt: .*expected numbers"):
        load_dataset(str(tmp_path / "g.txt"))


def test_the_shchur_csr_npz_layout_loads(tmp_path):
    """adj_* (CSR adjacency), attr_* (CSR features) and labels, as the graph2gauss files that
    PyG's Amazon / CitationFull loaders read."""
    import scipy.sparse as sp

    from quietgnn.datasets import load_dataset
    adj = sp.csr_matrix(np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]],
                                 dtype=np.float32))
    attr = sp.csr_matrix(np.eye(4, 6, dtype=np.float32))
    np.savez(tmp_path / "amazon_like.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=adj.shape, attr_data=attr.data,
             attr_indices=attr.indices, attr_indptr=attr.indptr, attr_shape=attr.shape,
             labels=np.array([0, 1, 1, 0]))
    g = load_dataset(str(tmp_path / "amazon_like.npz"))
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (4, 6, 6, 2)
    assert torch.equal(g.x, torch.eye(4, 6))


# ---------------------------------------------------------------------- damaged files
class _Payload:
    """Unpickling this creates ``path``: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.path}",))


def _refused(path, *needles: str) -> str:
    """load_dataset(path) fails with one ValueError line that names ``path`` and every needle."""
    with pytest.raises(ValueError) as ei:
        load_dataset(path)
    msg = str(ei.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _write_npz(path, **extra):
    ei, x, y = _sparse_toy()
    np.savez(path, **{"edge_index": ei, "x": x, "y": y, **extra})


def test_damaged_npz_archives_are_named_in_one_line(tmp_path):
    """A truncated archive, one whose bytes are corrupted, a file that is no zip archive (a
    pickle whose payload must not run) and a .npy named .npz: one line naming the file."""
    good = tmp_path / "good.npz"
    _write_npz(good)
    data = good.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:len(data) // 2])
    _refused(tmp_path / "cut.npz", "cut.npz: a damaged .npz archive", "BadZipFile",
             "write it again with np.savez")
    # the members are stored: flip bytes inside 'x''s data -> its CRC no longer matches
    import zipfile
    bad = bytearray(data)
    at = zipfile.ZipFile(good).getinfo("x.npy").header_offset + 400
    bad[at:at + 8] = b"\xff" * 8
    (tmp_path / "crc.npz").write_bytes(bytes(bad))
    _refused(tmp_path / "crc.npz", "crc.npz key 'x': not a readable array", "damaged")
    import pickle
    marker = tmp_path / "pwned"
    (tmp_path / "pickle.npz").write_bytes(pickle.dumps(_Payload(str(marker))))
    _refused(tmp_path / "pickle.npz", "pickle.npz: not a .npz archive", "not a zip header",
             "np.savez")
    assert not marker.exists()
    np.save(tmp_path / "single.npy", np.arange(3))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    _refused(tmp_path / "single.npz", "single.npz: a single array (.npy format)")


def test_object_arrays_are_named_by_file_and_key_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    objs = np.array([_Payload(str(marker))] * 40, dtype=object)
    _write_npz(tmp_path / "obj.npz", y=objs)
    _refused(tmp_path / "obj.npz", "obj.npz key 'y': holds Python objects",
             "never loads", "np.asarray(v, dtype=np.int64)")
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    np.save(tmp_path / "g.labels.npy", objs[:3], allow_pickle=True)
    _refused(tmp_path / "g.txt", "g.labels.npy: holds Python objects", "never loads")
    assert not marker.exists()


def test_garbage_npy_files_are_named(tmp_path):
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    (tmp_path / "g.labels.npy").write_bytes(b"id,label\n0,1\n1,0\n2,1\n")
    _refused(tmp_path / "g.txt", "g.labels.npy: not a .npy array file", "np.save(path, array)")
    # the magic string, then nonsense: numpy's "we only support format version ..."
    (tmp_path / "g.labels.npy").write_bytes(b"\x93NUMPY\x07\x00" + b"\x00" * 40)
    _refused(tmp_path / "g.txt", "g.labels.npy: not a readable .npy file",
             "format version", "np.save(path, array)")
    np.save(tmp_path / "g.labels.npy", np.array([0, 1, 0]))
    np.save(tmp_path / "g.features.npy", np.ones((3, 2)))
    data = (tmp_path / "g.features.npy").read_bytes()
    (tmp_path / "g.features.npy").write_bytes(data[:-10])       # truncated
    _refused(tmp_path / "g.txt", "g.features.npy: not a readable .npy file")


def test_an_absurd_sparse_shape_is_refused_before_allocating(tmp_path):
    """x_shape = [400, 1e9] would be a 1.46 TiB dense matrix: refused, naming the value that
    is wrong, without trying to allocate it."""
    rng = np.random.default_rng(0)
    x = (rng.random((400, 30)) < 0.1).astype(np.float32)
    m = sp.csr_matrix(x)
    ei = rng.integers(0, 400, size=(2, 1000))
    y = rng.integers(0, 3, 400)
    parts = dict(edge_index=ei, y=y, x_data=m.data, x_indices=m.indices, x_indptr=m.indptr)
    np.savez(tmp_path / "wide.npz", **parts, x_shape=np.array([400, 1e9]))
    _refused(tmp_path / "wide.npz", "wide.npz: key x_shape = [400, 1000000000] asks for a "
             "dense float32 matrix of 1.46 TiB", "x_shape[1] = 1000000000 is wrong",
             f"the largest column index in x_indices is {int(m.indices.max())}")
    np.savez(tmp_path / "tall.npz", **parts, x_shape=np.array([10 ** 9, 30]))
    _refused(tmp_path / "tall.npz", "key x_shape says 1000000000 rows but x_indptr has 401 "
             "entries")
    np.savez(tmp_path / "frac.npz", **parts, x_shape=np.array([400, 2.5]))
    _refused(tmp_path / "frac.npz", "key x_shape = [400.0, 2.5]; expected two whole numbers")
    # the sparse feature file of an edge list: its rows must be the labelled nodes
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    np.save(tmp_path / "g.labels.npy", y[:300])
    sp.save_npz(tmp_path / "g.features.npz", m)
    _refused(tmp_path / "g.txt", "g.features.npz: key shape says 400 rows but the graph has "
             "300 nodes")


# ---------------------------------------------------------------------- input checks (files)
def _ring_arrays(n: int = 40, **extra):
    rng = np.random.default_rng(0)
    ring = np.stack([np.arange(n), (np.arange(n) + 1) % n])
    arrays = {"edge_index": ring, "x": rng.normal(size=(n, 6)).astype(np.float32),
              "y": np.arange(n) % 3, **extra}
    return {k: v for k, v in arrays.items() if v is not None}


def _split(n: int = 40):
    idx = np.arange(n)
    return {"train_mask": idx < 20, "val_mask": (idx >= 20) & (idx < 30), "test_mask": idx >= 30}


def test_npz_masks_must_be_bool_or_0_and_1(tmp_path):
    """A float mask of 0.3 was cast to True silently."""
    m = {k: v.astype(np.float64) for k, v in _split().items()}
    np.savez(tmp_path / "ok.npz", **_ring_arrays(**m))
    g = load_dataset(tmp_path / "ok.npz")
    assert g.train_mask.tolist() == _split()["train_mask"].tolist()
    m["train_mask"] = m["train_mask"] * 0.3
    np.savez(tmp_path / "soft.npz", **_ring_arrays(**m))
    _refused(tmp_path / "soft.npz", "soft.npz key 'train_mask': mask holds 0.3 at node 0",
             "expected a bool mask, or numbers that are all 0 or 1")


def test_bool_features_are_taken_as_float_in_npz_and_edge_lists(tmp_path):
    """Bool features were refused ('dtype bool, expected numbers'), integer ones taken."""
    a = _ring_arrays()
    b = a["x"] > 0
    np.savez(tmp_path / "b.npz", **dict(a, x=b))
    assert torch.equal(load_dataset(tmp_path / "b.npz").x, torch.from_numpy(b).float())
    (tmp_path / "e.txt").write_text("".join(f"{u} {v}\n" for u, v in a["edge_index"].T))
    np.save(tmp_path / "e.labels.npy", a["y"])
    np.save(tmp_path / "e.features.npy", b)
    assert torch.equal(load_dataset(tmp_path / "e.txt").x, torch.from_numpy(b).float())


_BAD_FILES = {
    "zw": (dict(x=np.zeros((40, 0), np.float32)),
           ["zw.npz key 'x': features have shape (40, 0), expected [N, F] with F >= 1"]),
    "u64": (dict(edge_index=np.array([[2 ** 63 + 5, 1], [0, 2]], dtype=np.uint64)),
            ["u64.npz: edge list holds node id 9223372036854775813 but there are 40"]),
    "short": (dict(y=np.arange(38) % 3, **_split()),
              ["short.npz key 'y': has 38 labels, expected 40, one per node: x has 40 rows"]),
    "big": (dict(x=np.full((40, 6), 1e300)),
            ["big.npz key 'x': feature value 1e+300 at node 0, feature 0",
             "beyond float32's range"]),
    "neg": (dict(y=-np.ones(40, np.int64)),
            ["neg.npz key 'y': all 40 labels are negative (e.g. -1); negative labels are not "
             "class ids"]),
    "onehot": (dict(y=np.eye(3, dtype=np.int64)[np.arange(40) % 3]),
               ["labels have shape (40, 3), 2-D", "y.argmax(1)"]),
}


@pytest.mark.parametrize("name", list(_BAD_FILES))
def test_bad_files_are_named_with_the_real_value(tmp_path, name):
    """Each was refused late or misleadingly: a zero-width x failed in every worker; a uint64
    id 2**63+5 was reported as -9223372036854775803; a y two short blamed train_mask; 1e300
    was 'value inf' with a numpy warning; all -1 labels said 'num_classes = 0'; a one-hot y
    was not called one."""
    import warnings
    extra, needles = _BAD_FILES[name]
    np.savez(tmp_path / f"{name}.npz", **_ring_arrays(**extra))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _refused(tmp_path / f"{name}.npz", *needles)
