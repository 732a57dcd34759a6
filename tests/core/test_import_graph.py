"""The layout stays true: no import circles in `sectr` or `sessions_app`, and the core
never imports Django.

Every `import` counts, also those inside functions and under `if TYPE_CHECKING:` (a
function-local import hides a circle from the interpreter, not from a reader). An
import names the most specific module of ours it reaches: `from sessions_app.journal
import publish` is an edge to `sessions_app.journal.publish`, `from sessions_app.journal
import get_journal` one to `sessions_app.journal` (its `__init__`).
"""

from __future__ import annotations

from pathlib import Path

# One reading of the imports for this test and the script that prints the graph.
from scripts.import_graph import circles, imported_names, package_modules, resolve

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sectr", "sessions_app")
DJANGO_TOP_LEVEL = {"django", "channels", "channels_redis", "daphne", "asgiref", "django_htmx"}


def our_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        modules.update(package_modules(package))
    return modules


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, _line in imported_names(path, name):
            resolved = resolve(target, modules)
            if resolved is not None and resolved != name:
                graph[name].add(resolved)
    return graph


cycles = circles  # strongly connected components of more than one, from the script


def test_it_finds_a_circle_when_there_is_one() -> None:
    # The checker itself can fail: a three-module circle and a clean chain.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_it_resolves_function_local_and_relative_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe_module.py"
    probe.write_text("def f():\n    from sessions_app.journal import publish\n    from . import runs\n")
    names = {target for target, _line in imported_names(probe, "sessions_app.probe_module")}
    assert names == {"sessions_app.journal.publish", "sessions_app.runs"}


def test_sectr_and_sessions_app_have_no_import_circles() -> None:
    graph = import_graph()
    assert "sessions_app.runs" in graph and "sectr.runtime" in graph  # it read the tree
    assert cycles(graph) == []


def test_the_core_never_imports_django() -> None:
    offenders = []
    for name, path in our_modules().items():
        if not name.startswith("sectr"):
            continue
        for target, line in imported_names(path, name):
            if target.split(".")[0] in DJANGO_TOP_LEVEL:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert offenders == []


def test_lower_layers_never_import_the_web_layers() -> None:
    """The journal, the Run lifecycle and the actions sit below the pages, the API and
    the worker loop: they may be imported by those, never the other way round."""
    graph = import_graph()
    lower = ("sessions_app.models", "sessions_app.journal", "sessions_app.runs", "sessions_app.actions")
    upper = (
        "sessions_app.chat",
        "sessions_app.moderation.views",
        "sessions_app.moderation.consumers",
        "sessions_app.review.views",
        "sessions_app.accounts",
        "sessions_app.api",
        "sessions_app.worker",
        "sessions_app.web",
    )
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(lower)
        for target in targets
        if target.startswith(upper)
    )
    assert wrong == []


def test_the_page_folders_never_import_each_other() -> None:
    """The chat, the moderation pages and the review pages stand side by side on one
    floor: what two of them show alike lives in sessions_app.display, below them."""
    graph = import_graph()
    pages = ("chat", "moderation", "review")
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if (source := folder_of(module)) in pages and (reached := folder_of(target)) in pages and source != reached
    )
    assert wrong == []


def test_every_folder_of_sessions_app_stands_on_one_floor() -> None:
    """No folder (sub-package or top-level module) of sessions_app imports one that
    imports it back, directly or around a longer loop: each has one floor of the graph."""
    graph = {name: targets for name, targets in import_graph().items() if name.startswith("sessions_app")}
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder_of(module), set()).update(
            folder_of(target) for target in targets if target.startswith("sessions_app")
        )
    for folder, targets in folders.items():
        targets.discard(folder)
        for target in targets:
            folders.setdefault(target, set())
    assert "journal" in folders and "telemetry" in folders  # it read the tree
    assert cycles(folders) == []


def test_the_journal_and_the_run_lifecycle_import_only_lower_folders() -> None:
    """Metrics and tracing sit in telemetry/, the database-thread helpers in dbthread.py:
    the journal, runs and media reach them without reaching the ops pages or retention."""
    graph = import_graph()
    low = ("sessions_app.journal", "sessions_app.runs", "sessions_app.media", "sessions_app.telemetry")
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith(low)
        for target in targets
        if target.startswith(("sessions_app.ops", "sessions_app.display", "sessions_app.actions"))
    )
    assert wrong == []


def folder_of(module: str) -> str:
    """`sessions_app.journal.database` -> `journal`, `sessions_app.runs` -> `runs`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]
