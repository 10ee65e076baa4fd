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
