"""`quietgnn predict` on a run directory whose model or config is not what a run wrote, and on
the run's own synthetic graph. In process, on a run directory made by `save_model`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import small_graph
from quietgnn.cli import main as cli_main
from quietgnn.nn import GNN
from quietgnn.nn.export import load_model, save_model


def _err(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_holding_nan_or_inf_are_refused_at_load(tmp_path, capsys, value):
    """All-NaN predictions were written with exit 0."""
    torch.manual_seed(0)
    gnn = GNN("gcn", 8, 16, 3)
    state = gnn.state_dict()
    state["convs.1.bias"][1] = value
    save_model(tmp_path, gnn.spec(), state, {})
    with pytest.raises(ValueError, match=r"model.pt' hold NaN/Inf values \(in 'convs.1.bias'\)"):
        load_model(tmp_path)
    data = small_graph(n=30, features=8, classes=3).save(tmp_path / "g.npz")
    out = tmp_path / "p.npy"
    assert cli_main(["predict", "--run", str(tmp_path), "--dataset", str(data), "--out",
                     str(out)]) == 2
    assert "every prediction would be NaN" in _err(capsys) and not out.exists()
    state["convs.1.bias"][1] = 0.0
    save_model(tmp_path, gnn.spec(), state, {})
    assert cli_main(["predict", "--run", str(tmp_path), "--dataset", str(data), "--out",
                     str(out)]) == 0
    assert np.isfinite(np.load(out)).all()


def test_predict_on_synthetic_is_the_run_s_own_graph_unless_options_say_otherwise(tmp_path,
                                                                                  capsys):
    """`--dataset synthetic` predicted on the default graph (20000 nodes), whatever the run
    trained on, and took no synthetic.* options: now the run's graph as config.json records
    it, or the one the options build; widths other than the model's are refused by name."""
    import json

    from quietgnn.datasets import load_dataset
    from quietgnn.nn.export import TrainedModel
    torch.manual_seed(0)
    gnn = GNN("gcn", 8, 16, 3)
    run = tmp_path / "run"
    run.mkdir()
    save_model(run, gnn.spec(), gnn.state_dict(), {"dataset": "synthetic"})
    mine = {"nodes": 150, "classes": 3, "feature_dim": 8, "avg_degree": 4.0, "seed": 3}
    cfg = {"dataset": {"name": "synthetic"}, "synthetic": mine}
    (run / "config.json").write_text(json.dumps(cfg))

    def predict(*extra):
        return cli_main(["predict", "--run", str(run), "--dataset", "synthetic", *extra])
    assert predict() == 0
    got = np.load(run / "predict-synthetic.npy")
    g = load_dataset("synthetic", synthetic=mine)
    want = TrainedModel(gnn).predict_proba(g.x, g.edge_index()).numpy()
    assert got.shape == (150, 3) and np.allclose(got, want, atol=1e-6)
    # options build the graph as train would from them
    assert predict("--synthetic.nodes", "90", "--synthetic.classes", "3",
                   "--synthetic.feature_dim=8") == 0
    assert np.load(run / "predict-synthetic.npy").shape == (90, 3)
    capsys.readouterr()
    for extra, says in (
            (["--synthetic.feature_dim", "16", "--synthetic.classes", "3"],
             "from your --synthetic.* options has 16 features and 3 classes; the run's model "
             "takes 8 features and gives 3 classes: set --synthetic.feature_dim 8"),
            (["--synthetic.nodes", "abc"], "synthetic.nodes = 'abc' (str); expected an "
                                           "integer"),
            (["--synthetic.nodes", "90", "stray"], "unexpected argument(s)")):
        assert predict(*extra) == 2
        assert says in _err(capsys)
    assert cli_main(["predict", "--run", str(run), "--dataset", "g.npz",
                     "--synthetic.nodes", "90"]) == 2
    assert "but --dataset is 'g.npz': leave them out" in _err(capsys)
    # a run on another dataset: the default synthetic graph is not its width
    (run / "config.json").write_text(json.dumps({**cfg, "dataset": {"name": "cora"}}))
    assert predict() == 2
    assert "from the defaults has 64 features and 8 classes; the run's model takes 8 " \
        "features and gives 3 classes: predict on the dataset it trained on ('cora')" in \
        _err(capsys)
    # which synthetic graph the run trained on is unknown without its config.json
    (run / "config.json").unlink()
    assert predict() == 2
    assert "config.json', which records which one, is missing" in _err(capsys)
    (run / "config.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(cfg))
    assert predict() == 2
    assert "config.json' -> " in _err(capsys)


def _saved_run(tmp_path):
    torch.manual_seed(0)
    gnn = GNN("gcn", 8, 16, 3)
    run = tmp_path / "run"
    run.mkdir()
    save_model(run, gnn.spec(), gnn.state_dict(), {})
    return run, small_graph(n=30, features=8, classes=3).save(tmp_path / "g.npz")


def test_an_existing_out_file_is_kept_unless_overwrite(tmp_path, capsys):
    """`predict --out` replaced any file without a word (the graph's own labels file in the
    trial); the default file in the run directory is predict's own and is replaced."""
    run, data = _saved_run(tmp_path)
    theirs = tmp_path / "g.labels.npy"
    np.save(theirs, np.arange(30))
    args = ["predict", "--run", str(run), "--dataset", str(data), "--out", str(theirs)]
    assert cli_main(args) == 2
    assert "exists: pass --overwrite" in _err(capsys)
    assert (np.load(theirs) == np.arange(30)).all()
    assert cli_main(args + ["--overwrite"]) == 0 and np.load(theirs).shape == (30, 3)
    for _ in range(2):     # the default file, twice
        assert cli_main(args[:5]) == 0
    assert (run / "predict-g.npy").is_file()


def test_a_failed_write_keeps_the_old_file_whole_and_names_a_full_disk(tmp_path, capsys,
                                                                        monkeypatch):
    """On a full disk numpy's short write ('12800 requested and 10208 written') came out raw
    and left the previous good file half-written."""
    import quietgnn.api as api
    run, data = _saved_run(tmp_path)
    out = tmp_path / "pred.npy"
    args = ["predict", "--run", str(run), "--dataset", str(data), "--out", str(out)]
    assert cli_main(args) == 0
    good = out.read_bytes()

    def short_write(f, arr, suffix, embed):
        f.write(b"\x93NUMPY partial")
        raise OSError("12800 requested and 10208 written")

    monkeypatch.setattr(api, "_write_array", short_write)
    assert cli_main(args + ["--overwrite", "--embed"]) == 1
    line = _err(capsys)
    assert f"could not write '{out}': No space left on device;" in line and "free there" in line
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.npz", "pred.npy", "run"]


def test_predict_needs_no_labels_or_split(tmp_path, capsys):
    """A graph to predict on was refused without labels, with -1 labels, or with an empty or
    overlapping split, none of which predict uses: now its edges and features are read alone,
    and the probabilities equal those of the same graph with labels."""
    run, data = _saved_run(tmp_path)
    g = small_graph(n=30, features=8, classes=3)
    ei = g.edge_index().numpy()
    want = tmp_path / "want.npy"
    assert cli_main(["predict", "--run", str(run), "--dataset", str(data), "--out",
                     str(want)]) == 0
    variants = {"nolabels.npz": dict(edge_index=ei, x=g.x.numpy()),
                "minus1.npz": dict(edge_index=ei, x=g.x.numpy(), y=np.full(30, -1)),
                "overlap.npz": dict(edge_index=ei, x=g.x.numpy(), y=g.y.numpy(),
                                    train_mask=np.ones(30, bool), val_mask=np.ones(30, bool),
                                    test_mask=np.zeros(30, bool))}
    for name, arrays in variants.items():
        np.savez(tmp_path / name, **arrays)
        out = tmp_path / f"{name}.npy"
        assert cli_main(["predict", "--run", str(run), "--dataset", str(tmp_path / name),
                         "--out", str(out)]) == 0, capsys.readouterr().err
        np.testing.assert_allclose(np.load(out), np.load(want), rtol=1e-5, atol=1e-6)
    # an edge list without its labels file, features beside it
    np.savetxt(tmp_path / "el.txt", ei.T, fmt="%d")
    np.save(tmp_path / "el.features.npy", g.x.numpy())
    out = tmp_path / "el.npy"
    assert cli_main(["predict", "--run", str(run), "--dataset", str(tmp_path / "el.txt"),
                     "--out", str(out)]) == 0, capsys.readouterr().err
    np.testing.assert_allclose(np.load(out), np.load(want), rtol=1e-5, atol=1e-6)
    # training still needs the labels, and a graph loaded without them is never trained on
    import quietgnn
    from quietgnn.datasets import load_dataset
    with pytest.raises(ValueError, match="missing key 'y'"):
        load_dataset(str(tmp_path / "nolabels.npz"))
    blind = load_dataset(str(tmp_path / "minus1.npz"), labels=False)
    with pytest.raises(ValueError, match="was loaded without its labels .* training needs"):
        quietgnn.train(blind, parts=1, epochs=1, out=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="was loaded without its labels .* cannot be saved"):
        blind.save(tmp_path / "again.npz")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "again.npz").exists()


def test_a_prepared_directory_given_as_a_dataset_is_named_as_such(tmp_path, capsys):
    """`predict --dataset <prepared dir>` (or `train --dataset` of one) said 'unknown
    dataset' and listed the built-in names."""
    run, data = _saved_run(tmp_path)
    prep = tmp_path / "prep"
    assert cli_main(["prepare", "--dataset", str(data), "--parts", "2", "--partitioner",
                     "random", "--out", str(prep)]) == 0
    capsys.readouterr()
    assert cli_main(["predict", "--run", str(run), "--dataset", str(prep)]) == 2
    line = _err(capsys)
    assert "is a prepared graph (it holds book.json)" in line and f"--data {prep}" in line
