"""The layers of docs/architecture.md, read from the code: every import (``ast``, so imports
inside functions and under ``TYPE_CHECKING`` count too) must point down the table below, and no
two modules of ``arealite/``, ``servers/`` or ``workflows/`` import each other, directly or
around a loop; no file there is over 500 lines. A new sub-package fails here until it gets a
row, so the doc and the code cannot drift apart again. Imports by name count too: a string in ``arealite/``
or ``workflows/`` that names another unit's module (``package.module:Name`` or a dotted module)
is an import the ``ast`` walk cannot see, and fails here."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("arealite", "workflows", "benchmarks", "servers")

# unit -> the units it may import (besides itself). A unit is a top-level package, or an
# arealite sub-package. Top to bottom as in docs/architecture.md.
ALLOWED: dict[str, set[str]] = {
    "benchmarks": {"arealite.api", "arealite.utils", "arealite.observe", "arealite.backends",
                   "arealite.weights", "arealite.dataset", "arealite.engine", "arealite.rollout",
                   "arealite.launcher", "arealite.trainer", "arealite.demo", "arealite.agent",
                   "arealite.memplan", "arealite.tinker",
                   "workflows", "servers"},
    "arealite.cli": {"arealite.demo", "arealite.trainer", "arealite.launcher", "arealite.observe",
                     "arealite.dataset", "arealite.api", "arealite.utils", "arealite.memplan",
                     "arealite.tinker"},
    # the Tinker service: a room of its own over the trainer engine and the pool client
    "arealite.tinker": {"arealite.engine", "arealite.rollout", "arealite.weights",
                        "arealite.backends", "arealite.observe", "arealite.utils",
                        "arealite.api"},
    # the demo jobs, their toy models and datasets: on top, so core code never imports a toy
    "arealite.demo": {"arealite.launcher", "arealite.engine", "arealite.observe", "arealite.api",
                      "arealite.dataset", "arealite.utils"},
    "arealite.trainer": {"arealite.launcher", "arealite.engine", "arealite.rollout",
                         "arealite.weights", "arealite.backends", "arealite.observe",
                         "arealite.dataset", "arealite.utils", "arealite.api"},
    "arealite.launcher": {"arealite.backends", "arealite.observe", "arealite.dataset",
                          "arealite.utils", "arealite.api", "arealite.memplan"},
    # the memory planner: runs the engine under fake tensors; only the launcher (which asks it
    # before starting anything), the CLI and the benchmarks import it
    "arealite.memplan": {"arealite.engine", "arealite.weights", "arealite.observe",
                         "arealite.utils", "arealite.api"},
    # algorithms and engines: the trainer side and the client side never import each other;
    # both reach the servers' weights through the weights room
    "arealite.engine": {"arealite.weights", "arealite.observe", "arealite.utils", "arealite.api"},
    "arealite.rollout": {"arealite.weights", "arealite.backends", "arealite.observe",
                         "arealite.utils", "arealite.api"},
    # the agent proxy: client side, over any engine with agenerate (found by import path)
    "arealite.agent": {"arealite.utils", "arealite.api"},
    "workflows": {"arealite.api"},  # plus reward libraries; a user's workflow needs only the API
    # both halves of every weight transport, the push choreography, verification
    "arealite.weights": {"arealite.backends", "arealite.utils", "arealite.api"},
    # one module per inference backend: wire protocol, server command line, native transfer
    "arealite.backends": {"arealite.utils", "arealite.api"},
    # stats, logs, timing, traces, metrics
    "arealite.observe": {"arealite.utils", "arealite.api"},
    "arealite.dataset": {"arealite.api"},
    "arealite.utils": {"arealite.api"},
    "arealite.api": set(),
    "servers": set(),  # shares only the wire protocol with arealite
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "arealite" and len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    """Project modules imported anywhere in ``path`` (absolute imports; the project uses no
    relative ones)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            mods[".".join(f.relative_to(ROOT).with_suffix("").parts)] = f
    return mods


def import_arrows() -> dict[tuple[str, str], set[str]]:
    """(from unit, to unit) -> the ``module -> imported`` lines behind that arrow."""
    arrows: dict[tuple[str, str], set[str]] = defaultdict(set)
    for mod, path in _modules().items():
        for imp in _imports(path):
            src, dst = _unit(mod), _unit(imp)
            if src != dst:
                arrows[src, dst].add(f"{mod} -> {imp}")
    return arrows


def test_every_unit_has_a_row():
    units = {_unit(m) for m in _modules() if m.count(".") >= 1 or m in PACKAGES}
    units.discard("arealite.__init__")
    missing = sorted(u for u in units if u not in ALLOWED and not u.endswith("__init__"))
    assert not missing, f"add these to ALLOWED (and to docs/architecture.md): {missing}"


