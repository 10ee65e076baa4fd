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
    assert len(str(e.value)) <= 420, len(str(e.value))


def _nested(levels: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + f"{'  ' * levels}1\n"


def test_deep_nesting_is_refused_in_one_line(tmp_path, capsys):
    """3000 levels were a RecursionError with ~3000 lines of traceback"""
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(_nested(3000))
    with pytest.raises(ValueError, match=r"deep.yaml' at line 33, column 65: nested deeper "
                                         r"than 32 levels"):
        load_config(recipe)
    assert main(["config", "--config", str(recipe)]) == 2
    assert "nested deeper than 32" in _one_line_error(capsys)
    flow = "[" * 3000 + "]" * 3000
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
