"""Option documentation generated from the config dataclasses themselves.

A field's meaning is written where the field is: the ``#:`` comment lines right above it, or
else the comment at the end of its line, or ``field(metadata={"help": ...})``. This module reads
those once per class (from the source, with :mod:`tokenize` and :mod:`ast`), so
``quietgnn train --help``, ``quietgnn strategies NAME`` and the docs can never fall behind the
code: a field added to a section shows up with its default and meaning, with no CLI edit.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import shutil
import textwrap
import tokenize
from typing import Any, Iterable, Optional

__all__ = ["field_docs", "describe", "format_rows", "format_value", "config_help",
           "strategy_help"]


@functools.lru_cache(maxsize=None)
def _own_docs(cls: type) -> dict[str, str]:
    """Meanings of the fields ``cls`` itself declares, from its source comments."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):      # built in a REPL / exec: no source to read
        return {}
    lines = src.splitlines()
    comments: dict[int, tuple[int, str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.start[1], tok.string)
    cls_node = ast.parse(src).body[0]
    out: dict[str, str] = {}
    for node in getattr(cls_node, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, ln = [], node.lineno - 1
        while ln in comments and lines[ln - 1].lstrip().startswith("#:"):
            above.insert(0, comments[ln][1][2:].strip())
            ln -= 1
        end = node.end_lineno or node.lineno
        if above:
            out[node.target.id] = " ".join(above)
        elif end in comments and comments[end][0] > len(lines[end - 1]) - \
                len(lines[end - 1].lstrip()):    # a comment after code, not a line of its own
            out[node.target.id] = comments[end][1].lstrip("#:").strip()
    return out


_ROLE = re.compile(r":(?:attr|meth|class|func|mod|data|exc):`(~?)([\w.]+)`")


def plain(text: str) -> str:
    """``text`` with Sphinx roles as the names they point to (``:attr:`~a.B.c``` -> ``c``,
    ``:meth:`A.b``` -> ``A.b``) and ````code```` as ```code```: what a terminal shows."""
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return text.replace("``", "`")


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: one-line meaning}`` of a dataclass, base classes' fields included (in
    plain text: :func:`plain`)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    for f in dataclasses.fields(cls):
        if f.metadata.get("help"):
            docs[f.name] = str(f.metadata["help"])
    return {k: plain(v) for k, v in docs.items()}


def format_value(v: Any) -> str:
    """A value as it is written on the command line or in a recipe."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(format_value(x) for x in v)
    return str(v)


def describe(obj: Any) -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` for every field of a dataclass instance (its values taken as
    the defaults)."""
    docs = field_docs(type(obj))
    return [(f.name, format_value(getattr(obj, f.name)), docs.get(f.name, "").replace("``", "`"))
            for f in dataclasses.fields(obj)]


def format_rows(rows: Iterable[tuple[str, str, str]], indent: int = 2,
                width: Optional[int] = None) -> list[str]:
    """``key  default  meaning`` columns; long meanings wrap under their own column."""
    rows = list(rows)
    width = width or min(120, max(80, shutil.get_terminal_size((100, 20)).columns))
    kw = min(40, max((len(k) for k, _, _ in rows), default=0))
    dw = min(16, max((len(d) for _, d, _ in rows), default=0))
    out = []
    for key, default, meaning in rows:
        head = f"{' ' * indent}{key:<{kw}}  {default:<{dw}}  "
        if len(head) > indent + kw + dw + 4:          # a long key or default: meaning below
            out.append(head.rstrip())
            head = " " * (indent + kw + dw + 4)
        body = textwrap.wrap(meaning or "(undocumented)", max(30, width - len(head)))
        out.append(head + body[0])
        out += [" " * len(head) + line for line in body[1:]]
    return out


def config_help(cfg: Any, shortcuts: dict[str, str]) -> str:
    """Every section, key, default and meaning of a resolved :class:`~quietgnn.config.RunConfig`
    (the strategy's own options are those of ``cfg.strategy``)."""
    lines = ["configuration keys (--section.key VALUE; a --config YAML recipe takes the same "
             "keys as nested mappings; `quietgnn config ...` prints the resolved values):", "",
             f"  --strategy {cfg.strategy}  a registered strategy (`quietgnn strategies` lists "
             f"them, `quietgnn strategies NAME` its options)"]
    for name, rows in section_rows(cfg, shortcuts):
        title = (f"{name}: options of strategy {cfg.strategy!r} (other strategies: "
                 f"`quietgnn strategies NAME`)") if name == "options" else f"{name}:"
        lines += ["", title] + (format_rows(rows) if rows else ["  (none)"])
    return "\n".join(lines)


def section_rows(cfg: Any, shortcuts: dict[str, str]) -> list[tuple[str, list[tuple[str, str,
                                                                                        str]]]]:
    """``[(section, [(flag, default, meaning), ...]), ...]`` of every dataclass section of a
    resolved config, a flag naming its shortcut where it has one (``--help`` and the docs'
    option page both print these)."""
    short = {v: k for k, v in shortcuts.items()}
    out = []
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        rows = []
        for key, default, meaning in [*getattr(section, "HELP_KEYS", ()), *describe(section)]:
            flag = f"--{f.name}.{key}"
            if f"{f.name}.{key}" in short:
                flag += f" (--{short[f.name + '.' + key]})"
            rows.append((flag, default, meaning))
        out.append((f.name, rows))
    return out


def strategy_help(name: str, cls: Any) -> str:
    """A strategy's description, partitioner and options (``--options.KEY``) with defaults."""
    parts = ("single process" if cls.fixed_parts
             else f"default partitioner {cls.default_partitioner}")
    lines = [f"{name}: {cls.description}", f"  ({parts}; exact: {'yes' if cls.exact else 'no'})",
             "", "options (--options.KEY VALUE, or options: in a recipe):"]
    rows = [(f"--options.{k}", d, m) for k, d, m in describe(cls.Options())]
    return "\n".join(lines + (format_rows(rows) if rows else ["  (none)"]))
