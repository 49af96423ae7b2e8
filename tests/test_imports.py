"""The package's import graph: dependencies point one way, and quick commands stay quick.

The graph is read from the source with ``ast``: every ``import`` of a ``rocmforge`` module,
at the top of a file or inside a function (a lazy import is still a dependency), except those
under ``if TYPE_CHECKING:``, which never run and only name types for annotations.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rocmforge"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, name: str) -> set[str]:
    """Every dotted name ``path`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def import_graph() -> dict[str, set[str]]:
    """rocmforge module -> the rocmforge modules it imports (itself excluded)."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        # `from rocmforge import x`: the package's __init__ runs, but the dependency is on x.
        targets = imported_names(path, name) & set(paths)
        if any(t.startswith(("rocmforge.",)) for t in targets):
            targets.discard("rocmforge")
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_graph_sees_real_imports():
    # The walker must find what the modules plainly import, or the acyclic test proves nothing.
    graph = import_graph()
    assert len(graph) > 30
    assert "rocmforge.errors" in graph["rocmforge.config"]
    assert "rocmforge.arch" in graph["rocmforge.config"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_base_imports_nothing_above_it():
    # errors, console and fsutil sit under everything else.
    graph = import_graph()
    for low in ("rocmforge.errors", "rocmforge.console", "rocmforge.fsutil"):
        assert graph[low] <= {"rocmforge.errors"}, (low, graph[low])


def loaded_modules(argv: list[str]) -> set[str]:
    """The rocmforge modules a fresh interpreter has imported after ``python -m rocmforge ARGV``."""
    code = (
        "import sys\nfrom rocmforge.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(*sorted(m for m in sys.modules if m.startswith('rocmforge')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(proc.stdout.split()) & {m for m in import_graph()}


def test_version_imports_no_command():
    assert loaded_modules(["--version"]) == {"rocmforge", "rocmforge.cli", "rocmforge.errors"}


def test_a_command_imports_its_module_only():
    # `inspect` reads .so files: it must not pay for the build, the host probes or the rules.
    loaded = loaded_modules(["inspect", "--help"])
    assert "rocmforge.verify.inspect" in loaded
    assert not loaded & {
        "rocmforge.build.package",
        "rocmforge.host",
        "rocmforge.diagnose.engine",
        "rocmforge.sources.checkout",
    }


def test_listing_the_sessions_loads_only_the_config():
    # `nox -l` reads the noxfile: the config is all it needs; sessions import their modules.
    code = (
        "import runpy, sys\n"
        f"runpy.run_path({str(ROOT / 'noxfile.py')!r})\n"
        "print(*sorted(m for m in sys.modules if m.startswith('rocmforge')))"
    )
    env = {**os.environ, "ROCMFORGE_CONFIG": str(ROOT / "build_config.toml")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == {"rocmforge", "rocmforge.arch", "rocmforge.config", "rocmforge.errors"}


def test_rich_is_imported_when_something_prints():
    # Importing the build (a package session) must not pay for rich until something prints.
    code = (
        "import sys\nimport rocmforge.build.package\nfrom rocmforge.console import console\n"
        "before = 'rich' in sys.modules\nconsole.print('hello', end='')\n"
        "print('', before, 'rich.console' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stderr == "hello"
    assert proc.stdout.split() == ["False", "True"]


STAGES = (
    "rocmforge.sources.checkout",
    "rocmforge.build.package",
    "rocmforge.verify.checks",
    "rocmforge.bench.runner",
    "rocmforge.diagnose.engine",
)


def test_the_shared_base_imports_no_stage():
    # config, host, arch, cli, ... sit under every stage folder: an import of a stage from there
    # would point up. (cli names its commands' modules as strings, imported when one runs.)
    for module, targets in import_graph().items():
        if module.count(".") == 1 and not module.startswith(STAGES):
            assert not {t for t in targets if t.startswith(STAGES)}, (module, targets)
