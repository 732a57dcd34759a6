"""Print the folder-level import graph of sessions_app and the arrows that run back up.

Run: `.venv/bin/python scripts/import_graph.py` (no Django set-up needed: it reads the
source with `ast`). Every import counts, also those inside functions and under
`if TYPE_CHECKING:`.

A "folder" is a sub-package of sessions_app (`journal`, `chat`, ...) or a top-level
module (`runs`, `access`, ...). The script prints:

1. each folder's floor (0 = imports no other folder) and the folders it imports;
2. the folder-level circles (strongly connected components of more than one folder):
   every arrow inside such a circle runs back up somewhere, so they are listed with
   the module-level imports behind them.

Floors are only well-defined when there are no circles; inside a circle the script
gives all members the same floor.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sessions_app"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package: str = PACKAGE) -> dict[str, Path]:
    modules = {}
    for path in (ROOT / package).rglob("*.py"):
        if "migrations" in path.parts:
            continue  # Django's generated files import only django and the models
        modules[module_name(path)] = path
    return modules


def imported_names(path: Path, name: str) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of everything `path` imports, relative imports resolved."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}", node.lineno


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The most specific module of ours that `target` names (None: not ours)."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def folder_of(module: str) -> str:
    """`sessions_app.journal.database` -> `journal`; `sessions_app.runs` -> `runs`;
    the package's own `__init__` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_edges(package: str = PACKAGE) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import between two modules of `package`."""
    modules = package_modules(package)
    edges = set()
    for name, path in modules.items():
        for target, line in imported_names(path, name):
            resolved = resolve(target, modules)
            if resolved is not None and resolved != name:
                edges.add((name, resolved, line))
    return sorted(edges)


def folder_graph(edges: list[tuple[str, str, int]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for importer, imported, _line in edges:
        source, target = folder_of(importer), folder_of(imported)
        graph.setdefault(source, set())
        graph.setdefault(target, set())
        if source != target:
            graph[source].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component (Tarjan), each sorted, singletons included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    return [component for component in strongly_connected(graph) if len(component) > 1]


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """A folder's floor: one above the highest folder it imports (circles share one)."""
    component_of = {}
    for component in strongly_connected(graph):
        for member in component:
            component_of[member] = tuple(component)
    floor: dict[tuple[str, ...], int] = {}

    def floor_of(component: tuple[str, ...]) -> int:
        if component not in floor:
            below = {component_of[t] for m in component for t in graph[m]} - {component}
            floor[component] = 1 + max((floor_of(c) for c in below), default=-1)
        return floor[component]

    return {member: floor_of(component) for member, component in component_of.items()}


def report(package: str = PACKAGE) -> str:
    edges = module_edges(package)
    graph = folder_graph(edges)
    floor = floors(graph)
    lines = [f"Folder-level import graph of {package} (floor: folder -> folders it imports)", ""]
    for name in sorted(graph, key=lambda n: (floor[n], n)):
        targets = ", ".join(sorted(graph[name])) or "-"
        lines.append(f"  {floor[name]:>2}  {name:<16} -> {targets}")
    found = circles(graph)
    lines += ["", f"Folder circles (arrows that run back up): {len(found)}"]
    for component in found:
        members = set(component)
        lines.append(f"  circle: {' <-> '.join(component)}")
        for importer, imported, line in edges:
            source, target = folder_of(importer), folder_of(imported)
            if source in members and target in members and source != target:
                path = package_modules(package)[importer].relative_to(ROOT)
                lines.append(f"    {source} -> {target}: {path}:{line} imports {imported}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1] if len(sys.argv) > 1 else PACKAGE))