def test_no_import_points_up():
    bad = {k: sorted(v) for k, v in import_arrows().items() if k[1] not in ALLOWED.get(k[0], set())}
    assert not bad, "imports against the layers:\n" + "\n".join(
        f"  {s} -> {d}: {lines}" for (s, d), lines in sorted(bad.items()))


# The trees where no two modules may import each other, directly or around a loop.
CYCLE_FREE = ("arealite", "servers", "workflows")
MAX_LINES = 500


def module_graph(packages: tuple[str, ...] = CYCLE_FREE) -> dict[str, set[str]]:
    """module -> the project modules it imports, read from the source with ``ast``: imports at
    the top of a file, under ``if TYPE_CHECKING:`` and inside functions all count. A package is
    its ``__init__``; ``from package import name`` is the submodule ``name`` where there is one,
    else the package."""
    files = {}
    for pkg in packages:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in files.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            out.update(resolve(n) for n in names if n.split(".")[0] in packages)
        graph[mod] = out - {None, mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each circle: a strongly connected component of more than one module (Tarjan's
    algorithm, iterative), as its sorted members and one shortest loop through the first
    (``[a, b, ..., a]``); sorted."""
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
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    components.append(comp)
    cycles = []
    for comp in components:
        start = min(comp)
        paths = {start: [start]}  # breadth-first inside the component: a shortest way back
        queue = [start]
        while queue:
            v = queue.pop(0)
            nxt = sorted(graph[v] & comp)
            if start in nxt:
                cycles.append((sorted(comp), paths[v] + [start]))
                break
            for w in nxt:
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return sorted(cycles)


def test_no_import_cycle():
    cycles = import_cycles(module_graph())
    assert not cycles, "import circles:\n" + "\n".join(
        f"  {len(members)} modules {members}, e.g. {' -> '.join(loop)}"
        for members, loop in cycles)


def test_import_cycles_are_seen():
    """The check above finds what it must: a direct pair, a longer loop, none in a chain."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert import_cycles(graph) == [(["a", "b"], ["a", "b", "a"]),
                                    (["c", "d", "e"], ["c", "d", "e", "c"])]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_file_over_500_lines():
    long = {str(f.relative_to(ROOT)): n for pkg in CYCLE_FREE for f in (ROOT / pkg).rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by concept): {long}"


# A string that names a module, ``package.module`` or ``package.module:Name`` (import_by_path's
# form), as the whole constant.
IMPORT_PATH = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::[A-Za-z_][\w.]*)?")
# Modules started as their own process (``python -m``), the way the launcher meets the servers:
# a command line, not an import (the layers still share only the wire protocol).
PROCESS_ENTRIES = {"servers.launch_server", "servers.gateway"}


def string_imports(source: str, module: str) -> list[str]:
    """``line: 'string' -> unit`` for each string constant of ``source`` (the text of
    ``module``) that names a module of another unit by import path."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        m = IMPORT_PATH.fullmatch(node.value)
        if m is None or m.group(1).split(".")[0] not in PACKAGES or m.group(1) in PROCESS_ENTRIES:
            continue
        if ":" not in node.value and "." not in m.group(1):
            continue  # a bare word ("servers", "workflows") is a name, not a path
        if _unit(m.group(1)) != _unit(module):
            out.append(f"{node.lineno}: {node.value!r} -> {_unit(m.group(1))}")
    return out


def test_no_string_import_crosses_a_layer():
    """Defaults that name a class of another layer come from the shipped configs instead
    (``workflow.path``, ``workflow.kwargs.proxy``)."""
    bad = {mod: hits for mod, path in _modules().items()
           if mod.split(".")[0] in ("arealite", "workflows")
           and (hits := string_imports(path.read_text(), mod))}
    assert not bad, "string import paths across layers:\n" + "\n".join(
        f"  {m}: {h}" for m, h in sorted(bad.items()))


def test_string_imports_are_seen():
    """The check above sees what it must (this source is a fixture, not code of a layer)."""
    src = ('PATH = "workflows.rlvr:RLVRWorkflow"\n'
           'def f(proxy="arealite.agent.proxy:AgentProxy", log="arealite.api.config.loader"): ...\n'
           'SERVER = "servers.launch_server"\nWORD = "workflows"\nTEXT = "see workflows.rlvr here"\n')
    assert string_imports(src, "arealite.api.config.workflow") == [
        "1: 'workflows.rlvr:RLVRWorkflow' -> workflows",
        "2: 'arealite.agent.proxy:AgentProxy' -> arealite.agent"]
    assert string_imports(src, "workflows.agent") == [
        "2: 'arealite.agent.proxy:AgentProxy' -> arealite.agent",
        "2: 'arealite.api.config.loader' -> arealite.api"]
