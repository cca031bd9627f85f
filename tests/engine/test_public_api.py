"""`seglogfs.engine` names its public API and loads each name from its module on first use: every
name it lists loads, and is the one its module defines (a name whose module moved fails here,
not in the first caller)."""

from __future__ import annotations

import importlib

from seglogfs import engine


def test_every_public_name_loads_from_the_module_that_defines_it() -> None:
    assert sorted(engine.__all__) == sorted(engine._WHERE)
    for name in engine.__all__:
        module = importlib.import_module(f"seglogfs.engine.{engine._WHERE[name]}")
        value = getattr(engine, name)
        assert value is getattr(module, name)
        assert value.__module__ == module.__name__, f"{name} is defined in {value.__module__}, not {module.__name__}"
