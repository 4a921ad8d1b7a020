"""Triton's CPU interpreter without its repeated language patching: the same arithmetic, in less of CI's time.

Under ``TRITON_INTERPRET=1`` a kernel launch (``GridExecutor.__call__``) patches ``triton.language`` for the
interpreter once (``_patch_lang``) and restores it afterwards. But every call of a ``@triton.jit`` function from
inside the kernel, once per program (``InterpretedFunction.__call__``), runs ``_patch_lang`` again. Among those
functions are ``tl.sum``, ``tl.max``, ``tl.cumsum`` and ``tl.sigmoid``, and the plugin's own helpers. Each run
scans every member of ``triton.language``, its tensor class and ``triton.language.math`` with
``inspect.getmembers``. Within one launch, a second run for a function of the same module finds the same modules
already patched. It sets the same stateless replacements again, and it never restores them (its scope is
dropped). This module skips those repeats: a nested ``_patch_lang`` runs once per module's globals per launch.
On the V4.1 site coefficients' kernel (``hc_mixes``, 33 tokens) that halves the time.

Two more pure wastes go:

- Every 32-bit integer ``+``, ``-`` and ``*`` is computed a second time in int64 and compared with the type's
  bounds (``binary_op_sanitize_overflow_impl``), for a ``device_assert`` that does nothing unless the options'
  ``debug`` is on, and the interpreter's options never turn it on. With ``debug`` off, this module sets the
  interpreter's ``sanitize_overflow`` off.
- ``_get_np_dtype`` builds a dictionary of 19 types on each of its calls (hundreds of thousands a forward
  pass); this module remembers its answers.

On V4.1's index queries (``index_query``, 33 tokens x 4 heads) the last two take the time from 2.27 to 1.13 s
on this repository's CI machine type.

- Every operation's result type is a new ``block_type``, whose constructor unwraps its shape, checks each dimension
  is a power of two and formats its name (hundreds of thousands a forward pass). This module remembers the shape,
  element count and name for each element type name and shape of plain ints it has seen (they depend on nothing else), and sets them without redoing
  the work (a shape it has not seen, or one holding ``constexpr`` values, goes through Triton's constructor). So
  too each new ``tensor``'s ``numel`` and ``shape`` ``constexpr`` values, by shape (a ``constexpr`` is never changed
  after its construction, so tensors of one shape can share them). ``test_interpreter_speed.py`` checks that the outputs keep their bits and
that :func:`uninstall` gives Triton's own functions and options back.

:func:`install` does nothing where Triton's interpreter lacks these names (another Triton version): tests then
run at the interpreter's own speed."""

from __future__ import annotations

import dataclasses
import threading

_state = threading.local()
_installed: dict[str, object] = {}


def install() -> bool:
    """Patch the interpreter (idempotent). Returns whether it is patched."""
    if _installed:
        return True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    if not all(hasattr(interpreter, n) for n in ("_patch_lang", "GridExecutor", "_LangPatchScope")):
        return False
    patch_lang, grid_call = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def once_per_launch(fn):
        seen = getattr(_state, "seen", None)
        if seen is None:  # outside a launch: as Triton does it
            return patch_lang(fn)
        key = id(fn.__globals__)
        if key in seen:
            return interpreter._LangPatchScope()
        seen.add(key)
        return patch_lang(fn)

    def launch(self, *args, **kwargs):
        outer = getattr(_state, "seen", None)
        _state.seen = set()  # the launch's own _patch_lang runs first, and in full
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _state.seen = outer

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    memo: dict[object, object] = {}

    def cached_np_dtype(tt_dtype):
        try:
            return memo[tt_dtype]
        except KeyError:
            out = memo[tt_dtype] = np_dtype(tt_dtype)
            return out
        except TypeError:  # not hashable
            return np_dtype(tt_dtype)

    from triton.language import core

    block_init = core.block_type.__init__
    shapes: dict[tuple, tuple] = {}

    def remembered_block_type(self, element_ty, shape):
        key = (str(element_ty), *shape) if all(type(d) is int for d in shape) else None
        known = shapes.get(key) if key is not None else None
        if known is None:
            block_init(self, element_ty, shape)
            if key is not None:
                shapes[key] = (self.shape, self.numel, self.name)
            return
        self.element_ty = element_ty
        self.shape, self.numel, self.name = known

    tensor_init = core.tensor.__init__
    dims: dict[str, tuple] = {}

    def remembered_tensor(self, handle, type):
        # by the type's name, a str holding its shape: a block type's shape is a ``tl.tuple``, whose hash and
        # equality run in Python
        key = getattr(type, "name", None)
        known = dims.get(key) if key is not None else None
        if known is None:
            tensor_init(self, handle, type)
            if key is not None:
                dims[key] = (self.numel, self.shape)
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.numel, self.shape = known

    _installed.update(
        patch_lang=patch_lang, grid_call=grid_call, module=interpreter, options=options, np_dtype=np_dtype,
        block_init=block_init, tensor_init=tensor_init, core=core,
    )  # fmt: skip
    core.block_type.__init__ = remembered_block_type
    core.tensor.__init__ = remembered_tensor
    interpreter._patch_lang = once_per_launch
    if np_dtype is not None:
        interpreter._get_np_dtype = cached_np_dtype
    interpreter.GridExecutor.__call__ = launch
    if options is not None and not options.debug and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def uninstall() -> bool:
    """Triton's own interpreter again. Returns whether it was patched."""
    if not _installed:
        return False
    interpreter = _installed["module"]
    interpreter._patch_lang = _installed["patch_lang"]
    interpreter.GridExecutor.__call__ = _installed["grid_call"]
    if _installed["np_dtype"] is not None:
        interpreter._get_np_dtype = _installed["np_dtype"]
    if _installed["options"] is not None:
        interpreter.interpreter_builder.options = _installed["options"]
    _installed["core"].block_type.__init__ = _installed["block_init"]
    _installed["core"].tensor.__init__ = _installed["tensor_init"]
    _installed.clear()
    return True
