"""The docs site's generated pages (docs/hooks.py): the option reference follows the config
dataclasses with no docs edit, and every study folder of benchmarks/results gets a page whose
plots exist. ``mkdocs build --strict`` itself runs in ``.ci/run``."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from quietgnn import config
from quietgnn.strategies import available_strategies
from quietgnn.strategies.base import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _hooks():
    pytest.importorskip("mkdocs", reason="the docs extra is not installed "
                        "(pip install -c constraints.txt -e '.[docs]')")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class _TrainWithWarmup(TrainConfig):
    #: epochs of linear learning-rate warm-up (a key no docs page knows about)
    warmup_epochs: int = 7


def test_options_page_lists_a_key_added_to_a_config_dataclass(monkeypatch):
    hooks = _hooks()
    assert "--train.warmup_epochs" not in hooks.options_page()
    monkeypatch.setitem(config.SECTIONS, "train", _TrainWithWarmup)
    page = hooks.options_page()
    row = next(x for x in page.splitlines() if "--train.warmup_epochs" in x)
    assert "`7`" in row and "linear learning-rate warm-up" in row


def test_options_page_has_every_section_and_every_strategy_option():
    page = _hooks().options_page()
    for section in ("dataset", "synthetic", "partition", "model", "train", "runtime"):
        assert f"### `{section}`" in page, section
    assert "`--model.hidden (--hidden)` | `64`" in page
    for name, cls in available_strategies().items():
        assert f"### `{name}`" in page, name
        for f in cls.Options.__dataclass_fields__:
            assert f"`--options.{f}`" in page, (name, f)


def test_every_study_folder_has_a_results_page_with_its_plots():
    hooks = _hooks()
    pages, images = hooks.study_pages()
    folders = [p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive"
               and any(p.rglob("*.md"))]
    assert folders
    for folder in folders:
        assert f"results/{folder.name}.md" in pages, folder.name
    assert "results/index.md" in pages
    # the headline's plots are shown on its page and are copied from files that exist
    headline = pages["results/headline.md"]
    assert "](headline/report/cora-gcn-acc_vs_bytes.png)" in headline
    assert images["results/headline/report/cora-gcn-acc_vs_bytes.png"].is_file()
    # the index's links point at the generated pages, not at repository paths
    assert "](headline.md)" in pages["results/index.md"]
    assert "](archive/tma-v1.md)" in pages["results/index.md"]


def test_results_index_lists_every_study_folder():
    """A study folder committed without its line in benchmarks/results/README.md fails here."""
    index = (RESULTS / "README.md").read_text()
    for parent, prefix in ((RESULTS, ""), (RESULTS / "archive", "archive/")):
        # a study's outputs: a top-level .md/.json or a report/ (not e.g. a folder of probes)
        for folder in (p for p in parent.iterdir() if p.is_dir() and p.name != "archive" and (
                any(p.glob("*.md")) or any(p.glob("*.json")) or (p / "report").is_dir())):
            assert f"[{prefix}{folder.name}]({prefix}{folder.name}/" in index, \
                f"{prefix}{folder.name}: add a line for it to benchmarks/results/README.md"
