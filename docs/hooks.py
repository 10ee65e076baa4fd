"""MkDocs hook: the pages that are generated at build time, so that none can fall behind.

- ``reference/options.md``: every key of every config section and every strategy's options,
  with default and meaning, read from the dataclasses through :mod:`quietgnn.confdoc` (the
  source of ``quietgnn train --help`` and ``quietgnn strategies NAME``). A field added to a
  section or to a strategy's ``Options`` appears here with no docs edit.
- ``results/``: ``benchmarks/results/README.md`` (the index) and one page per study folder,
  made of the study's own markdown (its main report first, then any other report of a
  sub-folder, e.g. a what-if) with its plots, which are copied into the site.
- ``guide/recipes.md``: the ``<!-- configs -->`` marker becomes every recipe in ``configs/``.

``options_page()`` and ``study_pages()`` are plain functions (no MkDocs import) so that
``tests/test_docs.py`` can check them without building the site.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    if not rows:
        return ["(none)"]
    out = ["| key | default | meaning |", "|---|---|---|"]
    out += [f"| `{_cell(k)}` | `{_cell(d)}` | {_cell(m) or '(undocumented)'} |" for k, d, m in rows]
    return out


def options_page() -> str:
    """Markdown of every config section's keys and every strategy's options."""
    from quietgnn.confdoc import describe, section_rows
    from quietgnn.config import SHORTCUTS, load_config
    from quietgnn.strategies import available_strategies

    cfg = load_config(None, {})
    lines = ["# Every option", "",
             "Generated from the config dataclasses when the site is built (the same source "
             "as `quietgnn train --help` and `quietgnn strategies NAME`). On the command line "
             "a key is `--section.key VALUE`; in a `--config` YAML recipe the same keys are "
             "nested mappings; `quietgnn config ...` prints the resolved values.", "",
             "## Config sections", ""]
    for name, rows in section_rows(cfg, SHORTCUTS):
        if name != "options":
            lines += [f"### `{name}`", ""] + _table(rows) + [""]
    lines += ["## Strategy options", "",
              "The `options` section holds the options of the strategy chosen with "
              "`--strategy` (`--options.KEY VALUE`, or `options:` in a recipe).", ""]
    for name, cls in available_strategies().items():
        parts = "single process" if cls.fixed_parts else \
            f"default partitioner `{cls.default_partitioner}`"
        rows = [(f"--options.{k}", d, m) for k, d, m in describe(cls.Options())]
        lines += [f"### `{name}`", "", f"{cls.description} ({parts}; exact: "
                  f"{'yes' if cls.exact else 'no'})", ""] + _table(rows) + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- results pages

def _main_md(folder: Path) -> Path | None:
    """The study's own page: ``<study>.md`` (a script's output, or the headline's copy of its
    report), else the matrix report, else its only markdown file."""
    for cand in (folder / f"{folder.name}.md", folder / "report" / "report.md"):
        if cand.is_file():
            return cand
    mds = sorted(folder.glob("*.md"))
    return mds[0] if mds else None


def _studies() -> dict[str, list[Path]]:
    """``{page path: markdown files}`` for every study folder, the archive's included."""
    out: dict[str, list[Path]] = {}
    for parent, prefix in ((RESULTS, "results/"), (RESULTS / "archive", "results/archive/")):
        for folder in sorted(p for p in parent.iterdir() if p.is_dir() and p.name != "archive"):
            main = _main_md(folder)
            if main is None:
                continue
            # a study's further reports (e.g. a what-if: report --compute-speedup) follow
            extra = [p for p in sorted(folder.glob("*.md")) + sorted(folder.glob("*/report.md"))
                     if p != main]
            out[f"{prefix}{folder.name}.md"] = [main] + extra
    return out


def _demote(md: str) -> str:
    """Headings one level down (the page's own title is the study name); not inside fences."""
    out, fence = [], False
    for line in md.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        out.append("#" + line if not fence and line.startswith("#") else line)
    return "\n".join(out)


def _rewrite(md: str, src: Path, page: str, pages_of: dict[Path, str],
             images: dict[str, Path]) -> str:
    """Relative links of ``src`` re-pointed from ``page``: a study's markdown to its page, a
    plot to its copy in the site (recorded in ``images``); any other file of the repository,
    which the site does not hold, becomes plain text."""
    page_dir = posixpath.dirname(page)

    def sub(m: re.Match) -> str:
        bang, text, target = m.groups()
        if re.match(r"[a-z]+:|#", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        file = (src.parent / path).resolve()
        if file in pages_of:
            rel = posixpath.relpath(pages_of[file], page_dir)
            return f"{bang}[{text}]({rel}{'#' + anchor if anchor else ''})"
        if file.suffix == ".png" and file.is_file() and RESULTS in file.parents:
            site = "results/" + file.relative_to(RESULTS).as_posix()
            images[site] = file
            return f"{bang}[{text}]({posixpath.relpath(site, page_dir)})"
        return text if text.startswith("`") else f"`{text}`"

    return _LINK.sub(sub, md)


def study_pages() -> tuple[dict[str, str], dict[str, Path]]:
    """``({page path: markdown}, {image path in the site: file})`` of the results section."""
    studies = _studies()
    pages_of = {files[i].resolve(): page for page, files in studies.items()
                for i in range(len(files))}
    index = RESULTS / "README.md"
    pages_of[index.resolve()] = "results/index.md"
    images: dict[str, Path] = {}
    pages = {"results/index.md": _rewrite(index.read_text(), index, "results/index.md",
                                          pages_of, images)}
    for page, files in studies.items():
        name = posixpath.splitext(posixpath.basename(page))[0]
        where = files[0].parent if files[0].parent.name != "report" else files[0].parent.parent
        body = [f"# {name}", "",
                f"Files: `{where.relative_to(ROOT).as_posix()}/` "
                f"(what, command and status: [the index]({posixpath.relpath('results/index.md', posixpath.dirname(page))})).",
                ""]
        for src in files:
            body += [_demote(_rewrite(src.read_text(), src, page, pages_of, images)), ""]
        pages[page] = "\n".join(body)
    return pages, images


def _recipes() -> str:
    blocks = []
    for f in sorted((ROOT / "configs").glob("*.yaml")):
        blocks += [f"### `configs/{f.name}`", "", "```yaml", f.read_text().rstrip(), "```", ""]
    return "\n".join(blocks)


# ---------------------------------------------------------------------------- MkDocs events

_GENERATED: dict[str, Any] = {}


def on_config(config: Any) -> Any:
    pages, images = study_pages()
    _GENERATED.update(pages=pages, images=images)
    current = [{posixpath.splitext(posixpath.basename(p))[0]: p} for p in pages
               if p.count("/") == 1 and p != "results/index.md"]
    archive = [{posixpath.splitext(posixpath.basename(p))[0]: p} for p in pages
               if p.startswith("results/archive/")]
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Results" in entry:
            entry["Results"] = ["results/index.md"] + current + [{"Archive": archive}]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File
    files.append(File.generated(config, "reference/options.md", content=options_page()))
    for path, md in _GENERATED["pages"].items():
        files.append(File.generated(config, path, content=md))
    for path, src in _GENERATED["images"].items():
        files.append(File.generated(config, path, abs_src_path=str(src)))
    return files


_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc):<code>(~?)([\w.]+)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The docstrings' Sphinx roles (``:class:`~a.B```), which mkdocstrings leaves as text,
    shown as the code they name (``~``: the last component, as Sphinx does)."""
    return _ROLE.sub(lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>", html)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "guide/recipes.md":
        return markdown.replace("<!-- configs -->", _recipes())
    return markdown
