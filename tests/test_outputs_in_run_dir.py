"""What `quietgnn predict` and `quietgnn report` write into a run directory: never through a
symbolic link planted there (docs/reliability.md), and what `predict` reads from it (the model's
files) neither. In process, on a run directory made by `save_model` (no training)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from helpers import small_graph
from quietgnn.analysis import report
from quietgnn.cli import main as cli_main
from quietgnn.nn import GNN
from quietgnn.nn.export import save_model


@pytest.fixture
def run(tmp_path):
    """A run directory holding a model of 8 features and 3 classes, a graph file to predict on
    and a file an attacker would like overwritten."""
    torch.manual_seed(0)
    gnn = GNN("gcn", 8, 16, 3)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_model(run_dir, gnn.spec(), gnn.state_dict(), {})
    data = small_graph(n=40, features=8, classes=3, seed=2).save(tmp_path / "g.npz")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return run_dir, data, victim


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_predict_refuses_a_link_planted_on_its_way_and_writes_through_none(run, tmp_path,
                                                                          capsys):
    run_dir, data, victim = run
    (run_dir / "predict-g.npy").symlink_to(victim)                    # the default file
    assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{str(run_dir / 'predict-g.npy')!r} -> {str(victim)!r} is a symbolic link" in err
    assert "remove the link, or pass --out a file outside the run directory" in err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "out").symlink_to(elsewhere)                           # a folder on the way
    for out in (run_dir / "predict-g.npy", run_dir / "out" / "p.parquet",
                run_dir / "out" / "deeper" / "p.npy"):
        assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data),
                         "--out", str(out)]) == 2
        assert "is a symbolic link inside" in _one_line(capsys.readouterr().err)
    assert victim.read_text() == "precious" and list(elsewhere.iterdir()) == []
    # the link removed: written there as a regular file, in one piece (no temporary left)
    (run_dir / "predict-g.npy").unlink()
    assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data)]) == 0
    assert not (run_dir / "predict-g.npy").is_symlink()
    assert np.load(run_dir / "predict-g.npy").shape == (40, 3)
    assert not [p for p in os.listdir(run_dir) if ".tmp-" in p]
    # a path the user chose outside the run directory may be a link they made: followed
    mine = tmp_path / "mine.npy"
    mine.symlink_to(tmp_path / "target.npy")
    assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data), "--out",
                     str(mine)]) == 0
    assert np.load(tmp_path / "target.npy").shape == (40, 3)


@pytest.mark.parametrize("name", ["model.pt", "model.json"])
def test_predict_refuses_model_files_that_are_links_or_fifos(run, tmp_path, capsys, name):
    """A model file replaced by a link (to the same bytes elsewhere, or to anything) is not
    read; nor a FIFO, which would block the read forever."""
    run_dir, data, _ = run
    real = tmp_path / f"real-{name}"
    os.replace(run_dir / name, real)
    (run_dir / name).symlink_to(real)
    assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{str(run_dir / name)!r} -> {str(real)!r} is a symbolic link" in err
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    assert cli_main(["predict", "--run", str(run_dir), "--dataset", str(data)]) == 2
    assert "is not a regular file (a FIFO or a device)" in _one_line(capsys.readouterr().err)


def test_a_link_at_the_temporary_name_is_replaced_not_followed(tmp_path):
    """The temporary file is made anew under a name nobody can know in advance (O_EXCL, no
    link followed): a link or a folder planted at the name it once had (pid only) neither
    leads the write elsewhere nor stops it."""
    from quietgnn.safefiles import write_below
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    root = tmp_path / "run"
    root.mkdir()
    (root / f".p.npy.tmp-{os.getpid()}").symlink_to(victim)
    (root / f".q.npy.tmp-{os.getpid()}").mkdir()
    for name in ("p.npy", "q.npy"):
        with write_below(root, [name]) as f:
            f.write(b"data")
        assert (root / name).read_bytes() == b"data"
    assert victim.read_text() == "precious"
    assert sorted(os.listdir(root)) == sorted([f".p.npy.tmp-{os.getpid()}",
                                               f".q.npy.tmp-{os.getpid()}", "p.npy", "q.npy"])


def _summary_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(
        {"strategy": "halo", "dataset": "d", "parts": 2, "model": "gcn", "seed": 0,
         "test_acc": 0.5, "epochs": 2}))
    return run_dir


def test_report_refuses_a_link_planted_in_the_run_directory(tmp_path, capsys):
    run_dir = _summary_run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "report").symlink_to(elsewhere)
    assert report.cli_main([str(run_dir), "--no-plots"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{str(run_dir / 'report')!r} -> {str(elsewhere)!r} is a symbolic link" in err
    # the run passed as the reference, the report's --out inside it: the same
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "s.json").write_text((run_dir / "summary.json").read_text())
    assert report.cli_main([str(tmp_path / "o" / "s.json"), "--reference", str(run_dir),
                            "--out", str(run_dir / "report"), "--no-plots"]) == 2
    assert "is a symbolic link inside" in _one_line(capsys.readouterr().err)
    assert list(elsewhere.iterdir()) == []
    (run_dir / "report").unlink()
    (run_dir / "report").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run_dir / "report" / "report.json").symlink_to(victim)          # a file there
    assert report.cli_main([str(run_dir), "--no-plots"]) == 2
    assert "report.json' -> " in _one_line(capsys.readouterr().err)
    assert victim.read_text() == "precious"
    (run_dir / "report" / "report.json").unlink()
    assert report.cli_main([str(run_dir), "--no-plots"]) == 0
    assert json.loads((run_dir / "report" / "report.json").read_text())["groups"]
    # --out a folder of the user's own, itself a link they made: followed
    (tmp_path / "mine").symlink_to(elsewhere)
    capsys.readouterr()
    assert report.cli_main([str(run_dir), "--no-plots", "--out", str(tmp_path / "mine")]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["report.json", "report.md"]
    # a summary file's folder is no run's: --out there may be the user's own link too
    bigger = tmp_path / "bigger"
    bigger.mkdir()
    (tmp_path / "o" / "out").symlink_to(bigger)
    assert report.cli_main([str(tmp_path / "o" / "s.json"), "--no-plots", "--out",
                            str(tmp_path / "o" / "out" / "rep")]) == 0
    assert (bigger / "rep" / "report.md").is_file()
