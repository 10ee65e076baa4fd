"""Reading the YAML quietgnn is given (``--config`` recipes, ``quietgnn bench`` matrices,
``--key VALUE`` flags) as plain data and nothing more: ``yaml.safe_load`` (no code) without
anchors and aliases, nesting deeper than :data:`MAX_YAML_DEPTH`, a key given twice, a NUL
in a string, a file over :data:`MAX_YAML_BYTES` or not UTF-8; each refused in one line naming
the file (and line and column, or key). :func:`brief` cuts the values error messages echo.

Plain Python and PyYAML only: the analysis wing reads matrices without importing torch.
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

__all__ = ["brief", "read_yaml_mapping", "yaml_value", "yaml_problem", "YamlRefused",
           "check_no_nul", "MAX_YAML_DEPTH", "MAX_YAML_BYTES", "MAX_YAML_NODES"]


#: the longest a value is echoed in an error message: a message stays one readable line
#: whatever a file holds
ECHO_CHARS = 80


def brief(value: Any, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages that echo what a user
    gave: a value of a megabyte must not become a megabyte of message (:mod:`reprlib` writes
    only the start of a long list or string, so a huge value is never formatted whole)."""
    echo = reprlib.Repr()
    echo.maxlevel, echo.maxstring, echo.maxother = 3, limit, limit
    echo.maxlist = echo.maxtuple = echo.maxdict = echo.maxset = 12
    text = echo.repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


#: the deepest nesting of lists and mappings a YAML file or value may have
MAX_YAML_DEPTH = 32
#: the most values (scalars, lists, mappings) a YAML file or value may hold
MAX_YAML_NODES = 20_000


class YamlRefused(yaml.MarkedYAMLError):
    """Something :class:`_StrictLoader` will not read (valid YAML, refused by quietgnn)."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load`` (plain data, no code) without anchors and aliases: an alias is a
    reference, so ``&a [*b, *b, ...]`` six levels deep is a 400-byte file that expands to
    millions of values wherever it is copied, hashed or echoed (the billion laughs). No
    recipe or matrix needs them: a repeated value is written out."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        # each value costs PyYAML a few hundred bytes and some microseconds: a 1 MiB list of
        # zeros held 340 MiB; no recipe or matrix has more than a few hundred values
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise YamlRefused(None, None, f"more than {MAX_YAML_NODES} values; a recipe or "
                              f"matrix needs a few hundred", event.start_mark)
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise YamlRefused(None, None, f"YAML {'alias' if sign == '*' else 'anchor'} "
                              f"{sign}{event.anchor[:40]} refused: quietgnn reads no "
                              f"anchors or aliases (a few bytes of them can expand to "
                              f"gigabytes); write the value out where it is used",
                              event.start_mark)
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            # composing recurses per level: 3000 levels were a RecursionError and 3000 lines
            # of traceback; no recipe or matrix nests beyond a handful
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise YamlRefused(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels "
                                  f"(lists / mappings inside each other); a recipe or matrix "
                                  f"needs a few", event.start_mark)
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # a key given twice: PyYAML keeps the last silently (a second `train:` section
        # dropped the first's epochs); refused naming the key and both lines
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:     # unhashable: the base class refuses it by name
                    continue
                if first is not key_node.start_mark:
                    raise YamlRefused(None, None, f"key {brief(key)} is given twice in one "
                                      f"mapping (lines {first.line + 1} and "
                                      f"{key_node.start_mark.line + 1}); the second would "
                                      f"silently replace the first: keep one (merge them)",
                                      key_node.start_mark)
        return super().construct_mapping(node, deep)


def yaml_value(text: str) -> Any:
    """``text`` read as YAML by :class:`_StrictLoader` (raises ``yaml.YAMLError``, a
    :class:`YamlRefused` for what quietgnn will not read)."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where and what (PyYAML's own message spans several, with context)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or \
        (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"{where}: {problem}"


#: the largest YAML file read (a recipe or a matrix is a few KiB): a wrong path given as
#: ``--config`` must not be read whole into memory
MAX_YAML_BYTES = 4 << 20


def read_yaml_mapping(path: str | Path, what: str, holds: str) -> dict[str, Any]:
    """The mapping a YAML file holds (:func:`yaml_value`: plain data, no code, no aliases, no
    key twice, no NUL in a string), or a ValueError that names the file as ``what`` and says
    what it should hold."""
    p = Path(path)
    name = brief(str(p), 300)
    if p.is_dir():
        raise ValueError(f"{what} {name} is a directory; expected a YAML file")
    if not p.exists():
        raise ValueError(f"{what} {name} does not exist")
    try:
        # opened without blocking and checked as opened: a pipe or a device (swapped in after
        # any check by name) could block the open or the read, or never end
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ValueError(f"{what} {name} is not a regular file; expected a YAML file")
            data = fh.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{what} {name} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_YAML_BYTES:
        raise ValueError(f"{what} {name} is larger than {MAX_YAML_BYTES >> 20} MiB; expected a "
                         f"YAML file of a few KiB (is it the file you meant?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{what} {name} is not UTF-8 text (byte {data[exc.start]:#04x} at line "
                         f"{line}); save it as UTF-8") from None
    try:
        loaded = yaml_value(text) or {}
    except YamlRefused as exc:
        raise ValueError(f"{what} {name}{yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {name} is not valid YAML{yaml_problem(exc)}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{what} {name} must hold {holds}, got {type(loaded).__name__}")
    try:
        check_no_nul(loaded)
    except ValueError as exc:
        raise ValueError(f"{what} {name}: {exc}") from None
    return loaded


def check_no_nul(data: Any, where: str = "") -> None:
    """A NUL character in any key or string value of ``data`` (nested dicts and lists) is
    refused naming its key: the names and paths these values become cannot hold one, and
    the operating system's error ('embedded null byte') would not say which key it was."""
    stack = [(where, data)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and "\0" in k:
                    raise ValueError(f"key {brief(k)}{f' in {key}' if key else ''} holds a "
                                     f"NUL character (\\0); keys, names and paths cannot "
                                     f"contain one")
                stack.append((f"{key}.{k}" if key else str(k), v))
        elif isinstance(value, (list, tuple)):
            stack += [(f"{key}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, str) and "\0" in value:
            raise ValueError(f"{key or 'the value'} = {brief(value)} holds a NUL character "
                             f"(\\0); names and paths cannot contain one: remove it")
