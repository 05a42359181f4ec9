"""Build script for the package's C extensions; everything else is in pyproject.toml.

Each extension is optional: where it does not compile (no C compiler, no Python headers) the install
still succeeds and zerocomm runs the module's pure-Python fallback.  One line per extension in
``EXTENSIONS``; ``pip install -e .`` (the README's command) builds them in place.
"""
from setuptools import Extension, setup

#: -ffp-contract=off: no fused multiply-add, so float arithmetic rounds exactly as the numpy fallback's.
C_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno"]

EXTENSIONS = [
    Extension("zerocomm.ops._onebit", ["ops/_onebit.c"], extra_compile_args=C_FLAGS, optional=True),
    Extension("zerocomm.ops._quantize", ["ops/_quantize.c"], extra_compile_args=C_FLAGS, optional=True),
    Extension("zerocomm.comm.backends._mpifast", ["comm/backends/_mpifast.c"],
              extra_compile_args=["-O2"], optional=True),
    Extension("zerocomm.comm._shmfast", ["comm/_shmfast.c"], extra_compile_args=C_FLAGS, optional=True),
]

setup(ext_modules=EXTENSIONS)
