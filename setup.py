"""The package's one compiled module, the engine's core (engine/core/*.c, one extension), built by
every install (pip install ., -e ., a wheel) with the system's C compiler; the rest is in setup.cfg."""

from pathlib import Path

from setuptools import Extension, setup

CORE = Path("engine/core")

setup(
    ext_modules=[
        Extension(
            "seglogfs.engine._core",
            sources=sorted(str(path) for path in CORE.glob("*.c")),
            depends=sorted(str(path) for path in CORE.glob("*.h")),
            # (the files' shared functions stay inside the module: only its init is exported)
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    ]
)
