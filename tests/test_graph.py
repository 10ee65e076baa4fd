"""The Graph contract: every validation error (message checked), canonical construction,
PyG round trip, direction and fingerprints."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from quietgnn.graph import Graph, csr_from_edges, random_split


def path_graph(n: int = 4, **kw) -> Graph:
    """Undirected path 0 - 1 - ... - n-1 with 2 classes and a fixed split."""
    src = torch.arange(n - 1)
    x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
    y = torch.arange(n) % 2
    train = torch.zeros(n, dtype=torch.bool)
    val, test = train.clone(), train.clone()
    train[0], val[1], test[2:] = True, True, True
    return Graph.from_edge_index(torch.stack([src, src + 1]), x, y, num_classes=2,
                                 train_mask=train, val_mask=val, test_mask=test, **kw)


def broken(**fields) -> Graph:
    """A valid graph with some fields replaced (validation is then called by the test)."""
    return replace(path_graph(), **fields)


# ---------------------------------------------------------------------- layout example
def test_module_docstring_example():
    g = path_graph(3)
    assert g.indptr.tolist() == [0, 1, 3, 4]
    assert g.indices.tolist() == [1, 0, 2, 1]
    assert g.indptr.dtype == g.indices.dtype == g.y.dtype == torch.int64
    assert g.x.dtype == torch.float32 and g.num_nodes == 3 and g.num_edges == 4


# ---------------------------------------------------------------------- validation errors
def test_negative_edge_id():
    with pytest.raises(ValueError, match=r"edge source id -1 is negative"):
        broken(indices=torch.tensor([1, 0, 2, -1, 2, 1])).validate()


def test_edge_id_out_of_range():
    g = path_graph()
    with pytest.raises(ValueError, match=r"edge source id 7 >= num_nodes 4"):
        replace(g, indices=torch.tensor([1, 0, 2, 1, 3, 7])).validate()


def test_from_edge_index_rejects_out_of_range_ids():
    x, y = torch.zeros(3, 2), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=r"node id 5, outside \[0, 3\)"):
        Graph.from_edge_index(torch.tensor([[0, 5], [1, 2]]), x, y)
    with pytest.raises(ValueError, match=r"node id -2, outside \[0, 3\)"):
        Graph.from_edge_index(torch.tensor([[0, -2], [1, 2]]), x, y)


def test_from_edge_index_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"edge_index has shape \(3, 2\), expected \[2, num_edges\]"):
        Graph.from_edge_index(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2),
                              torch.tensor([0, 1, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_from_edge_index_refuses_ids_that_are_not_integers(dtype):
    """A float edge_index was cast (0.5 -> 0, float32 ids past 2**24 rounded) and a bool one
    trained on edges between nodes 0 and 1 only: silently another graph."""
    x, y = torch.zeros(3, 2), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=rf"edge_index has dtype {dtype}; expected integer "):
        Graph.from_edge_index(torch.tensor([[0, 1], [1, 2]]).to(dtype), x, y)
    for ok in (torch.int32, torch.uint8):
        g = Graph.from_edge_index(torch.tensor([[0, 1], [1, 2]], dtype=ok), x, y)
        assert g.num_edges == 4


def test_float_indices():
    g = path_graph()
    with pytest.raises(TypeError, match=r"indices must be a 1-D int64 tensor, got dtype torch.float32"):
        replace(g, indices=g.indices.float()).validate()
    with pytest.raises(TypeError, match=r"indptr must be a 1-D int64 tensor, got dtype torch.int32"):
        replace(g, indptr=g.indptr.int()).validate()


def test_non_tensor_field():
    with pytest.raises(TypeError, match=r"field y is list, expected a torch.Tensor"):
        broken(y=[0, 1, 0, 1]).validate()


def test_integer_features_rejected():
    g = path_graph()
    with pytest.raises(TypeError, match=r"x has dtype torch.int64, expected a float dtype"):
        replace(g, x=g.x.long()).validate()


def test_feature_rows_must_match_nodes():
    with pytest.raises(ValueError, match=r"x has shape \(3, 2\), expected \[num_nodes=4"):
        broken(x=torch.zeros(3, 2)).validate()
    with pytest.raises(ValueError, match=r"x has shape \(4,\), expected"):
        broken(x=torch.zeros(4)).validate()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_features(bad):
    x = torch.zeros(4, 2)
    x[2, 1] = bad
    with pytest.raises(ValueError, match=rf"1 NaN/Inf value\(s\), first at node 2, feature 1 "
                                         rf"\(value {bad}\)"):
        broken(x=x).validate()


def test_label_shape_and_dtype():
    with pytest.raises(ValueError, match=r"y has shape \(4, 2\), expected \[num_nodes=4\]"):
        broken(y=torch.zeros(4, 2, dtype=torch.int64)).validate()
    with pytest.raises(ValueError, match=r"y has shape \(5,\)"):
        broken(y=torch.zeros(5, dtype=torch.int64)).validate()
    with pytest.raises(TypeError, match=r"y has dtype torch.float32, expected int64"):
        broken(y=torch.zeros(4)).validate()


def test_labels_out_of_range():
    with pytest.raises(ValueError, match=r"labels span \[0, 2\] but num_classes = 2.*raise num_"):
        broken(y=torch.tensor([0, 1, 2, 0])).validate()
    with pytest.raises(ValueError, match=r"labels span \[-1, 1\].*negative label is no class"):
        broken(y=torch.tensor([0, 1, -1, 0])).validate()
    with pytest.raises(ValueError, match=r"num_classes = 1, expected an int >= 2"):
        broken(num_classes=1, y=torch.zeros(4, dtype=torch.int64)).validate()


def test_overlapping_splits():
    g = path_graph()
    val = g.val_mask.clone()
    val[0] = True   # node 0 is in train
    with pytest.raises(ValueError, match=r"train_mask and val_mask overlap on 1 node\(s\), "
                                         r"first node 0"):
        replace(g, val_mask=val).validate()
    with pytest.raises(ValueError, match=r"val_mask and test_mask overlap on 2 node\(s\), first node 2"):
        replace(g, val_mask=g.test_mask.clone()).validate()


def test_mask_of_wrong_length():
    with pytest.raises(ValueError, match=r"test_mask has length 6, expected num_nodes = 4"):
        broken(test_mask=torch.zeros(6, dtype=torch.bool)).validate()


def test_mask_must_be_bool():
    with pytest.raises(TypeError, match=r"train_mask has dtype torch.int64 shape \(4,\), expected "
                                        r"a 1-D bool mask"):
        broken(train_mask=torch.tensor([1, 0, 0, 0])).validate()


def test_empty_train_set():
    with pytest.raises(ValueError, match=r"train_mask selects no node"):
        broken(train_mask=torch.zeros(4, dtype=torch.bool)).validate()


def test_self_loop_stored_directly():
    # node 1 <- 1 inserted into row 1: [0, 1, 2]
    g = broken(indptr=torch.tensor([0, 1, 4, 6, 7]), indices=torch.tensor([1, 0, 1, 2, 1, 3, 2]))
    with pytest.raises(ValueError, match=r"1 self-loop\(s\) stored"):
        g.validate()


def test_unsorted_row():
    g = broken(indptr=torch.tensor([0, 1, 3, 5, 6]), indices=torch.tensor([1, 2, 0, 1, 3, 2]))
    with pytest.raises(ValueError, match=r"not in canonical CSR order or contain duplicates"):
        g.validate()


def test_duplicate_edge():
    g = broken(indptr=torch.tensor([0, 2, 4, 6, 7]), indices=torch.tensor([1, 1, 0, 2, 1, 3, 2]))
    with pytest.raises(ValueError, match=r"not in canonical CSR order or contain duplicates"):
        g.validate()


@pytest.mark.parametrize("block", [1, 2, 3, 1 << 22])
def test_validation_in_edge_blocks(monkeypatch, block):
    """validate() checks edges in row blocks (bounded memory): the verdict must not depend on
    where the blocks split, including a duplicate or disorder right at a block boundary."""
    import quietgnn.graph as graph_mod
    monkeypatch.setattr(graph_mod, "_VALIDATE_BLOCK", block)
    path_graph(7).validate()
    cases = [(torch.tensor([0, 1, 4, 6, 7]), torch.tensor([1, 0, 1, 2, 1, 3, 2]), "self-loop"),
             (torch.tensor([0, 1, 3, 5, 6]), torch.tensor([1, 2, 0, 1, 3, 2]), "canonical"),
             (torch.tensor([0, 2, 4, 6, 7]), torch.tensor([1, 1, 0, 2, 1, 3, 2]), "canonical")]
    for indptr, indices, what in cases:
        with pytest.raises(ValueError, match=what):
            broken(indptr=indptr, indices=indices).validate()


def test_indptr_inconsistent():
    g = path_graph()
    with pytest.raises(ValueError, match=r"indptr\[0\] = 1, expected 0"):
        replace(g, indptr=torch.tensor([1, 1, 3, 5, 6])).validate()
    with pytest.raises(ValueError, match=r"indptr\[-1\] = 5 but there are 6 indices"):
        replace(g, indptr=torch.tensor([0, 1, 3, 5, 5])).validate()
    with pytest.raises(ValueError, match=r"indptr decreases at node 1 \(3 -> 2\)"):
        replace(g, indptr=torch.tensor([0, 3, 2, 5, 6])).validate()


# ---------------------------------------------------------------------- construction
def test_from_edge_index_drops_self_loops_and_duplicates():
    ei = torch.tensor([[0, 0, 1, 2, 2, 1], [1, 1, 1, 0, 2, 0]])  # dup 0->1, loops 1->1, 2->2
    g = Graph.from_edge_index(ei, torch.zeros(3, 1), torch.tensor([0, 1, 0]), undirected=False)
    assert sorted(map(tuple, g.edge_index().T.tolist())) == [(0, 1), (1, 0), (2, 0)]
    assert g.meta["undirected"] is False


def test_from_edge_index_symmetrises():
    ei = torch.tensor([[0, 2], [1, 1]])
    g = Graph.from_edge_index(ei, torch.zeros(3, 1), torch.tensor([0, 1, 0]))
    assert sorted(map(tuple, g.edge_index().T.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert g.is_undirected() and g.meta["undirected"] is True


def test_from_edge_index_keeps_direction():
    ei = torch.tensor([[0, 2], [1, 1]])
    g = Graph.from_edge_index(ei, torch.zeros(3, 1), torch.tensor([0, 1, 0]), undirected=False)
    assert g.edge_index().tolist() == [[0, 2], [1, 1]]
    assert not g.is_undirected()
    assert g.in_degree().tolist() == [0, 2, 0] and g.out_degree().tolist() == [1, 0, 1]


def test_from_edge_index_canonical_regardless_of_order():
    ei = torch.tensor([[3, 0, 2, 1], [0, 1, 3, 2]])
    x, y = torch.zeros(4, 1), torch.tensor([0, 1, 0, 1])
    a = Graph.from_edge_index(ei, x, y)
    b = Graph.from_edge_index(ei[:, torch.tensor([2, 0, 3, 1])], x, y)
    assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
    assert a.fingerprint() == b.fingerprint()


def test_from_edge_index_casts_float64_features_and_defaults():
    g = Graph.from_edge_index(torch.tensor([[0], [1]]), torch.zeros(10, 2, dtype=torch.float64),
                              torch.tensor([0, 1, 2] + [0] * 7))
    assert g.x.dtype == torch.float32 and g.num_classes == 3
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (6, 2, 2)


def test_csr_from_edges_sorted_unique():
    indptr, indices = csr_from_edges(torch.tensor([2, 0, 0, 1]), torch.tensor([1, 1, 1, 0]), 3)
    assert indptr.tolist() == [0, 1, 3, 3] and indices.tolist() == [1, 0, 2]


def test_random_split_seeded_and_disjoint():
    a, b = random_split(100, seed=1), random_split(100, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], random_split(100, seed=2)[0])
    assert [int(m.sum()) for m in a] == [60, 20, 20]
    assert int((a[0].int() + a[1].int() + a[2].int()).max()) == 1
    with pytest.raises(ValueError, match=r"split fractions \(0.5, 0.5, 0.5\)"):
        random_split(10, (0.5, 0.5, 0.5))


def test_with_split_validates():
    g = path_graph()
    with pytest.raises(ValueError, match="train_mask selects no node"):
        g.with_split(torch.zeros(4, dtype=torch.bool), g.val_mask, g.test_mask)


# ---------------------------------------------------------------------- PyG, fingerprints
def test_pyg_round_trip():
    g = path_graph(6)
    data = g.to_pyg()
    assert data.edge_index.shape == (2, g.num_edges) and data.num_nodes == 6
    back = Graph.from_pyg(data, name=g.name)
    for f in ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(back, f), getattr(g, f)), f
    assert back.num_classes == g.num_classes and back.fingerprint() == g.fingerprint()


def test_from_pyg_directed_input_is_symmetrised_and_2d_labels_squeezed():
    from torch_geometric.data import Data
    data = Data(x=torch.zeros(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]),
                y=torch.tensor([[0], [1], [1]]))
    g = Graph.from_pyg(data)
    assert g.is_undirected() and g.num_edges == 4 and g.y.tolist() == [0, 1, 1]


def test_fingerprint_stable_and_sensitive():
    g = path_graph(5)
    assert g.fingerprint() == path_graph(5).fingerprint()
    ei = g.edge_index()
    ei2 = torch.cat([ei, torch.tensor([[0, 4], [4, 0]])], dim=1)   # one more undirected edge
    g2 = Graph.from_edge_index(ei2, g.x, g.y, train_mask=g.train_mask, val_mask=g.val_mask,
                               test_mask=g.test_mask, num_classes=2)
    assert g2.fingerprint() != g.fingerprint()
    moved = g.edge_index().clone()
    moved[:, 0] = torch.tensor([2, 0])   # rewire 1 -> 0 into 2 -> 0
    g3 = Graph.from_edge_index(moved, g.x, g.y, train_mask=g.train_mask, val_mask=g.val_mask,
                               test_mask=g.test_mask, num_classes=2, undirected=False)
    assert g3.num_edges == g.num_edges and g3.fingerprint() != g.fingerprint()


def test_a_graph_without_nodes_or_edges():
    """No nodes: refused by name. No edges: a graph like any other (every halo empty)."""
    from quietgnn.partition import build_partitions, partition_nodes
    with pytest.raises(ValueError, match="has no nodes .*nothing to train on"):
        Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, 4),
                              torch.zeros(0, dtype=torch.int64), num_classes=2)
    g = Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.int64), torch.randn(30, 4),
                              torch.arange(30) % 3, num_classes=3)
    parts = build_partitions(g, partition_nodes(g, "random", 2, seed=0))
    assert [p.n_halo for p in parts] == [0, 0] and sum(p.n_own for p in parts) == 30


def test_help_shows_no_sphinx_markup(capsys):
    from quietgnn.cli import main
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--train.epochs" in out
    assert not any(role in out for role in (":attr:", ":meth:", ":class:", ":mod:", "``"))


# ---------------------------------------------------------------------- input checks (API)
def _ring(n: int = 40):
    """The operator trial's graph: a ring of n nodes, 6 random features, 3 classes."""
    torch.manual_seed(0)
    return (torch.stack([torch.arange(n), (torch.arange(n) + 1) % n]), torch.randn(n, 6),
            torch.arange(n) % 3)


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def test_float_labels_are_refused_not_cut_to_integers():
    """y = 0.7, 1.7, ... trained as 0, 1, 2 (cut by .to(int64)); NaN was a bare 'cannot convert
    float NaN to integer'; num_classes=3.7 was taken as 3. Whole-number floats are class ids,
    as the .npz loader takes them."""
    from torch_geometric.data import Data
    ei, x, y = _ring()
    for make in (lambda yy: Graph.from_pyg(Data(x=x, edge_index=ei, y=yy)),
                 lambda yy: Graph.from_edge_index(ei, x, yy)):
        with pytest.raises(ValueError) as e:
            make(y.float() + 0.7)
        msg = _one_line(e)
        assert "labels must be integer class ids" in msg and "found non-integer or NaN" in msg
        assert "first 0.7 at node 0" in msg and "y" in msg.split(":")[0]
        nan = y.float()
        nan[3] = float("nan")
        with pytest.raises(ValueError, match=r"y.*: labels must be integer class ids.*first nan "
                                             r"at node 3"):
            make(nan)
        assert make(y.float()).y.tolist() == y.tolist()          # 0.0, 1.0, 2.0: class ids
    with pytest.raises(ValueError, match=r"num_classes of graph 'graph' = 3.7; expected a whole "
                                         r"number of classes >= 2"):
        Graph.from_edge_index(ei, x, y, num_classes=3.7)
    assert Graph.from_edge_index(ei, x, y, num_classes=torch.tensor(4)).num_classes == 4


