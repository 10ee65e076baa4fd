"""The model out of a run: model.json + weights-only model.pt, PyG conversion, `quietgnn predict`."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from helpers import small_graph
from quietgnn.cli import main as cli_main
from quietgnn.nn import GNN, SparseAdj
from quietgnn.nn.export import TrainedModel, load_model, save_model

KINDS = ["gcn", "sage", "gat", "gin"]


def _trained_like(arch: str, features: int, classes: int, layers: int = 2, norm: str = "none",
                  seed: int = 0) -> GNN:
    """A GNN with random (non-initial) weights, so that every parameter matters: biases and
    GIN's eps start at 0, where a wrong mapping would go unnoticed."""
    torch.manual_seed(seed)
    gnn = GNN(arch, features, 16, classes, layers=layers, norm=norm, heads=4)
    with torch.no_grad():
        for p in gnn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return gnn.eval()


@pytest.mark.parametrize("arch", KINDS)
@pytest.mark.parametrize("directed", [False, True])
def test_pyg_conversion_gives_the_same_outputs(arch, directed):
    g = small_graph(n=90, features=8, classes=3, seed=3, directed=directed)
    model = TrainedModel(_trained_like(arch, 8, 3, layers=3, norm="layer"))
    ours = model(g.x, g.edge_index())
    pyg = model.to_pyg()
    from torch_geometric import nn as pyg_nn
    want = {"gcn": pyg_nn.GCNConv, "sage": pyg_nn.SAGEConv, "gat": pyg_nn.GATConv,
            "gin": pyg_nn.GINConv}[arch]
    assert all(isinstance(c, want) for c in pyg.convs) and not pyg.training
    theirs = pyg(g.x, g.edge_index())
    assert ours.shape == (90, 3)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", KINDS)
def test_edge_index_input_is_the_training_block(arch):
    """model(x, edge_index) builds the block training uses (global in-degrees, no self-loops):
    self-loops and repeated edges in the input change nothing."""
    g = small_graph(n=70, features=8, classes=3, seed=5)
    gnn = _trained_like(arch, 8, 3)
    deg = g.in_degree()
    ref = gnn(g.x, SparseAdj(g.indptr, g.indices, g.num_nodes, deg, deg))
    ei = g.edge_index()
    noisy = torch.cat([ei, ei[:, :20], torch.arange(10).repeat(2, 1)], dim=1)
    torch.testing.assert_close(TrainedModel(gnn)(g.x, noisy), ref)


def test_saved_model_loads_back_equal(tmp_path):
    g = small_graph(n=60, features=8, classes=3, seed=1)
    gnn = _trained_like("sage", 8, 3, layers=3, norm="layer")
    save_model(tmp_path, gnn.spec(), gnn.state_dict(), {"epoch": 4, "val_acc": 0.5})
    m = load_model(tmp_path)
    assert m.info["epoch"] == 4 and json.loads((tmp_path / "model.json").read_text())["spec"] == \
        gnn.spec()
    torch.testing.assert_close(m(g.x, g.edge_index()), TrainedModel(gnn)(g.x, g.edge_index()))
    assert m.embed(g.x, g.edge_index()).shape == (60, 16)


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_the_model_api_refuses_features_holding_nan_or_inf(value):
    """`predict_proba`, `embed` and the model itself returned NaN for the node and spread it
    to its neighbours without a word (`quietgnn predict` refuses such a graph at load)."""
    g = small_graph(n=30, features=8, classes=3, seed=1)
    m = TrainedModel(_trained_like("gcn", 8, 3))
    x = g.x.clone()
    x[7, 2] = value
    for call in (m, m.predict_proba, m.embed):
        with pytest.raises(ValueError, match=r"x holds NaN/Inf values \(first in node 7\)"):
            call(x, g.edge_index())
    assert torch.isfinite(m.predict_proba(g.x, g.edge_index())).all()


