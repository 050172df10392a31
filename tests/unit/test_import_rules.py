"""The package's layers, enforced: no import circles, a pure core, a controller that loads no UI.

Read statically from the source (every ``import``, at module level or inside a function, and
under ``TYPE_CHECKING`` too: a lazy import still ties two modules together), so a rule breaks
here before it breaks a user. The layer order is the README's: the pure core at the top, then
the storage shell, the Ray shell, simulation, views and the command line.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "spotfallback"

CORE = {
    "spotfallback.config", "spotfallback.events", "spotfallback.policy", "spotfallback.accounting", "spotfallback.errors",
    "spotfallback.notice_window", "spotfallback.durations", "spotfallback.cloud_notices",
}
# What the pure core may import from outside the standard library: validation and YAML only.
CORE_THIRD_PARTY = {"pydantic", "yaml"}

# Each part, and the parts it may import (besides itself and the core). A part never reaches
# "up" into one that is built on it: the storage shell knows nothing of Ray, the Ray shell
# nothing of the command line, and nothing but the command line imports it.
LAYERS: dict[str, set[str]] = {
    "store": set(),
    "sim": set(),
    "deploy": set(),
    "view": {"store", "sim", "integrations"},
    "integrations": {"store", "view"},
    "notices": {"store"},
    "runtime": {"store", "notices", "view"},
    "local": {"store", "notices", "runtime", "sim", "view", "examples"},
    "examples": {"store", "integrations", "notices"},
    "clusters": {"store"},
    "cli": {"store", "runtime", "sim", "view", "deploy", "notices", "local", "integrations", "examples", "clusters"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports: spotfallback modules by full name, others by top package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in MODULES else base)
    return {m if m.startswith(PACKAGE) else m.split(".")[0] for m in out if m}


GRAPH = {name: {m for m in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_there_is_no_import_circle_in_the_package():
    assert _cycles() == []


def test_the_circle_finder_finds_a_circle():
    GRAPH["spotfallback.config"].add("spotfallback.policy")  # policy imports config
    try:
        assert ["spotfallback.config", "spotfallback.policy"] in _cycles()
    finally:
        GRAPH["spotfallback.config"].discard("spotfallback.policy")


@pytest.mark.parametrize("module", sorted(CORE))
def test_the_core_imports_only_the_core_and_no_io_library(module):
    imported = _imports(module, MODULES[module])
    ours = {m for m in imported if m.startswith(PACKAGE)}
    assert ours <= CORE | {PACKAGE}, f"{module} imports shells: {sorted(ours - CORE)}"
    third_party = {m for m in imported if not m.startswith(PACKAGE) and m not in sys.stdlib_module_names}
    assert third_party <= CORE_THIRD_PARTY, f"{module} imports {sorted(third_party - CORE_THIRD_PARTY)}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _part(m) in LAYERS))
def test_each_part_imports_only_the_parts_below_it(module):
    part = _part(module)
    allowed = LAYERS[part] | {part}
    reaches = {_part(m) for m in GRAPH[module] if m not in CORE and m != PACKAGE}
    assert reaches <= allowed, f"{module} ({part}) reaches up into {sorted(reaches - allowed)}"


def test_the_ray_train_controller_hooks_load_no_terminal_or_plotting_library():
    """The hooks are unpickled inside Ray Train's controller actor: keep it lean."""
    code = (
        "import sys, spotfallback.runtime.hooks; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'matplotlib', 'typer'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
