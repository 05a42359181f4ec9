"""The layering of docs/architecture.md, enforced by parsing imports.

ops imports neither comm nor zero; zero and benchmarks use only the public ``zerocomm.comm`` (never its
backends, algorithms or other internal modules); integrations use only the public names of ``zerocomm.comm``
and ``zerocomm.zero``; comm never imports zero or benchmarks; and inside ``comm/``,
``ops/``, ``zero/`` and ``benchmarks/`` no module imports, directly or through others, a module that imports
it: every ``from . import x`` / ``from .x import y`` arrow counts, at module level or inside a function alike
(a late import is still an arrow), and a circle is a failure naming its members and their arrows.
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
