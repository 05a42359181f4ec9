"""The layering of docs/architecture.md, enforced by parsing imports.

ops imports neither comm nor zero; zero and benchmarks use only the public ``zerocomm.comm`` (never its
backends, algorithms or other internal modules); comm never imports zero or benchmarks.
"""
import ast
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


@pytest.mark.parametrize("path", _files("zero") + _files("benchmarks"), ids=str)
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
