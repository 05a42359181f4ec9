"""The layering of docs/architecture.md, enforced by parsing imports.

ops imports neither comm nor zero; zero and benchmarks use only the public ``zerocomm.comm`` (never its
backends, algorithms or other internal modules); integrations use only the public names of ``zerocomm.comm``
and ``zerocomm.zero``; comm never imports zero or benchmarks; and inside ``comm/``,
``ops/``, ``zero/`` and ``benchmarks/`` no module imports, directly or through others, a module that imports
it: every ``from . import x`` / ``from .x import y`` arrow counts, at module level or inside a function alike
(a late import is still an arrow), and a circle is a failure naming its members and their arrows.  Inside
``comm/`` the arrows also point down a declared order of floors (``FLOORS``), late imports are few
(``LATE_IMPORTS_AT_MOST``), no module uses another's private members, and only the gloo backend imports the
module that reads torch's build (``gloo_exits.py``).  ``python tests/test_layers.py [comm folder]`` prints the
arrows up the floors and the late imports.
"""
import ast
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path, package: str):
    """Absolute dotted names imported by ``path`` (relative imports resolved within ``zerocomm``)."""
    tree = ast.parse(path.read_text())
    module = "zerocomm." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
    parts = module.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name
            for alias in node.names:
                yield f"{name}.{alias.name}"


def _files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _files("ops"), ids=str)
def test_ops_imports_no_comm_or_zero(path):
    bad = [n for n in _imports(path, "ops") if n.startswith(("zerocomm.comm", "zerocomm.zero"))]
    assert not bad, f"{path}: {bad}"


@pytest.mark.parametrize("path", _files("zero") + _files("benchmarks") + _files("integrations"), ids=str)
def test_zero_and_benchmarks_use_only_the_public_comm_api(path):
    bad = [n for n in _imports(path, "") if n.startswith("zerocomm.comm.")
           and not n.split(".")[2] in {"__init__"} and n.count(".") >= 2
           and not _is_public_name(n)]
    assert not bad, f"{path} reaches into comm internals: {bad}"


def _is_public_name(name: str) -> bool:
    """``zerocomm.comm.X`` where X is exported by the public surface (a name, not a module)."""
    import zerocomm.comm as dist
    parts = name.split(".")
    return len(parts) == 3 and parts[2] in dist.__all__


@pytest.mark.parametrize("path", _files("comm"), ids=str)
def test_comm_imports_no_zero_or_benchmarks(path):
    bad = [n for n in _imports(path, "comm") if n.startswith(("zerocomm.zero", "zerocomm.benchmarks"))]
    assert not bad, f"{path}: {bad}"


# -- no import circles inside comm/, ops/, zero/ or benchmarks/ ----------------------------------------

COMM = str(ROOT / "comm")


def _comm_modules(top: str = COMM) -> dict:
    """Dotted name below the package at ``top`` (``zerocomm.comm`` by default; "" for the package itself) ->
    source path."""
    found = {}
    for folder, _, files in os.walk(top):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                found[dotted[:-len("__init__")].rstrip(".") if dotted.endswith("__init__") else dotted] = path
    return found


def _comm_arrows(modules: dict) -> dict:
    arrows = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        package = [part for part in package if part]
        with open(path) as source:
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{target}.{alias.name}".lstrip(".") for alias in node.names]
            submodules = [m for m in submodules if m in modules]
            # ``from . import x`` imports module x; ``from .x import y`` imports module x (y is a name in it).
            for candidate in submodules or [target]:
                if candidate in modules and candidate != name:
                    arrows[name].add(candidate)
    return arrows


