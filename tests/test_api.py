"""The Python API: the README's example, training from memory, predicting on unseen graphs."""

from __future__ import annotations

import json
import re

import pytest
import torch

import quietgnn
from helpers import REPO, small_graph
from quietgnn.api import _config_dict
from quietgnn.config import load_config
from quietgnn.graph import Graph


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert m, "README's Python API section has no ```python block"
    return m.group(1)


def test_the_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)       # its runs/ go here
    scope: dict = {}
    exec(compile(_readme_example(), "README.md", "exec"), scope)
    run = scope["run"]
    assert run.run_dir.is_dir() and run.summary.parts == 2 and len(run.metrics) == 10
    assert (run.run_dir / "model.pt").is_file() and scope["proba"].shape == (300, 8)


def test_api_exports():
    assert set(quietgnn.__all__) >= {"Graph", "load_dataset", "train", "load_model", "Run"}
    for name in quietgnn.__all__:
        assert hasattr(quietgnn, name), name


def test_graph_round_trips_through_pyg_and_npz(tmp_path):
    g = small_graph(n=50, seed=7)
    back = Graph.from_pyg(g.to_pyg(), name=g.name)
    assert back.fingerprint() == g.fingerprint() and torch.equal(back.x, g.x)
    loaded = quietgnn.load_dataset(str(g.save(tmp_path / "mine.npz")))
    assert loaded.fingerprint() == g.fingerprint() and torch.equal(loaded.x, g.x)
    assert loaded.name == "mine" and loaded.num_classes == g.num_classes
    with pytest.raises(ValueError, match="directed"):
        small_graph(n=50, directed=True).save(tmp_path / "d.npz")
    with pytest.raises(ValueError, match=r"\.npz"):
        g.save(tmp_path / "mine.pt")


def test_overrides_use_the_clis_keys():
    cfg = load_config(None, _config_dict("tma", 2, {
        "epochs": 7, "model": {"hidden": 24}, "model.layers": 3, "options": {"period_steps": 3, "fanouts": 10},
        "summary_json": "s.json", "lr": "0.05"}))
    assert (cfg.strategy, cfg.num_parts, cfg.train.epochs, cfg.model.hidden, cfg.model.layers,
            cfg.options.period_steps, cfg.runtime.summary_json, cfg.train.lr) == \
        ("tma", 2, 7, 24, 3, 3, "s.json", 0.05)
    assert load_config(None, _config_dict("halo", None, {"model": "sage"})).model.arch == "sage"


