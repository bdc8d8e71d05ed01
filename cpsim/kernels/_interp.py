"""Speed-ups for Triton's CPU interpreter that change no result.

Each replaces interpreter internals with equivalent cheaper code; each is skipped
when the internals are not there.

Triton 3.x's interpreter re-patches ``triton.language`` (an ``inspect.getmembers``
walk over the whole module, ~2 ms) on every call of a ``@triton.jit`` helper from
inside a kernel, although the enclosing launch has already patched it. Kernels
call helpers once per tile, so this dominated small launches. ``install()`` makes
such a nested call skip the redundant re-patch when every ``triton.language``
module the helper sees is already patched, and falls back to Triton's own code
otherwise (or when the interpreter's internals are not the ones expected).
"""

from __future__ import annotations

import inspect

_INSTALLED = False
ORIGINALS: dict[str, object] = {}  # Triton's constructors that were replaced (the tests compare against them)


def install() -> None:
    """Idempotent; only call after TRITON_INTERPRET=1 and ``import triton``."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as it
        original = it.InterpretedFunction.__call__
        error = it.InterpreterError
        is_builtin = tl.core.is_builtin
    except (ImportError, AttributeError):
        return
    lang_modules = (tl, tl.core)
    helper_langs: dict[int, list] = {}

    def patched(fn) -> bool:
        langs = helper_langs.get(id(fn))
        if langs is None:
            langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in lang_modules]
            helper_langs[id(fn)] = langs
        # A patched module's builtins are replaced by plain wrappers.
        return bool(langs) and all(not is_builtin(getattr(m, "load", None)) for m in langs)

    def device_call(self, *args, **kwargs):
        if not patched(self.fn):
            return original(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    it.InterpretedFunction.__call__ = device_call
    _cache_np_dtype(it)
    _cache_builtin_names(it, is_builtin)
    _skip_dead_overflow_checks(it)
    _lazy_type_names(tl.core)


def _skip_dead_overflow_checks(it) -> None:
    """The interpreter's options say ``sanitize_overflow=True`` but ``debug=False``: every
    int32 add / sub / mul then also computes the op in int64 and two range compares, only
    for ``device_assert`` to drop the result because ``debug`` is off (about a third of
    interpreted time in cpsim's kernels). With ``debug`` off the check can never fire, so
    switching it off changes nothing but the time. Wrapping int32 arithmetic stays exactly
    as on a GPU (numpy int32 wraps; ``int32-slot-overflow`` relies on it)."""
    import dataclasses
    builder = getattr(it, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not dataclasses.is_dataclass(options):
        return
    if getattr(options, "sanitize_overflow", False) and not getattr(options, "debug", True):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _cache_builtin_names(it, is_builtin) -> None:
    """Each launch walks ``inspect.getmembers`` of four ``triton.language`` namespaces to
    find the builtins it patches (~2 ms); the names never change, so walk once."""
    original = getattr(it, "_patch_builtin", None)
    patch_attr = getattr(it, "_patch_attr", None)
    if original is None or patch_attr is None:
        return
    names: dict[int, tuple[object, list[str]]] = {}

    def patch_builtin(pkg, builder, scope):
        known = names.get(id(pkg))
        if known is None or known[0] is not pkg:
            known = (pkg, [n for n, m in inspect.getmembers(pkg) if is_builtin(m)])
            names[id(pkg)] = known
        for name in known[1]:
            member = getattr(pkg, name)
            if is_builtin(member):  # the original's filter: an already patched member is left alone
                patch_attr(pkg, name, member, builder, scope)

    it._patch_builtin = patch_builtin


def _cache_np_dtype(it) -> None:
    """``_get_np_dtype`` rebuilds a 20-entry dict on every interpreted op; it is a pure function of the dtype."""
    original = getattr(it, "_get_np_dtype", None)
    if original is None:
        return
    cache: dict = {}

    def cached(tt_dtype):
        try:
            return cache[tt_dtype]
        except KeyError:
            cache[tt_dtype] = out = original(tt_dtype)
            return out
        except TypeError:  # unhashable: not expected, but never fail because of the cache
            return original(tt_dtype)

    it._get_np_dtype = cached


def _lazy_type_names(core) -> None:
    """Every interpreted op builds a ``block_type`` and a ``tl.tuple`` of its shape, and both
    format a ``name`` string at once (``tuple_type`` formats every element's type): about a
    tenth of interpreted time, for strings only error messages and compiled-mode mangling
    read. The name becomes a property computed on first read, from the same fields with the
    same format. Skipped unless both constructors are the ones this was written against."""
    import textwrap
    tuple_type, block_type = getattr(core, "tuple_type", None), getattr(core, "block_type", None)
    if tuple_type is None or block_type is None or "name" in vars(tuple_type) or "name" in vars(block_type):
        return
    try:
        tsrc = textwrap.dedent(inspect.getsource(tuple_type.__init__))
        bsrc = textwrap.dedent(inspect.getsource(block_type.__init__))
    except (OSError, TypeError):
        return
    tuple_name = """self.name = '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'"""
    block_name = "self.name = f'<{self.shape}, {self.element_ty}>'"
    import re
    assigned = (set(re.findall(r"self\.(\w+) =", tsrc)), set(re.findall(r"self\.(\w+) =", bsrc)))
    if assigned != ({"types", "fields", "name"}, {"element_ty", "shape", "numel", "name"}) \
            or tuple_name not in tsrc or block_name not in bsrc:
        return
    validate = core.validate_block_shape
    unwrap_shape = core._unwrap_shape
    tl_tuple = core.tuple

    def tuple_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def tuple_name_of(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'

    def block_init(self, element_ty, shape):
        self.element_ty = element_ty
        assert (isinstance(shape, (list, tl_tuple)))
        self.shape = tl_tuple(unwrap_shape(shape))
        if not self.shape:
            raise TypeError('0d block_type is forbidden')
        self.numel = validate(self.shape)

    def block_name_of(self):
        return f'<{self.shape}, {self.element_ty}>'

    ORIGINALS.update({"tuple_type": tuple_type.__init__, "block_type": block_type.__init__})
    tuple_type.__init__ = tuple_init
    tuple_type.name = _lazy("_cpsim_name", tuple_name_of)
    block_type.__init__ = block_init
    block_type.name = _lazy("_cpsim_name", block_name_of)




def _lazy(slot: str, compute):
    """A ``name`` attribute computed on first read; assigning it still works."""

    def get(self):
        try:
            return self.__dict__[slot]
        except KeyError:
            self.__dict__[slot] = value = compute(self)
            return value

    def set_(self, value):
        self.__dict__[slot] = value

    return property(get, set_)
