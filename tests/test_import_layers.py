"""The package's layers: every import (function-level ones included) goes down the list below,
never up, and no two modules import each other at import time. A new dependency that breaks
either fails here with the import named; move the shared piece down instead."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "quietgnn"

#: lowest first; a unit (sub-package or top-level module) may import its own layer and below
LAYERS = [
    {"serial", "safefiles", "errors", "graph", "graphinput", "seeds", "rows", "confdoc", "heap",
     "readyaml"},
    {"datasets", "partition", "nn"},
    {"comm"},
    {"sampling"},
    {"strategies"},
    {"config"},
    {"runtime"},
    {"prepare", "analysis"},
    {"api"},
    {"cli", "__main__", "__init__"},
]
LEVEL = {u: i for i, layer in enumerate(LAYERS) for u in layer}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path, top_only: bool) -> list[tuple[str, int]]:
    """(imported quietgnn module, line) of ``name``; ``top_only``: at import time only (not
    inside functions, nor under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    nodes = ast.walk(tree)
    if top_only:
        nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = []
    for n in nodes:
        if isinstance(n, ast.ImportFrom):
            base = pkg[:len(pkg) - (n.level - 1)] if n.level else []
            full = ".".join(base + (n.module.split(".") if n.module else []))
            if full.split(".")[0] != "quietgnn":
                continue
            found += [(f"{full}.{a.name}", n.lineno) for a in n.names]
        elif isinstance(n, ast.Import):
            found += [(a.name, n.lineno) for a in n.names if a.name.split(".")[0] == "quietgnn"]
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in _modules()}
    assert units <= set(LEVEL), f"place {sorted(units - set(LEVEL))} in LAYERS"


def test_no_import_goes_up_a_layer():
    mods = _modules()
    up = []
    for name, path in mods.items():
        src = _unit(name)
        for target, line in _imports(name, path, top_only=False):
            dst = _unit(target)
            if dst in LEVEL and LEVEL[dst] > LEVEL[src]:
                up.append(f"{path.relative_to(PKG.parent)}:{line} imports {target} "
                          f"({src} is below {dst})")
    assert not up, "\n".join(up)


def test_no_module_level_import_cycle():
    mods = _modules()

    def resolve(target: str) -> str | None:   # a name imported from a module -> that module
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    graph = {name: {m for t, _ in _imports(name, path, top_only=True)
                    if (m := resolve(t)) and m != name and not name.startswith(m + ".")}
             for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
