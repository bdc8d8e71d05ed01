"""A running capture: the named kernels (``module:attr``) and host methods (``module:Class.method``) wrapped
where they are looked up, in modules imported already and, through an import hook, in those imported later."""

from __future__ import annotations

import importlib.abc
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from cpsim.capture.hosts import READERS, wrap_method
from cpsim.capture.recorder import (CapturedKernel, Policy, Recorder, check_meta, parse_size, parse_steps,
                                    policy_from_env, wrap)
from cpsim.errors import ConfigError


def _targets(kernels: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in kernels:
        module, sep, attr = str(spec).partition(":")
        if not sep or not module or not attr:
            raise ConfigError("CPSIM_CAPTURE_KERNELS", f"{spec!r} is not module:attr")
        out.setdefault(module, []).append(attr)
    return out


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, session: "Session"):
        self.inner, self.session = inner, session

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.session.patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps the named kernels right after their module is first imported."""

    def __init__(self, session: "Session"):
        self.session = session

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.session.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.session)
                return spec
        return None


class Session:
    def __init__(self, recorder: Recorder, kernels: Iterable[str]):
        self.recorder = recorder
        self.targets = _targets(kernels)
        self.saved: list[tuple[Any, str, Any]] = []
        self.hook = _PatchOnImport(self)

    @classmethod
    def from_args(cls, directory: str | Path, kernels: Iterable[str], every: int,
                  steps: str | tuple[int, int | None] | None, budget: int | str, rank: int | None,
                  meta: dict[str, Any] | None) -> Session:
        """``cpsim.capture.capture``'s arguments, checked (a bad one: ConfigError naming it)."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError("every", f"must be an integer >= 1, got {every!r}")
        first, last = parse_steps(steps, "steps") if isinstance(steps, str) else (steps or (0, None))
        size = parse_size(budget, "budget") if isinstance(budget, str) else int(budget)
        return cls(Recorder(directory, Policy(every, first, last, size), rank, check_meta(meta)), kernels)

    @classmethod
    def from_env(cls, env: Mapping[str, str], kernels: Iterable[str]) -> Session:
        """``CPSIM_CAPTURE`` and its settings (``cpsim.capture.install``), checked."""
        try:
            meta = check_meta(json.loads(env.get("CPSIM_CAPTURE_META", "") or "{}"), "CPSIM_CAPTURE_META")
        except json.JSONDecodeError as e:
            raise ConfigError("CPSIM_CAPTURE_META", f"not valid JSON: {e}") from None
        rank = env.get("CPSIM_CAPTURE_RANK")
        return cls(Recorder(env["CPSIM_CAPTURE"], policy_from_env(env), int(rank) if rank and rank.isdigit() else None,
                            meta), kernels)

    def patch(self, module) -> None:
        for attr in self.targets.get(module.__name__, ()):
            if "." in attr:  # Class.method: a host class's compute_slot_mapping(s) (cpsim.capture.hosts)
                self._patch_host(module, attr)
                continue
            obj = getattr(module, attr, None)
            if obj is None or isinstance(obj, CapturedKernel):
                continue
            self.saved.append((module, attr, obj))
            setattr(module, attr, wrap(obj, self.recorder, f"{module.__name__}:{attr}"))

    def _patch_host(self, module, attr: str) -> None:
        cls_name, _, method = attr.partition(".")
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type) or method not in READERS or method not in cls.__dict__:
            return
        if getattr(cls.__dict__[method], "_cpsim_host", False):
            return
        original = wrap_method(cls, method, self.recorder, f"{module.__name__}:{attr}")
        self.saved.append((cls, method, original))

    def start(self) -> None:
        for name in self.targets:
            if name in sys.modules:
                self.patch(sys.modules[name])
        sys.meta_path.insert(0, self.hook)

    def stop(self) -> None:
        if self.hook in sys.meta_path:
            sys.meta_path.remove(self.hook)
        for module, attr, obj in reversed(self.saved):
            setattr(module, attr, obj)
        self.saved.clear()
        self.recorder.close()
