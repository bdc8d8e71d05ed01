"""``cpsim.run`` keeps no state in its modules (issue 36): a runner, its workers, a sizing child, the
reaper's marker and a torchrun rank's agreed exit code live on objects the caller builds and hands
down. After every module of the package is imported, its globals hold only constants, functions,
classes, modules and other immutable values; a dict, list, set, event or instance of a mutable class
there would be state one caller leaves for the next.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import logging
import pkgutil
import re
import struct
import types
from pathlib import Path

import cpsim.run

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset, type(Ellipsis),
             re.Pattern, logging.Logger, enum.Enum, types.ModuleType, types.FunctionType,
             types.BuiltinFunctionType, type, Path, struct.Struct)


def _frozen(value) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return params is not None and params.frozen


def _immutable(value) -> bool:
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    if isinstance(value, frozenset):
        return all(_immutable(v) for v in value)
    if isinstance(value, types.MappingProxyType):  # a read-only table, its entries constants
        return all(_immutable(k) and _immutable(v) for k, v in value.items())
    if _frozen(value):
        return all(_immutable(getattr(value, f.name)) for f in dataclasses.fields(value))
    if callable(value) and not isinstance(value, type) and hasattr(value, "__wrapped__"):
        return True  # a decorated function (functools.wraps, contextmanager)
    return isinstance(value, IMMUTABLE) or type(value).__module__ in ("typing", "__future__")


def mutable_globals(module: types.ModuleType) -> list[str]:
    """``module.name (type)`` for each global of ``module`` that is not immutable (dunders left out)."""
    return [f"{module.__name__}.{name} ({type(v).__name__})" for name, v in vars(module).items()
            if not (name.startswith("__") and name.endswith("__")) and not _immutable(v)]


def run_modules() -> list[types.ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(cpsim.run.__path__, "cpsim.run.")]
    return [cpsim.run] + [importlib.import_module(n) for n in sorted(names)]


def test_no_module_of_cpsim_run_holds_mutable_state():
    found = [g for m in run_modules() for g in mutable_globals(m)]
    assert not found, f"module-level mutable state in cpsim.run: {found}"


def test_the_scan_sees_every_run_module():
    names = {m.__name__ for m in run_modules()}
    files = {f"cpsim.run.{p.stem}" for p in Path(cpsim.run.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert files <= names and "cpsim.run.runner" in names and "cpsim.run.host_sizer" in names


def test_the_scan_catches_a_module_with_a_list_dict_set_or_object():
    """The control: a module holding each kind of state is caught, one holding only constants is not."""
    m = types.ModuleType("synthetic")
    exec("import threading, collections\n"
         "A = 1\nB = ('x', 2.0)\nC = frozenset({1})\n"
         "def f():\n    return A\n"
         "class K:\n    pass\n", vars(m))
    assert mutable_globals(m) == []
    for stmt, kind in [("_live = set()", "set"), ("_tokens = {}", "dict"), ("_current = []", "list"),
                       ("_buf = bytearray()", "bytearray"), ("_ev = threading.Event()", "Event"),
                       ("_one = K()", "K"), ("_memo = collections.OrderedDict()", "OrderedDict"),
                       ("_nested = ('a', [])", "tuple"), ("_table = {'a': 1}", "dict")]:
        bad = types.ModuleType("synthetic_bad")
        exec("import threading, collections\nclass K:\n    pass\n" + stmt, vars(bad))
        assert mutable_globals(bad) == [f"synthetic_bad.{stmt.split(' =')[0]} ({kind})"], stmt
