"""The package's one compiled module, the engine's core (engine/_core.c), built by every install
(pip install ., -e ., a wheel) with the system's C compiler; the rest is in setup.cfg."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("seglogfs.engine._core", sources=["engine/_core.c"], extra_compile_args=["-O2"])])
