"""The Triton interpreter without its repeated patching of triton.language (tests only; CPU, TRITON_INTERPRET=1).

Every call of a @triton.jit function from inside a kernel makes the interpreter patch triton.language again
(`interpreter._patch_lang`: `inspect.getmembers` over the whole module for its builtins), although the launch
around the call has already patched the same modules and keeps them patched until it ends: a quarter of the
suite's interpreter time went there. `install()` skips only that redundant work: a launch patches as before
(and restores at its end); a nested call whose modules the running launch has already patched gets an empty
scope, the patch it would have made being the one in place; a nested call that needs a module the launch has
not patched patches it as before. And `interpreter._get_np_dtype` (the numpy dtype of a Triton type, asked for
at nearly every interpreted op) builds its table of 19 types at every call: it is asked once per type here. The
kernels run the same interpreted code on the same patched functions (tests/kernels/test_triton_interp.py compares
the bits with and without it).
"""
from __future__ import annotations

_ORIGINAL = None
_ORIGINAL_NP_DTYPE = None
_np_dtypes: dict = {}  # (type of the Triton type, its name) -> numpy dtype: the name holds the element type and shape
_covered: list[set] = []  # per running launch (at most one: the grid loop is not re-entrant): modules patched


def _langs(fn) -> set:
    """The modules _patch_lang patches for `fn`: triton.language and its core where fn's globals hold them."""
    import triton.language as tl

    core = tl.core
    return {id(v) for v in fn.__globals__.values() if v is tl or v is core}


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


def _get_np_dtype(tt_dtype):
    key = (type(tt_dtype), getattr(tt_dtype, "name", None))
    got = _np_dtypes.get(key)
    if got is None:
        got = _ORIGINAL_NP_DTYPE(tt_dtype)
        if key[1] is not None:
            _np_dtypes[key] = got
    return got


def install() -> bool:
    """Install under the interpreter, where triton has the function this replaces; False where it does not."""
    global _ORIGINAL, _ORIGINAL_NP_DTYPE
    from lora_moe_lab import runtime

    if not runtime.interpreter():
        return False
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    if _ORIGINAL is not None:
        return True
    if not all(hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope", "_get_np_dtype")):
        return False
    _ORIGINAL, _ORIGINAL_NP_DTYPE = ti._patch_lang, ti._get_np_dtype
    ti._patch_lang, ti._get_np_dtype = _patch_lang, _get_np_dtype
    return True


def uninstall() -> None:
    global _ORIGINAL, _ORIGINAL_NP_DTYPE
    if _ORIGINAL is not None:
        from triton.runtime import interpreter as ti

        ti._patch_lang, ti._get_np_dtype = _ORIGINAL, _ORIGINAL_NP_DTYPE
        _ORIGINAL = _ORIGINAL_NP_DTYPE = None
