"""Hostile or malformed YAML (recipes for ``--config``, bench matrices, ``--key VALUE`` flags):
each refused in one bounded line naming the file, key or flag, before anything is expanded,
recursed into or echoed whole."""

from __future__ import annotations

import pytest

from quietgnn.cli import main
from quietgnn.config import load_config, parse_overrides


def _bomb(levels: int, indent: str = "  ") -> str:
    """The billion laughs: each level ten references to the one before."""
    rows = [f"{indent}k0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"{indent}k{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]"
             for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_yaml_aliases_are_refused_in_recipes_matrices_and_flags(tmp_path, capsys):
    """a 6-level alias bomb cost 390 MB and 5.5 s before bench refused it, and a recipe's
    printed an 800 KB line: now the first anchor is refused where it stands"""
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("model:\n" + _bomb(6))
    with pytest.raises(ValueError, match=r"bomb.yaml' at line 2, column \d+: YAML anchor &a0 "
                                         r"refused.*write the value out") as e:
        load_config(recipe)
    assert len(str(e.value)) < 300
    assert main(["config", "--config", str(recipe)]) == 2
    assert "anchor &a0 refused" in _one_line_error(capsys)

    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("datasets: [synthetic]\nstrategies: [halo]\nset:\n" + _bomb(6))
    assert main(["bench", "--matrix", str(matrix), "--dry-run"]) == 2
    assert "matrix file" in (err := _one_line_error(capsys)) and "&a0 refused" in err

    with pytest.raises(ValueError, match=r"--model.hidden '\[&a \[1\], \*a\]'.*anchor &a"):
        parse_overrides([("model.hidden", "[&a [1], *a]")])
    assert main(["bench", "--datasets", "synthetic", "--strategies", "halo",
                 "--set", "model.x=[&a [1], *a]", "--dry-run"]) == 2
    assert "--set 'model.x=[&a [1], *a]'" in _one_line_error(capsys)


@pytest.mark.parametrize("raw", [
    {"model": {"hidden": list(range(100_000))}},        # echoed by config's own type check
    {"model": {"arch": "x" * 100_000}},                 # echoed by the section's validation
    {"runtime": {"backend": "y" * 100_000}},
    {"nosuch" + "z" * 100_000: 1},                      # an unknown section's name
])
def test_a_huge_value_is_echoed_cut(raw):
    with pytest.raises(ValueError) as e:
        load_config(None, raw)
    assert len(str(e.value)) <= 2020, len(str(e.value))


def _nested(levels: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + f"{'  ' * levels}1\n"


def test_deep_nesting_is_refused_in_one_line(tmp_path, capsys):
    """3000 levels were a RecursionError with ~3000 lines of traceback"""
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(_nested(300))
    with pytest.raises(ValueError, match=r"deep.yaml' at line 33, column 65: nested deeper "
                                         r"than 32 levels"):
        load_config(recipe)
    assert main(["config", "--config", str(recipe)]) == 2
    assert "nested deeper than 32" in _one_line_error(capsys)
    flow = "[" * 3000 + "]" * 3000
    recipe.write_text(f"model:\n  hidden: {flow}\n")
    with pytest.raises(ValueError, match=r"deep.yaml' at line 2, column 41: nested deeper"):
        load_config(recipe)
    with pytest.raises(ValueError, match=r"--options.fanouts '\[\[\[.*nested deeper than 32"):
        parse_overrides([("options.fanouts", flow)])
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("datasets: [synthetic]\nstrategies: [halo]\nset: {model.x: "
                      + flow + "}\n")
    assert main(["bench", "--matrix", str(matrix), "--dry-run"]) == 2
    assert "nested deeper than 32" in _one_line_error(capsys)
    # the deepest accepted is read: 32 mappings, the document's own the first
    assert _read(tmp_path, _nested(32))


def _read(tmp_path, text: str):
    from quietgnn.config import read_yaml_mapping
    f = tmp_path / "ok.yaml"
    f.write_text(text)
    return read_yaml_mapping(f, "file", "a mapping")


def test_a_recipe_that_cannot_be_read_is_named_with_what_it_is(tmp_path, capsys):
    """a non-UTF-8 recipe's error did not name the file; a directory 'did not exist'"""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"train:\n  epochs: 3\n# caf\xe9\n")
    with pytest.raises(ValueError, match=r"config file '.*latin1.yaml' is not UTF-8 text "
                                         r"\(byte 0xe9 at line 3\); save it as UTF-8"):
        load_config(bad)
    assert main(["config", "--config", str(bad)]) == 2
    assert "latin1.yaml' is not UTF-8" in _one_line_error(capsys)
    with pytest.raises(ValueError, match=r"config file '.*' is a directory; expected a YAML"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match=r"'/dev/zero' is not a regular file"):
        load_config("/dev/zero")          # never read: it does not end
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (4 << 20) + b"\n")
    with pytest.raises(ValueError, match=r"big.yaml' is larger than 4 MiB"):
        load_config(big)
    with pytest.raises(ValueError, match=r"does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, capsys):
    """a second `train:` silently replaced the first (its epochs lost)"""
    recipe = tmp_path / "dup.yaml"
    recipe.write_text("train:\n  epochs: 3\nmodel:\n  hidden: 8\ntrain:\n  lr: 0.05\n")
    with pytest.raises(ValueError, match=r"dup.yaml' at line 5, column 1: key 'train' is given "
                                         r"twice in one mapping \(lines 1 and 5\)"):
        load_config(recipe)
    recipe.write_text("model: {hidden: 8, hidden: 16}\n")
    with pytest.raises(ValueError, match=r"key 'hidden' is given twice.*lines 1 and 1"):
        load_config(recipe)
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("datasets: [synthetic]\nstrategies: [halo]\nset: {train.epochs: 2}\n"
                      "set: {model.hidden: 8}\n")
    assert main(["bench", "--matrix", str(matrix), "--dry-run"]) == 2
    assert "key 'set' is given twice" in _one_line_error(capsys)
    with pytest.raises(ValueError, match=r"--options.x .*key 'a' is given twice"):
        parse_overrides([("options.x", "{a: 1, a: 2}")])


def test_a_nul_character_is_refused_naming_the_key(tmp_path, capsys):
    """`run_name: "a\\0b"` failed with 'embedded null byte', naming no key"""
    recipe = tmp_path / "nul.yaml"
    recipe.write_text('runtime:\n  run_name: "a\\0b"\n')
    with pytest.raises(ValueError, match=r"nul.yaml': runtime.run_name = 'a\\x00b' holds a NUL "
                                         r"character"):
        load_config(recipe)
    assert main(["config", "--config", str(recipe)]) == 2
    assert "runtime.run_name" in _one_line_error(capsys)
    with pytest.raises(ValueError, match=r"^runtime.out_dir = 'x\\x00' holds a NUL"):
        load_config(None, parse_overrides([("out", "x\0")]))    # (a path is taken as typed)
    with pytest.raises(ValueError, match=r"key 'a\\x00' in options.fanouts holds a NUL"):
        load_config(None, {"options": {"fanouts": {"a\0": 1}}})
    with pytest.raises(ValueError, match=r"options.fanouts\[1\] = 'b\\x00' holds a NUL"):
        load_config(None, {"options": {"fanouts": ["a", "b\0"]}})
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text('datasets: [{name: synthetic, label: "a\\0b"}]\nstrategies: [halo]\n')
    assert main(["bench", "--matrix", str(matrix), "--dry-run"]) == 2
    assert "datasets[0].label = 'a\\x00b' holds a NUL" in _one_line_error(capsys)


def test_a_yaml_of_too_many_values_is_refused_before_it_is_built(tmp_path):
    """Under the size cap a 1 MiB list of zeros still cost 8.7 s and 340 MiB in PyYAML's
    composer; more than MAX_YAML_NODES values are refused as they are read."""
    from quietgnn.readyaml import MAX_YAML_NODES
    recipe = tmp_path / "many.yaml"
    recipe.write_text("model:\n  hidden: [" + ", ".join(["0"] * 300_000) + "]\n")
    with pytest.raises(ValueError, match=rf"many.yaml' at line 2, column \d+: more than "
                                         rf"{MAX_YAML_NODES} values"):
        load_config(recipe)
