"""The layout promises of docs/architecture.md, checked on the source tree.

Small modules (at most 400 lines, a reviewed allow-list aside) and no import cycle,
neither between the library's modules (a cycle is what made `strategies/` hard to
split before, issue 21) nor between its packages (issue 35: imports point down).
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_replicator"
MAX_LINES = 400
# Modules allowed over MAX_LINES, each with the reason it stays one module. Review
# an entry whenever its module changes; prefer finding the module's second concept.
OVER_THE_CAP: dict[str, str] = {}


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


def _package_of(module: str) -> str:
    """The first-level subpackage holding `module`; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph):
    """Package -> the packages its modules' imports trigger (module edges lifted)."""
    packages = {}
    for module, targets in graph.items():
        edges = packages.setdefault(_package_of(module), set())
        edges.update(_package_of(t) for t in targets)
    for package, edges in packages.items():
        edges.discard(package)
    return packages


def test_no_import_cycle_between_modules():
    assert _cycles(_graph()) == []


def test_no_import_cycle_between_packages():
    graph = _graph()
    cycles = _cycles(_package_graph(graph))
    culprits = {
        f"{module} -> {target}"
        for cycle in cycles
        for module, targets in graph.items()
        for target in targets
        if _package_of(module) in cycle
        and _package_of(target) in cycle
        and _package_of(module) != _package_of(target)
    }
    assert cycles == [], f"package cycles {cycles} through: {sorted(culprits)}"


def test_modules_are_small():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules()}
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    unexplained = {
        name: lines for name, lines in over.items() if name not in OVER_THE_CAP
    }
    assert unexplained == {}, (
        f"modules over {MAX_LINES} lines: {unexplained}. Split each by concept (or, "
        "reviewed, add it to OVER_THE_CAP with the reason it stays one module)."
    )
    stale = sorted(set(OVER_THE_CAP) - set(over))
    assert stale == [], f"OVER_THE_CAP lists modules now within the cap: {stale}"


def test_packages_are_first_level_subpackages():
    graph = {
        "keras_replicator.a.x": {"keras_replicator.b.y.z", "keras_replicator.a.w"},
        "keras_replicator.a.w": set(),
        "keras_replicator.b.y.z": {"keras_replicator._top"},
        "keras_replicator._top": {"keras_replicator.a"},
    }
    packages = _package_graph(graph)
    assert packages["keras_replicator.a"] == {"keras_replicator.b"}
    assert _cycles(packages) == [
        ["keras_replicator._top", "keras_replicator.a", "keras_replicator.b"]
    ]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]
