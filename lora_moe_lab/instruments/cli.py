"""Argument types shared by the command-line tools (bench, prefill): each converts, range-checks
and names what it expected, so a bad value is a clear argparse error, never a traceback."""
from __future__ import annotations

import argparse
import sys


def arg_type(convert, ok, what: str):
    """An argparse `type` that converts with `convert` and accepts the value when `ok(value)`."""
    def parse(s: str):
        try:
            v = convert(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v
    return parse


pos_int = arg_type(int, lambda v: v > 0, "a positive integer")
nonneg_int = arg_type(int, lambda v: v >= 0, "an integer >= 0")
pos_float = arg_type(float, lambda v: v > 0, "a positive number")
fraction = arg_type(float, lambda v: 0.0 <= v <= 1.0, "a fraction in [0, 1]")


class _Silent:
    """What `progress` hands out when disabled: the bar's methods, doing nothing."""

    def update(self, n=1): pass
    def set_description(self, s): pass
    def set_postfix_str(self, s): pass
    def close(self): pass


def progress(total: int, enabled: bool = True, *, unit: str = "row", initial: int = 0):
    """A progress bar on stderr (tqdm: a widget in JupyterLab, text in a terminal), or a silent one."""
    if not enabled:
        return _Silent()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, file=sys.stderr, dynamic_ncols=True)