def _circles(arrows: dict) -> list:
    """Strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in arrows[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def test_comm_has_no_import_circles():
    modules = _comm_modules()
    assert {"api", "plan", "group", "check", "validate"} <= set(modules), sorted(modules)
    del modules[""]  # the package's __init__: the public surface, above every module
    arrows = _comm_arrows(modules)
    arrows = {m: {a for a in targets if a in modules} for m, targets in arrows.items()}
    assert "group" in arrows["plan"] and "check" in arrows["group"], "the arrows were not read"
    circles = _circles(arrows)
    assert circles == [], [{m: sorted(a for a in arrows[m] if a in circle) for m in circle} for circle in circles]


@pytest.mark.parametrize("package", ["ops", "zero", "benchmarks"])
def test_the_other_packages_have_no_import_circles(package):
    modules = _comm_modules(str(ROOT / package))
    modules.pop("", None)
    arrows = _comm_arrows(modules)
    arrows = {m: {a for a in targets if a in modules} for m, targets in arrows.items()}
    assert any(arrows.values()), f"no arrow read in {package}/"
    circles = _circles(arrows)
    assert circles == [], [{m: sorted(a for a in arrows[m] if a in circle) for m in circle} for circle in circles]


def test_a_circle_is_found():
    """The search itself: an arrow back up is reported."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# -- integrations/: adapters for other frameworks ---------------------------------------------------------

def _public_names(package: str) -> set:
    import importlib
    return set(importlib.import_module(package).__all__)


@pytest.mark.parametrize("path", _files("integrations"), ids=str)
def test_integrations_use_only_the_public_comm_and_zero_api(path):
    """An adapter reaches zerocomm only through the public names of ``zerocomm.comm`` and ``zerocomm.zero``
    (imported names, and attributes read on the imported module alike); the package's ``__init__`` imports
    nothing, so ``import zerocomm.integrations`` never imports a framework."""
    tree = ast.parse(path.read_text())
    if path.name == "__init__.py":
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], path
        return
    public = {package: _public_names(package) for package in ("zerocomm.comm", "zerocomm.zero")}
    bad, aliases = [], {}
    for name in _imports(path, "integrations"):
        package, _, rest = name.rpartition(".")
        if name.startswith("zerocomm.") and not name.startswith("zerocomm.integrations") and name not in public \
                and not (package in public and rest in public[package]):  # an adapter's own siblings are fine
            bad.append(name)
    for node in ast.walk(tree):  # `import zerocomm.comm as dist` / `from zerocomm import comm as dist`
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in public})
        elif isinstance(node, ast.ImportFrom) and node.module == "zerocomm":
            aliases.update({a.asname or a.name: f"zerocomm.{a.name}" for a in node.names
                            if f"zerocomm.{a.name}" in public})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr not in public[aliases[node.value.id]]:
                bad.append(f"{aliases[node.value.id]}.{node.attr}")
    assert not bad, f"{path} reaches past the public API: {bad}"


# -- floors inside comm/: which module may import which ----------------------------------------------------

#: comm/'s floors, lowest first.  A module imports (at module level or inside a function alike) only modules on
#: its own floor or below; within a floor there is no circle (``test_comm_has_no_import_circles``).  Every module
#: of comm/ is on exactly one floor, so a new module is placed here deliberately.  The order is the code's: the
#: backends sit on the transport and learn what the layers above keep on a communicator through close hooks
#: (``Transport.on_close``); ``topology`` is handed its all_gather; ``bootstrap`` (the rendezvous) needs only
#: the backends.
FLOORS = (
    ("base", {"errors", "environment", "best_effort", "reduce_op", "slurm", "torch_events"}),
    ("transport", {"transport", "work"}),
    ("backends", {"backends", "backends.gloo", "backends.gloo_exits", "backends.mpi", "backends.mpi_start",
                  "backends.nccl"}),
    ("bootstrap", {"bootstrap"}),
    ("hosts", {"topology", "shm"}),
    ("algorithms", {"algorithms", "algorithms.ring", "algorithms.tree", "algorithms.shm", "algorithms.hierarchical",
                    "algorithms.compressed", "sparse"}),
    ("bookkeeping", {"select", "config", "capabilities", "traffic", "flight", "abandon"}),
    ("groups", {"check", "group", "plan", "validate", "profiler"}),
    ("calls", {"staging", "api", "p2p", "objects", "compat", "shm_heap", "c10d"}),
    ("world", {"world", "settings", "process_group"}),
    ("surface", {""}),  # the package's __init__: the public names
)