def test_some_masks_but_not_all_are_refused_naming_the_missing_ones():
    """A PyG Data with only train_mask lost it silently to a random 60/20/20 split;
    from_edge_index(train_mask=...) alone was 'Could not infer dtype of NoneType'."""
    from torch_geometric.data import Data
    ei, x, y = _ring()
    tr = torch.zeros(40, dtype=torch.bool)
    tr[:20] = True
    missing = r"has \['train_mask'\] but not \['val_mask', 'test_mask'\]; give all three masks"
    with pytest.raises(ValueError, match=r"^graph 'g': " + missing):
        Graph.from_pyg(Data(x=x, edge_index=ei, y=y, train_mask=tr), name="g")
    with pytest.raises(ValueError, match=r"^graph 'graph': " + missing):
        Graph.from_edge_index(ei, x, y, train_mask=tr)
    with pytest.raises(ValueError, match=r"has \['train_mask', 'test_mask'\] but not "
                                         r"\['val_mask'\]"):
        Graph.from_edge_index(ei, x, y, train_mask=tr, test_mask=~tr)


def test_pyg_data_without_x_gets_the_file_loaders_degree_features_and_without_y_is_refused():
    """No x was 'Could not infer dtype of NoneType', no y an AttributeError."""
    from torch_geometric.data import Data
    from quietgnn.datasets.files import degree_features
    ei, x, y = _ring()
    ei = torch.cat([ei, torch.tensor([[0, 0], [5, 9]])], 1)     # some degrees above 2
    g = Graph.from_pyg(Data(edge_index=ei, y=y))
    assert torch.equal(g.x, torch.from_numpy(degree_features(ei.numpy(), 40)))
    assert g.meta["features"] == "degree-buckets" and g.num_nodes == 40
    with pytest.raises(ValueError) as e:
        Graph.from_pyg(Data(x=x, edge_index=ei))
    assert "data.y (graph 'graph') is missing: node classification needs a class label" in \
        _one_line(e)


