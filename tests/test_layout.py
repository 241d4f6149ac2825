"""The layout shows the architecture: formats -> model -> solvers -> launch, cli.py on top.

Every import of every project module (module-level or inside a function) is read from the
source with `ast`; the test fails on an import cycle between modules or on an import that goes
against the allowed direction between packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "formats", "solvers", "launch", "probe")
TOP_MODULES = ("render", "cli")

# Which project packages each one may import (besides itself). The cost model imports nothing
# of ours; formats build specs for it; solvers search with it; launch writes what a plan becomes;
# render prints; cli wires them together.
ALLOWED = {
    "model": set(),
    "formats": {"model"},
    "solvers": {"model"},
    "launch": {"model", "formats"},
    "probe": {"model", "formats"},  # gemm.py fits the cost model and writes a profile
    "render": {"model", "formats", "solvers", "launch"},
    "cli": {"model", "formats", "solvers", "launch", "render"},
}


def project_modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).glob("*.py")):
            mods[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    for m in TOP_MODULES:
        mods[m] = ROOT / f"{m}.py"
    return mods


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules imported by `name` anywhere in its source (relative imports resolved,
    `from pkg import mod` counted as importing pkg.mod)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> nx.DiGraph:
    mods = project_modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for dep in imports_of(name, path, set(mods)):
            g.add_edge(name, dep)
    return g


def top(name: str) -> str:
    return name.split(".")[0]


def test_no_import_cycles():
    g = import_graph()
    # a package's __init__ importing its own modules is not a cycle of the architecture
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if a == top(b) and a in PACKAGES])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles}"


def test_imports_go_one_way():
    bad = [f"{a} imports {b}" for a, b in import_graph().edges
           if top(a) != top(b) and top(b) not in ALLOWED[top(a)]]
    assert not bad, "imports against the direction formats -> model -> solvers -> launch: " + \
        "; ".join(bad)


def test_the_model_reads_and_writes_no_files():
    """model/ is the cost model only: no file formats, no paths, no TOML or JSON."""
    banned = {"json", "tomllib", "csv", "pathlib", "importlib.resources", "matplotlib", "rich",
              "typer"}
    found = []
    for name, path in project_modules().items():
        if top(name) != "model":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{name}: {m}" for m in mods if m in banned or m.split(".")[0] in banned]
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                found.append(f"{name}: open()")
    assert not found, found


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_every_package_is_checked(pkg):
    """The rules above name every package that exists, and the walk finds modules in each."""
    assert any(top(m) == pkg for m in project_modules())


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function and a relative import both count."""
    f = tmp_path / "x.py"
    f.write_text("from .plan import Shape\n\ndef g():\n    from solvers.search import solve\n")
    known = {"model.x", "model.plan", "solvers.search", "solvers"}
    assert imports_of("model.x", f, known) == {"model.plan", "solvers.search"}