#: The most function-level imports comm/ may hold (reached now; lower it when one goes).  A late import is for
#: a backend module imported only when asked for (``import zerocomm.comm`` needs neither mpi4py nor CUDA) or
#: not at all: it still points down the floors like any import.
LATE_IMPORTS_AT_MOST = 6


def _floor_of(module: str) -> int:
    for index, (_, members) in enumerate(FLOORS):
        if module in members:
            return index
    raise KeyError(module)


def _late_imports(modules: dict) -> list:
    """``(module, target, line, function)`` for every relative import inside a function of a comm/ module."""
    found = []
    for name, path in modules.items():
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        package = [part for part in package if part]
        tree = ast.parse(pathlib.Path(path).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                    target = ".".join(base + ([node.module] if node.module else []))
                    # ``from . import x``: module x where it is one (as _comm_arrows reads it)
                    named = [f"{target}.{alias.name}".lstrip(".") for alias in node.names]
                    for imported in [m for m in named if m in modules] or [target]:
                        found.append((name, imported, node.lineno, function.name))
    return sorted(set(found))


def _upward(modules: dict, arrows: dict) -> list:
    """Every arrow ``module -> target`` from a lower floor to a higher one.  An arrow to "" (the package) is a
    compiled extension's (``from . import _shmfast``), not one to the package's ``__init__``."""
    return sorted(f"{m} ({FLOORS[_floor_of(m)][0]}) -> {t} ({FLOORS[_floor_of(t)][0]})"
                  for m, targets in arrows.items() for t in targets
                  if m in modules and t in modules and t != "" and _floor_of(t) > _floor_of(m))


def test_every_comm_module_is_on_one_floor():
    modules = set(_comm_modules())
    placed = [m for _, members in FLOORS for m in members]
    assert len(placed) == len(set(placed)), "a module is on two floors"
    assert modules - set(placed) == set(), f"modules on no floor (add them to FLOORS): {sorted(modules - set(placed))}"
    assert set(placed) - modules == set(), f"FLOORS names modules that do not exist: {sorted(set(placed) - modules)}"


def test_comm_imports_point_down_the_floors():
    modules = _comm_modules()
    arrows = _comm_arrows(modules)
    assert "transport" in arrows["backends.gloo"] and "group" in arrows["plan"], "the arrows were not read"
    assert _upward(modules, arrows) == []


def test_an_import_up_the_floors_is_found():
    """The check itself: a backend importing shm (as they did, to release the arena) is an arrow up."""
    modules = _comm_modules()
    assert _upward(modules, {"backends.gloo": {"shm", "transport"}}) == ["backends.gloo (backends) -> shm (hosts)"]


def test_late_imports_are_few_and_point_down():
    modules = _comm_modules()
    late = _late_imports(modules)
    assert any(t == "backends.mpi" for _, t, _, _ in late), "the late imports were not read"
    listing = "\n".join(f"{m}:{line} {t} (in {f})" for m, t, line, f in late)
    assert len(late) <= LATE_IMPORTS_AT_MOST, f"{len(late)} late imports, at most {LATE_IMPORTS_AT_MOST}:\n{listing}"
    up = [f"{m}:{line} -> {t}" for m, t, line, _ in late if t in modules and _floor_of(t) > _floor_of(m)]
    assert up == [], up


# -- no comm/ module reads or writes another's private members -------------------------------------------

def _private_names(tree: ast.AST) -> set:
    """The ``_names`` a module defines: its functions, classes and module names, its ``self._x``/``cls._x``
    attributes and class-level names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _foreign_private_uses(tree: ast.AST, own: set, others: set) -> list:
    """``line: receiver._name`` for each use of a private name of another comm/ module on an object that is not
    ``self``/``cls`` (attribute reads and writes, and ``getattr``/``setattr``/``hasattr`` with the name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, receiver = node.attr, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name, receiver = node.args[1].value, node.args[0]
        else:
            continue
        if not name.startswith("_") or name.startswith("__") or name in own or name not in others:
            continue
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(receiver)}.{name}")
    return found


def _torch_names() -> set:
    """Private names of torch's own classes that comm/ subclasses or wraps (``ZerocommProcessGroup`` defines
    torch's ``_allgather_base``; a gloo ``Work``'s ``_source_rank``): torch's API, not a comm/ module's."""
    import torch
    import torch.distributed as td
    classes = (td.ProcessGroup, td.ProcessGroupGloo, td.ProcessGroupGloo._Options, torch._C._distributed_c10d.Work,
               torch.Tensor)
    return {name for cls in classes for name in dir(cls)} | {"_C"}


def test_no_comm_module_uses_anothers_private_members():
    modules = _comm_modules()
    trees = {name: ast.parse(pathlib.Path(path).read_text()) for name, path in modules.items()}
    own = {name: _private_names(tree) for name, tree in trees.items()}
    torch_names = _torch_names()
    bad = {}
    for name, tree in trees.items():
        others = set().union(*(names for other, names in own.items() if other != name)) - torch_names
        found = _foreign_private_uses(tree, own[name], others)
        if found:
            bad[name] = found
    assert "_once" in own["work"] and "_seq" in own["group"], "the private names were not read"
    assert bad == {}, bad


def test_a_foreign_private_use_is_found():
    tree = ast.parse("def f(work, group):\n    work._once.pop()\n    return getattr(group, '_seq')\n")
    assert sorted(_foreign_private_uses(tree, set(), {"_once", "_seq"})) == ["2: work._once", "3: group._seq"]


# -- gloo_exits.py reads torch's build: one module, imported by the gloo backend only --------------------------

#: What reading torch's build looks like: pybind11's instance size, mangled C++ names, torch's shared library.
_TORCH_BUILD_READING = ("__basicsize__", "_ZTV", "_ZN", "libtorch")


def test_the_torch_build_reading_is_isolated_in_gloo_exits():
    """Only ``comm/backends/gloo_exits.py`` reads pybind11's layout or calls torch's mangled symbols, and only
    ``comm/backends/gloo.py`` imports it (``tests/comm/test_gloo_exits.py`` checks it against the installed
    torch)."""
    importers, readers = [], []
    for folder in ("comm", "zero", "ops", "benchmarks", "integrations"):
        for path in _files(folder):
            text = path.read_text()
            relative = str(path.relative_to(ROOT))
            if relative == "comm/backends/gloo_exits.py":
                assert all(token in text for token in ("__basicsize__", "from_address", "_ZTV")), "reading moved?"
                continue
            if any(name.endswith("gloo_exits") for name in _imports(path, folder)):
                importers.append(relative)
            if any(token in text for token in _TORCH_BUILD_READING):
                readers.append(relative)
    assert importers == ["comm/backends/gloo.py"], importers
    assert readers == [], f"torch's build read outside gloo_exits.py: {readers}"


# -- the report: `python tests/test_layers.py [comm folder]` prints the arrows up the floors and the late imports

if __name__ == "__main__":
    import sys

    top = sys.argv[1] if len(sys.argv) > 1 else COMM
    found = _comm_modules(top)
    known = {m: p for m, p in found.items() if any(m in members for _, members in FLOORS)}
    print(f"modules on no floor: {sorted(set(found) - set(known))}")
    every = _comm_arrows(found)
    late_ones = _late_imports(found)
    ups = _upward(known, every)
    print(f"imports up the floors: {len(ups)}")
    for line in ups:
        late_at = [f"{m}:{n} in {f}" for m, t, n, f in late_ones if f"{m} (" in line.split("->")[0]
                   and line.split("-> ")[1].startswith(f"{t} (")]
        print(f"  {line}" + (f"  [late: {', '.join(late_at)}]" if late_at else ""))
    print(f"late imports: {len(late_ones)}")
    for m, t, n, f in late_ones:
        print(f"  {m}:{n} -> {t} (in {f})")
