"""The package's import graph, read from the source (ast): no cycle, and the ops are leaves.

Every ``import`` and ``from ... import`` of a ``dsv41_kernels`` module counts, at module level
or inside a function, so a lazy import cannot hide an edge. The ops import only the layers
below them (``admission``, ``devices``, ``jit``, ``workspace``, ``reference``) and each other;
nothing under ``ops/`` imports the check, the cases, the CLI, the SGLang plugin, the
calibration or the lazy package facade. ``devices`` (the device queries) sits below ``jit``
(the CUDA modules' build, load and manifest), which asks no device anything itself. The package
imports nothing of a checkout (``test``, ``benchmark``), so an installed wheel runs every
command; the SGLang plugin, which every server process loads, imports neither the calibration
nor the command line; the calibration imports SGLang only inside its functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dsv41_kernels

ROOT = Path(dsv41_kernels.__file__).resolve().parent
PACKAGE = "dsv41_kernels"
ABOVE_THE_OPS = ("check", "cases", "cli", "sglang_plugin", "calibration", "calibrate_cli")
CHECKOUT = ("test", "benchmark")
"""The checkout's top-level packages, which an installed wheel lacks."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[str]:
    """Every dotted name ``path`` imports: ``X`` for ``import X``, and both ``X`` and ``X.y`` for
    ``from X import y`` (relative imports resolved)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module_name(path).split(".")
                anchor = anchor[: len(anchor) - node.level + (path.name == "__init__.py")]
                base = ".".join(anchor + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: set(imported(path)) & set(paths) for name, path in paths.items()}


def test_the_graph_sees_the_package():
    edges = graph()
    assert f"{PACKAGE}.ops.speculative.row_argmax" in edges
    assert (
        f"{PACKAGE}.ops.speculative.argmax_reduction"
        in edges[f"{PACKAGE}.ops.speculative.row_argmax"]
    )
    assert f"{PACKAGE}.cases.row_argmax" in edges[f"{PACKAGE}.check"]


def test_no_import_cycle():
    edges = graph()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = path[path.index(node) :] + [node]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if node in done:
            return
        for target in sorted(edges.get(node, ())):
            if target != node:
                visit(target, path + [node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])


def test_ops_import_nothing_above_them():
    upward = {f"{PACKAGE}.{name}" for name in ABOVE_THE_OPS}
    for module, targets in graph().items():
        if not module.startswith(f"{PACKAGE}.ops"):
            continue
        for target in targets:
            assert target != PACKAGE, f"{module} imports the package facade"
            assert not any(target == u or target.startswith(u + ".") for u in upward), (
                f"{module} imports {target}"
            )


def test_the_plugin_and_the_cases_import_ops_directly():
    """Not through the lazy facade (``from dsv41_kernels import row_argmax``), which hides the
    edge from static tools."""
    facade = {f"{PACKAGE}.{name}" for name in dsv41_kernels._EXPORTS}
    for path in ROOT.rglob("*.py"):
        module = module_name(path)
        above = ("sglang_plugin", "cases", "check", "calibration", "calibrate")
        if module.startswith(tuple(f"{PACKAGE}.{name}" for name in above)):
            through = facade.intersection(imported(path))
            assert not through, f"{module} imports {sorted(through)} through the package facade"


def test_device_queries_live_in_devices():
    edges = graph()
    assert edges[f"{PACKAGE}.devices"] <= {f"{PACKAGE}.interpreter"}
    jit = (ROOT / "jit.py").read_text()
    for query in ("get_device_capability", "get_device_properties", "multi_processor_count"):
        assert query not in jit, f"jit.py asks the device ({query}): that is devices.py's job"


def test_the_package_imports_nothing_of_a_checkout():
    for path in ROOT.rglob("*.py"):
        for name in imported(path):
            top = name.split(".")[0]
            assert top not in CHECKOUT, f"{module_name(path)} imports {name} (not in a wheel)"


def test_the_plugin_imports_neither_the_calibration_nor_the_cli():
    below = {f"{PACKAGE}.{name}" for name in ("calibration", "calibrate_cli", "cli")}
    for module, targets in graph().items():
        if module.startswith(f"{PACKAGE}.sglang_plugin"):
            reached = {t for t in targets if any(t == b or t.startswith(b + ".") for b in below)}
            assert not reached, f"{module} imports {sorted(reached)}"


def test_the_calibration_imports_sglang_lazily():
    """At module level a calibration module imports no SGLang (nor pytest): the package imports
    where SGLang does not, and the drivers' lists of cases are made without it."""
    for path in (ROOT / "calibration").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in ("sglang", "pytest"), f"{path.name}: {name}"
