"""Small helpers shared by the notebooks: parameter checks with clear messages, plotly set-up,
and where the recorded GPU data lives."""
from __future__ import annotations

import math
import numbers

from .. import runtime
from ..config import PRESETS
from ..model.guards import guard_names
from ..provenance import DATA  # noqa: F401  (notebooks read recordings through nb.params.DATA)


class NotebookParameterError(ValueError):
    pass


def _bad(name, value, why):
    raise NotebookParameterError(f"bad notebook parameter {name}={value!r}: {why}")


def check_preset(preset):
    if not isinstance(preset, str) or preset not in PRESETS:
        _bad("preset", preset, f"unknown preset; choose one of {sorted(PRESETS)}")
    return preset


def check_positive_int(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _bad(name, value, "must be a positive int")
    return value


def _number(value) -> bool:
    """A real number that is not a bool (papermill's `-p x True` passes a bool, which Python counts as 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_fraction(name, value):
    if not _number(value) or not 0 <= value <= 1:
        _bad(name, value, "must be a number in [0, 1] (not a bool, NaN or a string)")
    return float(value)


def check_number(name, value, lo=None, hi=None):
    """A finite number (not a bool) in [lo, hi] where given, as a float."""
    if not _number(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = "" if lo is None and hi is None else f" in [{lo if lo is not None else '-inf'}, " \
                                                   f"{hi if hi is not None else 'inf'}]"
        _bad(name, value, f"must be a finite number{rng} (not a bool or a string)")
    return float(value)


def check_bool(name, value):
    if not isinstance(value, bool):
        _bad(name, value, "must be True or False")
    return value


def check_guards(guards):
    if isinstance(guards, str):
        guards = [guards]
    if not isinstance(guards, (list, tuple)):
        _bad("guards", guards, f"a guard name or a list of them; choose from {list(guard_names())}")
    unknown = [g for g in guards if not isinstance(g, str) or g not in guard_names()]
    if unknown or not guards:
        _bad("guards", guards, f"unknown guard(s) {unknown}; choose from {list(guard_names())}")
    return list(guards)


def check_device(device):
    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda"):
        _bad("device", device, "choose 'auto', 'cpu' or 'cuda'")
    if device == "cuda" and not runtime.has_cuda():
        _bad("device", device, "this machine has no CUDA GPU; use 'auto'")
    return runtime.resolve_device(device)


def pick_dtype(dtype, device):
    if isinstance(dtype, str) and dtype == "auto":
        return runtime.resolve_dtype(dtype, device)
    if not isinstance(dtype, str) or dtype not in ("float32", "float16", "bfloat16"):
        _bad("dtype", dtype, "choose 'auto', 'float32', 'float16' or 'bfloat16'")
    return dtype


def _assigned(src: str) -> set[str]:
    import ast

    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name)}


def reject_unknown_parameters() -> None:
    """Call in the cell right after the `parameters` cell. Under papermill the cell before this one
    is the injected `# Parameters` cell: a name it sets that the defaults cell does not define is
    a misspelt parameter (`-p num_layer 3`), which would otherwise pass silently with the defaults."""
    try:
        hist = get_ipython().user_ns.get("In", [])  # noqa: F821  (IPython's input history)
    except NameError:  # not in IPython: nothing was injected
        return
    if len(hist) >= 3 and hist[-2].lstrip().startswith("# Parameters"):
        unknown = sorted(_assigned(hist[-2]) - _assigned(hist[-3]))
        if unknown:
            known = ", ".join(sorted(_assigned(hist[-3])))
            raise NotebookParameterError(f"bad notebook parameter {unknown[0]}: unknown parameter(s) {unknown}; "
                                         f"this notebook takes: {known}")


def setup_plotly():
    """Figures go out as the plotly mimetype only (the figure JSON): JupyterLab renders it, and the
    HTML report (nb/runner.py) draws it with one local plotly.js. No executed notebook embeds the
    4.9 MB plotly.js."""
    import plotly.io as pio

    pio.renderers.default = "plotly_mimetype"


def live_gpu() -> bool:
    return runtime.has_cuda()
