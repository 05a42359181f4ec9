"""Installs the repository's top-level folders as the ``zerocomm`` package.

The repository root is the ``zerocomm`` package itself (its ``__init__.py``), so
``comm/`` becomes ``zerocomm.comm``, ``zero/`` ``zerocomm.zero`` and so on; no bare
``comm``, ``zero`` or ``ops`` module is ever installed.
"""
from setuptools import setup

SUBPACKAGES = ["comm", "comm.backends", "comm.algorithms", "zero", "ops", "benchmarks"]

setup(
    name="zerocomm",
    version="0.1.0",
    description="Collective communication for PyTorch (gloo, MPI, NCCL; ring, tree, 1-bit) with ZeRO built on top",
    python_requires=">=3.10",
    package_dir={"zerocomm": "."},
    packages=["zerocomm"] + [f"zerocomm.{name}" for name in SUBPACKAGES],
    # torch is pinned in the README's set-up commands (to the wheel on this machine's disk),
    # not bounded here: a library must not cap its users' torch.
    install_requires=["torch>=2.4", "numpy>=1.24"],
    extras_require={
        "mpi": ["mpi4py>=4.0", "mpich"],
        "cuda": ["cupy-cuda12x"],
        "test": ["pytest>=8", "pytest-timeout", "hypothesis", "mpi4py>=4.0", "mpich", "pdoc", "safetensors"],
        "zero": ["safetensors"],
        "docs": ["pdoc"],
        "bench": ["pytest-benchmark", "tabulate", "tqdm", "matplotlib"],
    },
    entry_points={"console_scripts": ["zerocomm-bench=zerocomm.benchmarks.__main__:main"]},
)
