"""The Triton interpreter without its repeated patching of triton.language (tests only; CPU, TRITON_INTERPRET=1).

Every call of a @triton.jit function from inside a kernel makes the interpreter patch triton.language again
(`interpreter._patch_lang`: `inspect.getmembers` over the whole module for its builtins), although the launch
around the call has already patched the same modules and keeps them patched until it ends: a quarter of the
suite's interpreter time went there. `install()` skips only that redundant work: a launch patches as before
(and restores at its end); a nested call whose modules the running launch has already patched gets an empty
scope, the patch it would have made being the one in place; a nested call that needs a module the launch has
not patched patches it as before. The kernels run the same interpreted code on the same patched functions
(tests/kernels/test_triton_interp.py compares the bits with and without it).
"""
from __future__ import annotations

import inspect

_ORIGINAL = None
_covered: list[set] = []  # per running launch (at most one: the grid loop is not re-entrant): modules patched


def _langs(fn) -> set:
    import triton.language as tl

    return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}


def _patch_lang(fn):
    from triton.runtime import interpreter as ti

    langs = _langs(fn)
    if _covered and langs <= _covered[-1]:
        return ti._LangPatchScope()  # a nested call: the running launch has patched these modules already
    scope = _ORIGINAL(fn)
    if _covered:  # a nested call that patched a module of its own: covered for the rest of the launch
        _covered[-1] |= langs
        return scope
    _covered.append(set(langs))  # a launch: its scope is restored when the grid is done
    restore = scope.restore

    def restore_and_pop():
        try:
            restore()
        finally:
            _covered.pop()

    scope.restore = restore_and_pop
    return scope


def install() -> bool:
    """Install under the interpreter, where triton has the function this replaces; False where it does not."""
    global _ORIGINAL
    from lora_moe_lab import runtime

    if not runtime.interpreter():
        return False
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    if _ORIGINAL is not None:
        return True
    if not (hasattr(ti, "_patch_lang") and hasattr(ti, "_LangPatchScope")):
        return False
    _ORIGINAL = ti._patch_lang
    ti._patch_lang = _patch_lang
    return True


def uninstall() -> None:
    global _ORIGINAL
    if _ORIGINAL is not None:
        from triton.runtime import interpreter as ti

        ti._patch_lang = _ORIGINAL
        _ORIGINAL = None
