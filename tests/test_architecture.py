"""The layout promises of docs/architecture.md, checked on the source tree.

Small modules (at most 400 lines) and no import cycle between the library's
modules: a cycle is what made `strategies/` hard to split before (issue 21).
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_replicator"
MAX_LINES = 400


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(name, path):
    """keras_replicator modules that `name` imports, anywhere in its source.

    Imports inside functions count too: a deferred import that closes a cycle
    only hides it (the old `strategies/_ps_keras.py` <-> `parameter_server.py`
    pair). `from package import module` counts the module.
    """
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    found = set()
    for statement in ast.walk(tree):
        if isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level:
                anchor = name.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (statement.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in statement.names)
    return {m for m in found if m.startswith("keras_replicator")}


def _graph():
    """Module -> the modules whose import it triggers.

    Importing `a.b.c` runs `a` and `a.b` first, except the packages the importer
    lives in (already being imported when its own code runs). A package's
    `__init__` importing its submodules is an edge like any other, so a cycle
    through a package's `__init__` is found too.
    """
    modules = dict(_modules())
    graph = {}
    for name, path in modules.items():
        own_packages = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in _imports(name, path):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name and prefix not in own_packages:
                    edges.add(prefix)
        graph[name] = edges
    return graph


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def test_no_import_cycle_between_modules():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: str(v))
def test_module_is_small(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]
