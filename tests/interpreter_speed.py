"""Triton's CPU interpreter without its repeated language patching: the same arithmetic, in less of CI's time.

Under ``TRITON_INTERPRET=1`` a kernel launch (``GridExecutor.__call__``) patches ``triton.language`` for the
interpreter once (``_patch_lang``) and restores it afterwards. But every call of a ``@triton.jit`` function from
inside the kernel, once per program (``InterpretedFunction.__call__``), runs ``_patch_lang`` again. Among those
functions are ``tl.sum``, ``tl.max``, ``tl.cumsum`` and ``tl.sigmoid``, and the plugin's own helpers. Each run
scans every member of ``triton.language``, its tensor class and ``triton.language.math`` with
``inspect.getmembers``. Within one launch, a second run for a function of the same module finds the same modules
already patched. It sets the same stateless replacements again, and it never restores them (its scope is
dropped). This module skips those repeats: a nested ``_patch_lang`` runs once per module's globals per launch.
On the V4.1 site coefficients' kernel (``hc_mixes``, 33 tokens) that halves the time
(``test_interpreter_speed.py`` checks that the outputs keep their bits).

:func:`install` does nothing where Triton's interpreter lacks these names (another Triton version): tests then
run at the interpreter's own speed."""

from __future__ import annotations

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

    _installed.update(patch_lang=patch_lang, grid_call=grid_call, module=interpreter)
    interpreter._patch_lang = once_per_launch
    interpreter.GridExecutor.__call__ = launch
    return True


def uninstall() -> bool:
    """Triton's own interpreter again. Returns whether it was patched."""
    if not _installed:
        return False
    interpreter = _installed["module"]
    interpreter._patch_lang = _installed["patch_lang"]
    interpreter.GridExecutor.__call__ = _installed["grid_call"]
    _installed.clear()
    return True
