"""The import rules of the source packages (issue 27 item 3), read statically with :mod:`ast`.

Nothing here imports the code it checks, so the rules hold in both environments (the xApp's has
no torch or vLLM). Every ``import`` and ``from ... import`` statement of a file counts, at any
depth (inside functions and ``if TYPE_CHECKING:`` blocks too): a lazy import is still a
dependency. Rules:

1. the deployables (``agent/``, ``xapp/``) import nothing of the harness (``pallas_eval``) or
   of the offline tools (``pallas_tools``);
2. no import circle, neither between modules of ``agent``, ``xapp``, ``pallas_common``,
   ``pallas_eval`` and ``pallas_tools`` nor between those five packages;
4. no circle through a package's ``__init__``: importing ``a.b.c`` runs ``a`` and ``a.b`` first,
   so an import of ``a.b.c`` also depends on what ``a.b/__init__.py`` imports (a module's own
   enclosing packages aside: they are already loading). An import put inside a function to
   dodge such a circle is still an edge here, so it fails;
3. the code vLLM loads (``--kv-connector-module``: ``agent.connector`` and the harness's
   ``pallas_eval.emulated_connector``), with everything it imports transitively, imports nothing
   of ``agent`` outside ``agent/connector/`` (``agent/__init__.py``, which a package import
   runs, included).

Each test lists its offenders as ``module:line -> imported module``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "xapp", "pallas_common", "pallas_eval", "pallas_tools")
DEPLOYABLES = ("agent", "xapp")
HARNESS = "pallas_eval"
TOOLS = "pallas_tools"
VLLM_ROOTS = ("agent.connector", "pallas_eval.emulated_connector")
CONNECTOR = "agent.connector"


@dataclass(frozen=True)
class Edge:
    """One import statement's resolved target: ``src`` imports ``dst`` at ``src``'s ``line``."""

    src: str
    dst: str
    line: int

    def __str__(self) -> str:
        return f"{self.src}:{self.line} -> {self.dst}"


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (source file, is a package ``__init__``) for every ``.py`` file under
    ``root/<package>`` (``__pycache__`` and non-identifier folders skipped)."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if not all(p.isidentifier() for p in parts):
                continue
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _deepest(name: str, known: dict) -> str | None:
    """The longest prefix of dotted ``name`` that is a known module, or None (outside the tree)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, list[Edge]]:
    """Module -> its import edges into the checked packages (self-imports dropped).

    ``import a.b.c`` and ``from a.b import c`` resolve to the deepest module that exists
    (``a.b.c`` when it is a module, else ``a.b``); relative imports resolve from the file's
    package. Raises SyntaxError for a file that does not parse.
    """
    mods = modules(root, packages)
    graph: dict[str, list[Edge]] = {}
    for name, (path, is_pkg) in mods.items():
        here = name if is_pkg else name.rpartition(".")[0]
        found: list[Edge] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                dst = _deepest(t, mods)
                if dst is not None and dst != name:
                    found.append(Edge(name, dst, node.lineno))
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted;
    a graph without import circles has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _top(module: str) -> str:
    return module.split(".")[0]


def harness_imports(graph: dict[str, list[Edge]], outside: tuple[str, ...] = (HARNESS, TOOLS)) -> list[str]:
    """Rule 1's offenders: edges from a deployable module into the harness or the tools."""
    return [str(e) for es in graph.values() for e in es
            if _top(e.src) in DEPLOYABLES and _top(e.dst) in outside]


def import_circles(graph: dict[str, list[Edge]]) -> list[str]:
    """Rule 2's offenders: each module circle, then each circle between top-level packages, with
    the edges that close it."""
    mod_graph = {m: {e.dst for e in es} for m, es in graph.items()}
    out = []
    for comp in circles(mod_graph):
        inside = set(comp)
        out.append("modules: " + "; ".join(str(e) for m in comp for e in graph[m] if e.dst in inside))
    pkg_graph: dict[str, set[str]] = {}
    for m, es in graph.items():
        pkg_graph.setdefault(_top(m), set()).update(_top(e.dst) for e in es if _top(e.dst) != _top(m))
    for comp in circles(pkg_graph):
        inside = set(comp)
        out.append("packages: " + "; ".join(str(e) for es in graph.values() for e in es
                                            if _top(e.src) in inside and _top(e.dst) in inside
                                            and _top(e.src) != _top(e.dst)))
    return out


def package_circles(graph: dict[str, list[Edge]]) -> list[str]:
    """Rule 4's offenders: module circles once every import edge also reaches the package
    ``__init__`` modules that importing its target runs (:func:`_loaded`), the importer's own
    enclosing packages left out."""
    full: dict[str, set[str]] = {}
    via: dict[tuple[str, str], Edge] = {}
    for m, es in graph.items():
        for e in es:
            for p in _loaded(e.dst):
                if p in graph and p != m and not m.startswith(p + "."):
                    full.setdefault(m, set()).add(p)
                    via.setdefault((m, p), e)
    out = []
    for comp in circles(full):
        inside = set(comp)
        out.append("through packages: " + "; ".join(
            f"{via[(m, p)]}" + ("" if via[(m, p)].dst == p else f" (runs {p})")
            for m in comp for p in sorted(full.get(m, ())) if p in inside))
    return out


