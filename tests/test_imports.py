"""The project's import graph: no cycles between modules or packages, duckdb only in the store,
and a torch-free runner front.

The graph is read from the source with `ast`, so it holds every import a module
can run: top-level ones, lazy ones inside functions, `from pkg import module`.
A lazy import is still a cycle: it only moves the failure from import time to
the first call that takes that path.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("batch", "engine", "tools", "evals", "trainer")

# Known cycles outside engine/, each the exact set of modules of one strongly
# connected component. Do not add to this list: break the cycle instead.
KNOWN_CYCLES: set[frozenset[str]] = set()


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, else its longest module prefix."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `module` imports anywhere in its source (functions included)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package (a package's own __init__ is level 1 of itself)
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"  # `from pkg import module`
                found.add(submodule if submodule in modules else _resolve(base, modules))
    found.discard(None)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module, for the failure message."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to `start`
        nxt = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return paths[node] + [start]
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    nxt.append(succ)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def test_the_graph_reader_sees_lazy_and_from_imports(tmp_path):
    source = "import engine.api\nfrom engine import config\n\ndef f():\n    from engine.factory import load_backend\n"
    (tmp_path / "m.py").write_text(source)
    modules = {"engine": REPO / "engine/__init__.py", "engine.api": None, "engine.config": None,
               "engine.factory": None}
    assert imports_of("batch.m", tmp_path / "m.py", modules) == {"engine.api", "engine.config", "engine.factory"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    graph = import_graph()
    assert {"batch.run.admission", "engine.api", "engine.factory", "engine.config"} <= graph.keys()
    new = [c for c in strongly_connected(graph) if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(
        f"{' -> '.join(a_cycle(graph, c))}  (all of {', '.join(c)})" for c in new)


def test_known_cycles_are_still_there():
    """An entry of KNOWN_CYCLES whose cycle is gone must leave the list (so it cannot come back)."""
    found = {frozenset(c) for c in strongly_connected(import_graph())}
    assert not KNOWN_CYCLES - found, f"these cycles are gone, remove them from KNOWN_CYCLES: {KNOWN_CYCLES - found}"
    assert not any(m.startswith("engine.") for c in KNOWN_CYCLES for m in c)  # engine/ is a DAG, no exceptions


def package_of(module: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to: itself for a package's __init__, else its parent."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _nested(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (batch.cli, batch.run, evals, ...).

    A package and the packages nested in it are not edges of this graph (engine.kernels
    uses engine's leaf modules, engine's runner uses the kernels): the module graph has
    no cycles, and `test_the_batch_root_is_a_leaf` keeps batch's own modules below its
    subpackages."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        package = package_of(module, modules)
        graph.setdefault(package, set()).update(package_of(m, modules) for m in imported)
    for package, imported in graph.items():
        imported -= {other for other in imported if other == package or _nested(package, other)}
    return graph


def test_no_package_cycles():
    graph = package_graph()
    assert {"batch.cli", "batch.run", "batch.store", "batch.harmony", "evals"} <= graph.keys()
    cycles = strongly_connected(graph)
    assert not cycles, "package cycles:\n" + "\n".join(" -> ".join(a_cycle(graph, c)) for c in cycles)


def test_the_batch_root_is_a_leaf():
    """batch/'s own modules (its docstring, text tables) import none of its subpackages."""
    modules, graph = project_modules(), import_graph()
    root = [m for m in modules if package_of(m, modules) == "batch"]
    assert {"batch", "batch.tables"} <= set(root)
    assert not {m: graph[m] for m in root if any(d.startswith("batch.") for d in graph[m])}


def test_only_the_cli_composes_batch_and_evals():
    """evals/ reads batch's store; of batch/, only the CLI imports evals (to register its commands)."""
    graph = import_graph()
    importers = {m for m, deps in graph.items() if m.startswith("batch.") and any(d.startswith("evals") for d in deps)}
    assert importers and all(m.startswith("batch.cli.") for m in importers), importers


def _imports_duckdb(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import) and any(a.name.partition(".")[0] == "duckdb" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] == "duckdb" and not node.level:
            return True
    return False


def test_only_the_store_imports_duckdb():
    """The store package is the one that speaks SQL; tools/corpus.py's in-memory search index aside."""
    modules = project_modules()
    outside = sorted(m for m, path in modules.items()
                     if _imports_duckdb(path) and not m.startswith("batch.store") and m != "tools.corpus")
    assert not outside, f"import duckdb outside batch/store/: {outside}"


def test_the_duckdb_check_sees_lazy_imports(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    import duckdb.typing\n")
    (tmp_path / "n.py").write_text("from .duckdb import x\n")  # a relative module of that name is not duckdb
    assert _imports_duckdb(tmp_path / "m.py") and not _imports_duckdb(tmp_path / "n.py")


def test_the_token_contract_imports_only_the_standard_library():
    modules = project_modules()
    tree = ast.parse(modules["engine.api"].read_text())
    imported = {alias.name.partition(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.partition(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_engine_factory_is_imported_by_no_backend_module():
    graph = import_graph()
    importers = {m for m, deps in graph.items() if "engine.factory" in deps and m.startswith("engine.")}
    assert importers <= {"engine.bench"}, importers  # the benchmark loads backends by name too


def test_reading_and_admitting_lines_does_not_import_torch():
    code = ("import sys, batch.run.reader, batch.run.admission, engine.api\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules)\n"
            "print(','.join(heavy))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported {done.stdout.strip()} (find the path: python -X importtime -c ...)"
