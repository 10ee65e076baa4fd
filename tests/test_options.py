"""Discoverable options: ``train --help`` generated from the config dataclasses,
``strategies NAME``, ``config`` (a recipe that round-trips), ``--version``, ``report RUN_DIR``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

import quietgnn
from quietgnn import cli, config
from quietgnn.confdoc import field_docs
from quietgnn.datasets.synthetic import SyntheticSpec
from quietgnn.strategies import available_strategies
from quietgnn.strategies.base import TrainConfig


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:          # argparse's --help / --version
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@dataclass
class _TrainWithWarmup(TrainConfig):
    #: epochs of linear learning-rate warm-up (a key no CLI code knows about)
    warmup_epochs: int = 7


def test_every_config_and_strategy_field_has_a_meaning():
    classes = list(config.SECTIONS.values()) + [SyntheticSpec] + \
        [c.Options for c in available_strategies().values()]
    for cls in classes:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__qualname__}: no '#:' or trailing comment for {missing}"


def test_train_help_lists_every_section_key_default_and_meaning(capsys):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0
    for section in ("dataset", "synthetic", "partition", "model", "train", "runtime", "options"):
        assert f"\n{section}:" in out, section
    lines = out.splitlines()
    hidden = next(x for x in lines if "--model.hidden" in x)
    assert "(--hidden)" in hidden and " 64 " in hidden and "width of the hidden layers" in hidden
    assert any("--runtime.timeout_s" in x and "120.0" in x for x in lines)
    assert "--options.skip_dropped" in out          # halo's options, the default strategy
    code, out, _ = run_cli(capsys, "train", "--strategy", "tma", "--help")
    assert code == 0 and "--options.avg_bits" in out and "--options.skip_dropped" not in out


def test_help_shows_a_key_added_to_a_config_dataclass_without_a_cli_change(capsys, monkeypatch):
    monkeypatch.setitem(config.SECTIONS, "train", _TrainWithWarmup)
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0
    row = next(x for x in out.splitlines() if "--train.warmup_epochs" in x)
    assert " 7 " in row and "linear learning-rate warm-up" in row
    # and the key is settable the same way as any other
    assert config.load_config(None, {"train": {"warmup_epochs": 3}}).train.warmup_epochs == 3


def test_strategies_name_lists_its_options(capsys):
    code, out, _ = run_cli(capsys, "strategies", "grappa")
    assert code == 0 and out.startswith("grappa: ")
    grad_bits = next(x for x in out.splitlines() if "--options.grad_bits" in x)
    assert " 32 " in grad_bits and "bits per gradient value" in grad_bits
    code, out, _ = run_cli(capsys, "strategies", "centralized")
    assert code == 0 and "--options.cache_inputs" in out
    code, _, err = run_cli(capsys, "strategies", "nope")
    assert code == 2 and "unknown strategy 'nope'" in err and "'halo'" in err


@pytest.mark.parametrize("argv", [
    [],
    ["--strategy", "minibatch", "--options.fanouts", "5,3", "--hidden", "32", "--lr", "0.05"],
    ["--strategy", "retexo", "--options.rounds_per_layer", "20,10", "--model", "sage"],
    ["--strategy", "tma", "--partition.clusters", "12", "--options.avg_bits", "8"],
    ["--strategy", "adaqp", "--options.bits", "4", "--runtime.run_name", "x", "--epochs", "3"],
])
def test_config_prints_a_recipe_that_round_trips(capsys, tmp_path, argv):
    code, out, err = run_cli(capsys, "config", *argv)
    assert code == 0, err
    recipe = tmp_path / "resolved.yaml"
    recipe.write_text(out)
    want = config.load_config(None, config.parse_overrides(cli._split_overrides(
        [a for a in argv])) if argv else {})
    back = config.load_config(recipe)
    assert back.to_dict() == want.to_dict()
    # every key is spelled out (defaults included), and printing it again gives the same text
    assert set(yaml.safe_load(out)) == {f.name for f in dataclasses.fields(config.RunConfig)}
    code, again, _ = run_cli(capsys, "config", "--config", str(recipe))
    assert code == 0 and again == out


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"quietgnn {quietgnn.__version__}"


def test_report_accepts_a_run_directory(tmp_path):
    r = subprocess.run([sys.executable, "-m", "quietgnn", "train", "--strategy", "centralized",
                        "--synthetic.nodes", "300", "--synthetic.feature_dim", "8", "--hidden",
                        "16", "--epochs", "3", "--runtime.progress", "false", "--out",
                        str(tmp_path), "--run-name", "one"], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "one"
    moved = tmp_path / "moved"          # the report reads the run where it is now
    run_dir.rename(moved)
    r = subprocess.run([sys.executable, "-m", "quietgnn", "report", str(moved), "--no-plots"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    rep = json.loads((moved / "report" / "report.json").read_text())
    row = rep["groups"][0]["rows"][0]
    summary = json.loads((moved / "summary.json").read_text())
    assert row["strategy"] == "centralized"
    assert row["train_bytes_per_epoch"] == summary["train_bytes_per_epoch"]
    assert row["compute_s_per_epoch"] is not None     # per-epoch curve read from moved/metrics
    r = subprocess.run([sys.executable, "-m", "quietgnn", "report", str(tmp_path), "--no-plots"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 2 and "holds no summary.json" in r.stderr
