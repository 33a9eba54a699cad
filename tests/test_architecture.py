"""The package structure, enforced from the imports (docs/architecture.md explains the layers).

Every import in ``egraft/`` is read from the source (module level and inside
functions alike, since a function-level import is still a dependency), and
three things are checked: an import only goes to the importer's own package
or to a lower layer; no import circle exists between modules; no module
grows past ``MAX_LINES``.  A lower layer also must not pull in the heavy
libraries of a higher one (the IR imports no torch, jax, triton or egglog).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "egraft"

# Low to high.  A package may import its own modules and any package of a LOWER
# layer; packages on one layer are siblings and never import each other.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("env",),  # the EGRAFT_* on/off switches, read one way
    ("ir",),
    ("runtime",),  # runtime: loads artifacts; backends import its manifest writer
    ("frontend", "backends", "rewrites", "measure"),
    ("search",),
    ("testing", "models", "api", "plugins"),  # api: egraft.compile; plugins: torch.compile / serving glue
    ("__init__",),  # the package facade: egraft.trace, egraft.ir, lazily the stages
    ("cli",),
]

# third-party libraries a package must never import (directly, at any depth of its own code)
FORBIDDEN = {
    "errors": {"numpy", "torch", "jax", "jaxlib", "triton", "egglog", "deap"},
    "env": {"numpy", "torch", "jax", "jaxlib", "triton", "egglog", "deap"},
    "ir": {"torch", "jax", "jaxlib", "triton", "egglog", "deap"},
    "rewrites": {"torch", "jax", "jaxlib", "triton", "deap"},
    "backends": {"egglog", "deap"},
    "frontend": {"jax", "jaxlib", "triton", "egglog", "deap"},
    "measure": {"egglog", "deap"},
    "runtime": {"egglog", "deap"},
}

MAX_LINES = 450


def _rank() -> dict[str, int]:
    return {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Fully qualified modules imported by one module (a ``from pkg import sub`` names the submodule)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(mod)
    return out


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for dep in _imports(name, path, set(mods)):
            g.add_edge(name, dep)
    return g


def test_every_package_has_a_layer():
    tops = {_top(m) for m in _modules()}
    assert tops <= set(_rank()), f"packages without a layer in LAYERS: {sorted(tops - set(_rank()))}"


def test_imports_go_down_the_layers(import_graph):
    rank = _rank()
    bad = []
    for src, dst in import_graph.edges:
        if not (dst == "egraft" or dst.startswith("egraft.")):
            continue
        a, b = _top(src), _top(dst)
        if a != b and rank[b] >= rank[a]:
            bad.append(f"{src} -> {dst}  ({a} is layer {rank[a]}, {b} is layer {rank[b]})")
    assert not bad, "imports that go up or sideways between layers:\n" + "\n".join(sorted(bad))


def test_no_heavy_imports_in_low_layers(import_graph):
    bad = []
    for src, dst in import_graph.edges:
        lib = dst.split(".")[0]
        if lib in FORBIDDEN.get(_top(src), ()):
            bad.append(f"{src} imports {dst}")
    assert not bad, "forbidden library imports:\n" + "\n".join(sorted(bad))


def test_no_import_circles(import_graph):
    inner = import_graph.subgraph(n for n in import_graph if n.startswith("egraft"))
    cycles = [c for c in nx.simple_cycles(inner) if len(c) > 1]
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in cycles[:10])


def test_modules_stay_small():
    big = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them along their seams): {big}"


def test_the_checker_sees_a_violation(tmp_path):
    """Negative control: an upward import is reported, and a package import names its submodule."""
    pkg = tmp_path / "egraft" / "ir"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("from ..search import space\nfrom . import y\ndef f():\n    import torch\n")
    found = _imports("egraft.ir.x", pkg / "x.py", {"egraft.search.space", "egraft.ir.y"})
    assert found == {"egraft.search.space", "egraft.ir.y", "torch"}
    assert _rank()[_top("egraft.search.space")] > _rank()[_top("egraft.ir.x")]