class _Payload:
    """Unpickling this would create ``path``: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_model_pt_refuses_anything_but_weights(tmp_path):
    gnn = _trained_like("gcn", 8, 3)
    save_model(tmp_path, gnn.spec(), gnn.state_dict(), {})
    marker = tmp_path / "pwned"
    torch.save({"convs.0.lin.weight": _Payload(str(marker))}, tmp_path / "model.pt")
    with pytest.raises(ValueError) as ei:
        load_model(tmp_path)
    msg = str(ei.value)
    assert "model.pt" in msg and "never unpickles" in msg and "\n" not in msg
    assert not marker.exists()
    # weights of another architecture: named, not a shape traceback
    other = _trained_like("gcn", 8, 5)
    torch.save(other.state_dict(), tmp_path / "model.pt")
    with pytest.raises(ValueError, match="do not fit"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="holds no trained model"):
        load_model(tmp_path / "nowhere")


def test_predict_cli_writes_probabilities_and_embeddings(tmp_path, capsys):
    g = small_graph(n=80, features=8, classes=3, seed=2)
    data = g.save(tmp_path / "g.npz")
    run = tmp_path / "run"
    run.mkdir()
    gnn = _trained_like("gcn", 8, 3)
    save_model(run, gnn.spec(), gnn.state_dict(), {})
    out = tmp_path / "p.npy"
    assert cli_main(["predict", "--run", str(run), "--dataset", str(data), "--out",
                     str(out)]) == 0
    said = capsys.readouterr().out      # what the file holds, said where it is written
    assert "class probabilities (3 classes per node" in said and "for 80 nodes" in said
    assert "node order" in said
    p = np.load(out)
    assert p.shape == (80, 3) and np.allclose(p.sum(1), 1.0, atol=1e-5) and (p >= 0).all()
    want = torch.softmax(TrainedModel(gnn)(g.x, g.edge_index()), -1).detach().numpy()
    assert np.allclose(p, want, atol=1e-6)
    assert cli_main(["predict", "--run", str(run), "--dataset", str(data), "--embed",
                     "--out", str(tmp_path / "e.parquet")]) == 0
    said = capsys.readouterr().out
    assert "the last hidden layer (16 values per node)" in said and "node, then h0..h15" in said
    import pyarrow.parquet as pq
    t = pq.read_table(tmp_path / "e.parquet")
    assert t.num_rows == 80 and t.column_names == ["node"] + [f"h{j}" for j in range(16)]
    assert cli_main(["predict", "--run", str(run), "--dataset", str(data)]) == 0
    assert np.load(run / "predict-g.npy").shape == (80, 3)
    capsys.readouterr()
    assert cli_main(["predict", "--run", str(run), "--dataset", str(data), "--out",
                     str(tmp_path / "p.csv")]) == 2
    assert ".npy or .parquet" in capsys.readouterr().err
    wide = small_graph(n=50, features=12, classes=3).save(tmp_path / "wide.npz")
    assert cli_main(["predict", "--run", str(run), "--dataset", str(wide)]) == 2
    assert "[num_nodes, 8]" in capsys.readouterr().err


@pytest.mark.parametrize("strategy,extra", [
    ("tma", {"options": {"period_steps": 5}}),          # rank 0's average is what it scores
    ("retexo", {}),                                     # the stack of the layers' best
])
def test_the_saved_model_is_the_one_the_run_scored(tmp_path, strategy, extra):
    """Loaded on the whole graph, the saved model scores the test accuracy the run reported at
    its best-validation epoch (these strategies evaluate exactly, on the whole graph)."""
    import quietgnn
    g = small_graph(n=240, features=8, classes=3, seed=4)
    run = quietgnn.train(g, strategy=strategy, parts=2, epochs=8, model="sage",
                         out=str(tmp_path), **{"runtime.progress": False}, **extra)
    info = json.loads((run.run_dir / "model.json").read_text())
    assert info["selected"] == "best_val" and info["strategy"] == strategy
    pred = run.model(g.x, g.edge_index()).argmax(-1)
    m = g.test_mask
    acc = float((pred[m] == g.y[m]).float().mean())
    assert abs(acc - info["test_acc"]) <= 1.0 / int(m.sum()) + 1e-9
    if strategy == "tma":   # every epoch evaluates the whole model: the summary's best is it
        assert info["epoch"] == run.summary.best_epoch
        assert info["test_acc"] == run.summary.test_acc
    else:                   # retexo: from the last layer's rounds on (epochs 4..7)
        assert 4 <= info["epoch"] <= 7


def test_a_model_too_large_or_a_lying_spec_is_refused_before_allocating(tmp_path):
    """An absurd width (a typo, an edited model.json) is named before torch tries to allocate
    it, or overflows trying."""
    with pytest.raises(ValueError, match=r"model.hidden = 99999999999999999999: .* GiB "
                                         r"available here; lower model.hidden"):
        GNN("gcn", 1433, 99999999999999999999, 7)
    gnn = _trained_like("gcn", 8, 3)
    save_model(tmp_path, gnn.spec(), gnn.state_dict(), {})
    meta = json.loads((tmp_path / "model.json").read_text())
    for key, value, named in (("hidden", -1, "model.hidden = -1"),
                              ("hidden", 2 * 10**12, "model.hidden = 2000000000000"),
                              ("in_dim", "8", "spec.in_dim = '8'")):
        bad = json.loads(json.dumps(meta))
        bad["spec"][key] = value
        (tmp_path / "model.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not a model description") as ei:
            load_model(tmp_path)
        assert named in str(ei.value) and "\n" not in str(ei.value)
    (tmp_path / "model.json").write_text(json.dumps({**meta, "spec": ["gcn"]}))
    with pytest.raises(ValueError, match="spec is list, expected a mapping"):
        load_model(tmp_path)


def test_training_counts_four_copies_on_every_local_rank_and_names_the_width(monkeypatch):
    """One copy of the weights was compared with the memory available, though training holds
    four (weights, gradients, two Adam moments) on every rank of the host: a model a quarter
    of the memory passed, then each rank allocated until the kernel killed it. A million
    layers passed too (a million tiny modules built first)."""
    from quietgnn.nn.model import MAX_LAYERS, ModelConfig, build_model, check_model_fits
    monkeypatch.setattr("quietgnn.heap.mem_available_mb", lambda: 1000.0)
    weights_mb = (64 * 10**6 + 10**6 * 8) * 4 / 2**20           # 275 MiB: one copy fits
    assert weights_mb < 1000 < 4 * weights_mb
    check_model_fits("gcn", 64, 10**6, 8, 2)                   # holding it (predict) is fine
    with pytest.raises(ValueError, match=r"^model.hidden = 1000000: .*4 copies\), on each of "
                                         r"the 2 ranks of this host, needs 2.15 GiB, more than "
                                         r"the 0.977 GiB available here; lower model.hidden$"):
        check_model_fits("gcn", 64, 10**6, 8, 2, copies=4, ranks=2)
    # a worker counts its own four copies (the launcher counted the host's ranks), one on a
    # GPU, whose copies are not in host memory
    with pytest.raises(ValueError, match=r"model.hidden = 1000000: .*4 copies\) needs 1.07 GiB"):
        build_model(ModelConfig(hidden=10**6), 64, 8, seed=0)
    monkeypatch.setattr("quietgnn.nn.model.GNN", lambda *a: "built")
    assert build_model(ModelConfig(hidden=10**6), 64, 8, seed=0, copies=1) == "built"
    # the message blames the width that is absurd: classes (labels that are no class ids),
    # input features, or hidden with layers
    for args, named in ((("gcn", 64, 16, 10**9, 2), "1000000000 classes (the model's output "
                                                      "width)"),
                        (("gcn", 10**9, 16, 8, 3), "1000000000 input features"),
                        (("sage", 64, 10**4, 8, 900), "model.hidden = 10000 with model.layers "
                                                      "= 900"),
                        (("gcn", 10**9, 16, 8, 1), "1000000000 input features")):
        with pytest.raises(ValueError) as ei:
            check_model_fits(*args)
        assert str(ei.value).startswith(named + ":"), str(ei.value)
    assert "labels must be class ids 0..C-1" in str(pytest.raises(
        ValueError, check_model_fits, "gcn", 64, 16, 10**9, 2).value)
    for build in (lambda: ModelConfig(layers=10**6), lambda: GNN("gcn", 8, 16, 3, layers=10**6)):
        with pytest.raises(ValueError, match=rf"^model.layers = 1000000; expected at most "
                                             rf"{MAX_LAYERS} .*: lower model.layers$"):
            build()


def test_a_model_that_cannot_be_written_is_named_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """A full disk at the end of a run: the error names the file and the reason, in one line
    the launcher shows as is (errors.is_explained), and no temporary file is left."""
    import errno

    from quietgnn.errors import is_explained
    gnn = _trained_like("gcn", 8, 3)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as ei:
        save_model(tmp_path, gnn.spec(), gnn.state_dict(), {})
    assert f"could not write {str(tmp_path / 'model.pt')!r}: No space left on device" in \
        str(ei.value)
    assert is_explained(ei.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