@pytest.mark.parametrize("overrides,message", [
    ({"model.hiden": 3}, "unknown key(s) ['model.hiden']; valid keys in 'model'"),
    ({"model": {"hiden": 3}}, "unknown key(s) ['model.hiden']; valid keys in 'model'"),
    ({"options": {"bitz": 4}}, "unknown option(s) ['bitz'] for strategy 'halo'"),
    ({"epochs": "many"}, "train.epochs = 'many' (str); expected an integer"),
    ({"modle": {"hidden": 3}}, "unknown config section(s) ['modle']"),
])
def test_unknown_keys_get_the_clis_error_before_anything_runs(tmp_path, overrides, message):
    with pytest.raises(ValueError) as ei:
        quietgnn.train(small_graph(n=40), parts=2, out=str(tmp_path / "runs"), **overrides)
    assert message in str(ei.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_bad_data_is_named(tmp_path):
    with pytest.raises(TypeError, match="expected a quietgnn Graph"):
        quietgnn.train(42, out=str(tmp_path))
    with pytest.raises(ValueError, match="the graph is the data argument"):
        quietgnn.train(small_graph(n=40), dataset="cora", out=str(tmp_path))
    # refused before launch (the file does not load): no empty run directory, no --out
    with pytest.raises(ValueError, match="not found"):
        quietgnn.train(str(tmp_path / "nosuch.npz"), out=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_trained_model_predicts_on_a_graph_it_never_saw(tmp_path):
    """Trained from a PyG Data on one synthetic graph, the model classifies another one (other
    seed, other size: the same feature-label relation) far above chance, and permuting that
    graph's node ids permutes its predictions."""
    seen = small_graph(n=300, features=8, classes=3, seed=0)
    run = quietgnn.train(seen.to_pyg(), strategy="halo", parts=2, epochs=30, model="sage",
                         out=str(tmp_path), **{"runtime.progress": False})
    assert [r.epoch for r in run.metrics] == list(range(30))
    info = json.loads((run.run_dir / "model.json").read_text())
    assert info["epoch"] == run.summary.best_epoch and info["test_acc"] == \
        run.summary.test_acc
    model = quietgnn.load_model(run.run_dir)
    assert isinstance(model, torch.nn.Module) and not model.training
    # on the graph it was trained on, the saved weights score what the run reported
    pred = model(seen.x, seen.edge_index()).argmax(-1)
    m = seen.test_mask
    assert abs(float((pred[m] == seen.y[m]).float().mean()) - run.summary.test_acc) <= \
        1.0 / int(m.sum()) + 1e-9
    unseen = small_graph(n=200, features=8, classes=3, seed=1)
    proba = model.predict_proba(unseen.x, unseen.edge_index())
    assert proba.shape == (200, 3) and torch.allclose(proba.sum(1), torch.ones(200))
    acc = float((proba.argmax(-1) == unseen.y).float().mean())
    # well above chance (1/3); the exact figure moves with which epoch validation selects
    assert acc > 0.5, f"accuracy {acc:.3f} on an unseen graph of the same kind (chance 0.33)"
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    inv = torch.argsort(perm)
    p2 = model.predict_proba(unseen.x[perm], inv[unseen.edge_index()])
    torch.testing.assert_close(p2, proba[perm])


def test_train_from_a_prepared_directory(tmp_path):
    """A `quietgnn prepare` directory as data: its parts, its partitioner, its graph."""
    from quietgnn.partition import make_book
    g = small_graph(n=120, features=8, classes=3, seed=2)
    make_book(tmp_path / "prep", g, "metis", 2)
    run = quietgnn.train(str(tmp_path / "prep"), epochs=3, out=str(tmp_path / "runs"),
                         **{"runtime.progress": False})
    assert run.summary.parts == 2 and run.summary.partitioner == "metis"
    assert run.model(g.x, g.edge_index()).shape == (120, 3)
    with pytest.raises(ValueError, match="prepared with 2 parts"):
        quietgnn.train(str(tmp_path / "prep"), parts=3, out=str(tmp_path / "runs"))


def test_a_section_given_as_something_else_than_a_mapping_is_named():
    """train(options=[1, 2]) said 'unknown config key options', though options is a section."""
    with pytest.raises(ValueError, match=r"^train\(options=\[1, 2\]\): expected the section as "
                                         r"a mapping of its keys \(options=\{...\}\), got list"):
        quietgnn.train("synthetic", options=[1, 2])
    with pytest.raises(ValueError, match=r"^train\(model=5\): expected a string \(model= sets "
                                         r"model.arch\) or the section as a mapping"):
        quietgnn.train("synthetic", model=5)


def test_pyg_data_the_graph_cannot_hold_is_refused_before_a_run_directory(tmp_path):
    """The operator trial: train(Data(y=y.float() + 0.7)) trained on labels cut to 0, 1, 2;
    a Data with only train_mask trained on a random split instead; without y it was an
    AttributeError. Each is one ValueError line now, and nothing is written."""
    from torch_geometric.data import Data
    n = 40
    x, y = torch.randn(n, 6), torch.arange(n) % 3
    ei = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    out = tmp_path / "runs"
    for data, needle in (
            (Data(x=x, edge_index=ei, y=y.float() + 0.7), "labels must be integer class ids"),
            (Data(x=x, edge_index=ei, y=y, train_mask=y == 0),
             "but not ['val_mask', 'test_mask']; give all three masks or none"),
            (Data(x=x, edge_index=ei), "data.y (graph 'graph') is missing")):
        with pytest.raises(ValueError) as e:
            quietgnn.train(data, strategy="halo", parts=2, epochs=2, out=str(out),
                           overwrite=True)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not out.exists()