def _loaded(module: str) -> list[str]:
    """``module`` and the package ``__init__`` modules importing it runs (``a.b.c``: a, a.b)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def vllm_side_escapes(graph: dict[str, list[Edge]], roots: tuple[str, ...] = VLLM_ROOTS) -> list[str]:
    """Rule 3's offenders: edges, reachable from ``roots`` (every submodule of a root package
    included), into ``agent`` modules outside :data:`CONNECTOR` (the ``agent`` package's own
    ``__init__`` allowed: it is followed instead)."""
    seen: set[str] = set()
    todo = [m for m in graph for r in roots if m == r or m.startswith(r + ".")]
    out: list[str] = []
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(p for p in _loaded(m) if p in graph)
        for e in graph.get(m, ()):
            if (_top(e.dst) == "agent" and e.dst != "agent" and e.dst != CONNECTOR
                    and not e.dst.startswith(CONNECTOR + ".")):
                out.append(str(e))
            todo.append(e.dst)
    return sorted(set(out))


# ---------------------------------------------------------------------------------- the checker

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return tmp_path


def test_checker_finds_each_kind_of_offence(tmp_path):
    root = _tree(tmp_path, {
        "agent/app.py": "def f():\n    from pallas_eval.models import build\n",
        "xapp/a.py": "from . import b\n",
        "xapp/b.py": "import xapp.a\n",
        "agent/ipc.py": "X = 1\n",
        "agent/connector/__init__.py": "",
        "agent/connector/mover.py": "from ..ipc import X\n",
        "pallas_eval/models.py": "import agent.app\n",
    })
    g = edges(root)
    assert harness_imports(g) == ["agent.app:2 -> pallas_eval.models"]
    found = import_circles(g)
    assert found[0] == "modules: agent.app:2 -> pallas_eval.models; pallas_eval.models:1 -> agent.app"
    assert "modules: xapp.a:1 -> xapp.b; xapp.b:1 -> xapp.a" in found
    assert found[-1].startswith("packages: ") and "agent.app:2 -> pallas_eval.models" in found[-1]
    assert vllm_side_escapes(g) == ["agent.connector.mover:1 -> agent.ipc"]


def test_checker_finds_a_deployable_importing_the_tools_and_lets_the_tools_import_the_xapp(tmp_path):
    root = _tree(tmp_path, {
        "xapp/e2/__init__.py": "",
        "xapp/e2/sm_rc.py": "X = 1\n",
        "xapp/app.py": "def f():\n    from pallas_tools.radio import drive\n",
        "pallas_tools/radio.py": "from xapp.e2 import sm_rc\n",
    })
    g = edges(root)
    assert harness_imports(g) == ["xapp.app:2 -> pallas_tools.radio"]
    assert harness_imports(g, outside=(HARNESS,)) == []
    assert import_circles(g) == ["packages: xapp.app:2 -> pallas_tools.radio; pallas_tools.radio:1 -> xapp.e2.sm_rc"]


def test_checker_passes_a_clean_tree(tmp_path):
    root = _tree(tmp_path, {
        "agent/app.py": "from agent.connector import link\nimport pallas_common.timing\n",
        "agent/connector/__init__.py": "",
        "agent/connector/link.py": "from pallas_common import timing\n",
        "pallas_common/timing.py": "import math\n",
        "pallas_eval/cli.py": "from agent import app\nfrom xapp import main\n",
        "xapp/main.py": "from pallas_common.timing import x\n",
    })
    g = edges(root)
    assert (harness_imports(g), import_circles(g), vllm_side_escapes(g)) == ([], [], [])


# ---------------------------------------------------------------------------------- the rules

def test_deployables_import_nothing_of_the_harness_or_the_tools():
    assert harness_imports(edges(ROOT)) == []


def test_no_import_circle():
    assert import_circles(edges(ROOT)) == []


def test_no_circle_through_a_package_init():
    assert package_circles(edges(ROOT)) == []


def test_checker_finds_a_lazy_import_that_dodges_a_package_circle(tmp_path):
    root = _tree(tmp_path, {
        "agent/session.py": "def f():\n    from agent.migration.states import check\n",
        "agent/migration/__init__.py": "from agent.migration.engine import E\n",
        "agent/migration/engine.py": "from agent.session import S\nfrom agent.migration.states import X\n",
        "agent/migration/states.py": "X = 1\n",
    })
    g = edges(root)
    assert import_circles(g) == []          # no module circle: states imports nothing back
    found = package_circles(g)
    assert len(found) == 1 and "agent.session:2 -> agent.migration.states (runs agent.migration)" in found[0]
    # The same tree with states outside the package that imports the session: clean.
    (root / "agent/states.py").write_text("X = 1\n")
    (root / "agent/session.py").write_text("from agent.states import check\n")
    assert package_circles(edges(root)) == []


def test_code_loaded_in_vllm_imports_no_agent_module_outside_the_connector():
    assert vllm_side_escapes(edges(ROOT)) == []
