"""The package's layers (docs/ARCHITECTURE.md): imports point down and close no circle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pmemwal

ROOT = Path(pmemwal.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that ``name`` imports, in a function or not (``from X
    import Y`` counts as X.Y where that is a module); its own parent packages left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return out


def test_no_import_closes_a_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "pmemwal.wal.api" in graph["pmemwal.wal"]  # (the walk sees what it should)
    graphlib.TopologicalSorter(graph).prepare()  # CycleError names the circle


def test_the_library_imports_no_tool_or_adapter() -> None:
    modules = _modules()
    above = ("pmemwal.tools", "pmemwal.integrations")
    for name, path in modules.items():
        if not name.startswith(above):
            assert not {t for t in _imports(name, path, modules) if t.startswith(above)}, name