def test_feature_shapes_and_dtypes_from_the_api():
    """Zero-width x passed here and failed in every worker; bool x was refused while the
    files' integer features were taken; 1e300 in float64 became inf (value inf) with a numpy
    warning."""
    import warnings
    ei, x, y = _ring()
    with pytest.raises(ValueError, match=r"^x of graph 'graph': features have shape \(40, 0\), "
                                         r"expected \[N, F\] with F >= 1"):
        Graph.from_edge_index(ei, torch.zeros(40, 0), y)
    b = x > 0
    for given in (b, b.numpy(), b.long()):
        g = Graph.from_edge_index(ei, given, y)
        assert g.x.dtype == torch.float32 and torch.equal(g.x, b.float())
    big = x.double()
    big[2, 1] = 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"feature value 1e\+300 at node 2, feature 1 is "
                                             r"NaN/Inf or beyond float32's range"):
            Graph.from_edge_index(ei, big, y)


@pytest.mark.parametrize("case", ["one-hot", "all -1", "y short", "uint64"])
def test_label_shapes_and_negative_labels_are_named(case):
    """One-hot y was reported as 'y has shape (120,)'; all -1 labels as 'num_classes = 0'; a y
    two short as 'y has shape (38,)'."""
    ei, x, y = _ring()
    given, msg = {
        "one-hot": (torch.nn.functional.one_hot(y),
                    r"labels have shape \(40, 3\), 2-D \(one-hot.*y\.argmax\(1\)"),
        "all -1": (-torch.ones(40, dtype=torch.int64),
                   r"all 40 labels are negative \(e\.g\. -1\); negative labels are not class "
                   r"ids"),
        "y short": (y[:38], r"^y of graph 'graph': has 38 labels, expected 40, one per node: "
                            r"the number of nodes comes from x"),
        # wrapped by the int64 cast, it was named as -9223372036854775807
        "uint64": (np.full(40, 2**63 + 1, dtype=np.uint64), r"label 9223372036854775809 is "
                                                            r"not a class id"),
    }[case]
    with pytest.raises(ValueError, match=msg):
        Graph.from_edge_index(torch.tensor([[0], [1]]), x, given)


def test_masks_of_0_and_1_are_taken_and_other_values_refused():
    ei, x, y = _ring()
    tr, va = (torch.arange(40) < 20), (torch.arange(40) >= 30)
    te = ~(tr | va)
    g = Graph.from_edge_index(ei, x, y, train_mask=tr.long(), val_mask=va.float(),
                              test_mask=te.numpy().astype("uint8"))
    assert torch.equal(g.train_mask, tr) and torch.equal(g.test_mask, te)
    soft = tr.float() * 0.3
    with pytest.raises(ValueError, match=r"^train_mask of graph 'graph': mask holds 0\.3 at "
                                         r"node 0; expected a bool mask, or numbers that are all "
                                         r"0 or 1"):
        Graph.from_edge_index(ei, x, y, train_mask=soft, val_mask=va, test_mask=te)
