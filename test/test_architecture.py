"""The layers of docs/architecture.md, checked on the import graph of ``mcpilco_core`` and ``mcpilco_ros``.

Every import statement counts, also the ones inside functions (a lazy import is still an arrow): no module
imports from a layer above its own, and there is no import circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mcpilco_core", "mcpilco_ros")

# bottom up; a module belongs to the first layer whose prefix matches its name
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("mcpilco_core", "mcpilco_core.config", "mcpilco_core.plant", "mcpilco_core.policy",
              "mcpilco_core.paths")),
    ("robot", ("mcpilco_core.simulation", "mcpilco_core.evaluation", "mcpilco_core.plotting",
               "mcpilco_core.control", "mcpilco_core.hardware")),
    ("recording", ("mcpilco_core.recording",)),
    ("learning", ("mcpilco_core.learning",)),
    ("top", ("mcpilco_ros",)),
]


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    return best


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports anywhere in its file (``from X import y``: X.y if a module)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_every_module_has_a_layer_and_imports_nothing_above_it():
    upward = []
    for module, targets in import_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports from a layer above:\n" + "\n".join(sorted(upward))


def test_no_import_circle():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    # a package importing its own submodules (re-exports) is not a circle when the submodule does not import
    # the package back; anything else is
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_graph_sees_lazy_and_relative_imports():
    """The checks above can fail: the graph finds a lazy relative import inside a function."""
    graph = import_graph()
    assert "mcpilco_core.plant" in graph["mcpilco_core.learning.learner"]     # lazy, inside a function
    assert "mcpilco_core.config" in graph["mcpilco_core.recording.reader"]    # relative, two dots
    assert layer_of("mcpilco_core.learning.gp") > layer_of("mcpilco_core.recording.reader")


@pytest.mark.parametrize("modules", [
    ["mcpilco_core.control", "mcpilco_core.evaluation", "mcpilco_core.simulation", "mcpilco_core.plotting",
     "mcpilco_core.hardware", "mcpilco_core.hardware.emulator", "mcpilco_core.hardware.hw_check",
     "mcpilco_core.recording", "mcpilco_core.policy", "mcpilco_core.control.exploration"],
])
def test_robot_and_recording_layers_never_load_torch(modules):
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            + "assert not loaded, loaded[:5]\n"
            + "import mcpilco_core.learning.gp\nassert 'torch' in sys.modules\n")  # the check itself can fail
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_no_private_names_imported_across_modules():
    """A name with a leading underscore is private to its module: nobody imports it (``from .x import _y``)."""
    modules = project_modules()
    private = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGES)):
                private += [f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}"
                            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, "\n".join(private)
