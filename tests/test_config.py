"""Run configuration: defaults, YAML recipes, overrides, and the errors for bad keys/values."""

from __future__ import annotations

import pytest

from quietgnn.config import config_from_dict, load_config, parse_overrides


def test_defaults_and_overrides():
    cfg = load_config(None, parse_overrides([("strategy", "centralized"), ("model.hidden", "128"),
                                             ("parts", "2"), ("runtime.progress", "false"),
                                             ("dataset", "cora"), ("lr", "0.005")]))
    assert cfg.strategy == "centralized" and cfg.model.hidden == 128
    assert cfg.partition.parts == 2 and cfg.num_parts == 1      # centralized runs on one process
    assert cfg.runtime.progress is False and cfg.dataset.name == "cora" and cfg.train.lr == 0.005
    assert cfg.partition_method == "metis"
    again = config_from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()


def test_yaml_recipe_with_override(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("strategy: halo\nmodel:\n  arch: sage\n  layers: 3\ntrain:\n  epochs: 7\n")
    cfg = load_config(f, parse_overrides([("model.layers", "2")]))
    assert cfg.model.arch == "sage" and cfg.model.layers == 2 and cfg.train.epochs == 7


@pytest.mark.parametrize("pairs, message", [
    ([("model.hiden", "3")], r"unknown key\(s\) \['model.hiden'\]; valid keys in 'model'"),
    ([("modle.hidden", "3")], r"unknown config section\(s\) \['modle'\]"),
    ([("hiddenn", "3")], r"unknown config key 'hiddenn'"),
    ([("model.arch", "gnn")], r"model.arch = 'gnn'; expected one of"),
    ([("model.layers", "0")], r"model.layers = 0; expected an int >= 1"),
    ([("model.dropout", "1.5")], r"model.dropout = 1.5"),
    ([("train.epochs", "-1")], r"train.epochs = -1"),
    ([("train.lr", "0")], r"train.lr = 0"),
    ([("train.lr", "inf")], r"train.lr = inf; expected a finite positive number"),
    ([("train.weight_decay", "nan")], r"train.weight_decay = nan; expected a finite"),
    ([("parts", "0")], r"partition.parts = 0"),
    ([("partition.method", "kway")], r"partition.method = 'kway'"),
    ([("strategy", "nope")], r"unknown strategy 'nope'; expected one of"),
    ([("options.bits", "4")], r"unknown option\(s\) \['bits'\] for strategy 'halo'"),
    ([("runtime.timeout_s", "0")], r"runtime.timeout_s = 0"),
    ([("runtime.timeout_s", "inf")], r"runtime.timeout_s = inf; expected a finite"),
    ([("runtime.keep_checkpoints", "1")], r"runtime.keep_checkpoints = 1"),
    ([("model.norm", "batch")], r"model.norm = 'batch'"),
])
def test_bad_values_are_named(pairs, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, parse_overrides(pairs))


def test_bad_recipe_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_config(lst)
    sec = tmp_path / "sec.yaml"
    sec.write_text("model: 3\n")
    with pytest.raises(ValueError, match="section 'model' must be a mapping"):
        load_config(sec)


def test_synthetic_presets():
    """a preset gives its keys, keys set beside it win, an unknown name is named; a command's
    own defaults (prepare synthetic's preset) sit under the recipe and the overrides"""
    from quietgnn.datasets.synthetic import PRESETS
    hard = load_config(None, {"synthetic": {"preset": "hard"}}).synthetic
    assert all(getattr(hard, k) == v for k, v in PRESETS["hard"].items())
    mixed = load_config(None, {"synthetic": {"preset": "hard", "homophily": 0.9}}).synthetic
    assert mixed.homophily == 0.9 and mixed.feature_noise == PRESETS["hard"]["feature_noise"]
    under = load_config(None, {"synthetic": {"homophily": 0.7}},
                        defaults={"synthetic": {"preset": "hard"}}).synthetic
    assert under.homophily == 0.7 and under.avg_degree == PRESETS["hard"]["avg_degree"]
    assert load_config(None, {"synthetic": {"preset": "easy"}},
                       defaults={"synthetic": {"preset": "hard"}}).synthetic == \
        load_config(None).synthetic
    with pytest.raises(ValueError, match=r"synthetic.preset = 'harder'; expected one of "
                                         r"\['easy', 'hard'\]"):
        load_config(None, {"synthetic": {"preset": "harder"}})
    with pytest.raises(ValueError, match=r"synthetic.preset = \['hard'\]; expected one of"):
        load_config(None, {"synthetic": {"preset": ["hard"]}})    # a YAML list, not a name


def test_help_lists_the_synthetic_preset_and_its_names_are_the_presets():
    from quietgnn.cli import _help_epilog
    from quietgnn.datasets.synthetic import PRESETS, SyntheticSpec
    assert "--synthetic.preset" in _help_epilog(["train", "--help"])
    (_, _, meaning), = SyntheticSpec.HELP_KEYS
    assert all(name in meaning for name in PRESETS)


@pytest.mark.parametrize("value", ["1e10", "1e300", "10000001"])
def test_a_timeout_beyond_what_torch_takes_is_refused(value):
    """torch's store timeout overflows in milliseconds above ~1e9 s: 1e10 failed at once with
    a misleading 'waited ... and gave up', 1e300 was an OverflowError in every worker"""
    with pytest.raises(ValueError, match=r"runtime.timeout_s = .*; expected a finite number of "
                                         r"seconds > 0, at most 10000000 \(about 116 days\)"):
        load_config(None, parse_overrides([("timeout", value)]))
    assert load_config(None, parse_overrides([("timeout", "1e7")])).runtime.timeout_s == 1e7


def test_paths_and_names_are_taken_as_typed_and_must_be_strings(tmp_path):
    """Command-line values were read as YAML: `--data "p #1"` trained on p (a comment cut),
    `--run-name 007` became 7 (a TypeError), `--out yes` became true, `0x1F` 31, a newline a
    space; a recipe's `run_name: 7` or an API `out=Path(...)` failed with raw TypeErrors."""
    import pathlib

    import numpy as np

    typed = parse_overrides([("data", "/d/p #1"), ("out", "res #2\nx"), ("run-name", "007"),
                             ("summary-json", "yes"), ("root", "null"), ("book", "0x1F"),
                             ("epochs", "3"), ("strategy", "halo")])
    assert typed["dataset"] == {"prepared": "/d/p #1", "root": None}
    assert typed["runtime"] == {"out_dir": "res #2\nx", "run_name": "007",
                                "summary_json": "yes"}
    assert typed["partition"] == {"book": "0x1F"} and typed["train"] == {"epochs": 3}
    with pytest.raises(ValueError, match=r"^runtime.run_name = 7 \(int\); expected a string \(in "
                                         r"YAML, put it in quotes\)$"):
        load_config(None, {"runtime": {"run_name": 7}})
    with pytest.raises(ValueError, match=r"^runtime.out_dir = True \(bool\); expected a string"):
        load_config(None, {"runtime": {"out_dir": True}})
    cfg = load_config(None, {"runtime": {"out_dir": pathlib.Path(tmp_path)},
                             "model": {"hidden": np.int64(32)}, "train": {"lr": np.float32(0.5)}})
    assert cfg.runtime.out_dir == str(tmp_path) and cfg.model.hidden == 32
    assert type(cfg.model.hidden) is int and cfg.train.lr == 0.5


@pytest.mark.parametrize("key", ["train.seed", "partition.seed", "dataset.split_seed",
                                 "synthetic.seed"])
@pytest.mark.parametrize("value", [2**63 - 1, 2**64 - 1, -1, 99999999999999999999])
def test_seeds_outside_what_metis_and_numpy_take_are_refused_by_name(key, value):
    """--train.seed 9223372036854775807 failed in every worker (an overflow in
    torch.manual_seed), --partition.seed 99999999999999999999 inside METIS (a 3-line pybind
    error), each after the run directory was made."""
    section, name = key.split(".")
    with pytest.raises(ValueError, match=rf"^{key} = {value}; expected an integer in "
                                         rf"\[0, 2147483647\]"):
        load_config(None, {section: {name: value}})
    assert getattr(getattr(load_config(None, {section: {name: 2**31 - 1}}), section), name) \
        == 2**31 - 1


def test_bench_set_values_of_string_fields_are_taken_as_typed():
    """bench/advise --set read every value as YAML: `--set runtime.duplex=on` was refused as
    'True (bool); expected a string', `--set partition.file=2024` as an int."""
    from quietgnn.analysis.bench import _kv
    assert _kv(["runtime.duplex=on", "partition.file=2024", "train.lr=0.5"], "--set") == \
        {"runtime.duplex": "on", "partition.file": "2024", "train.lr": 0.5}
