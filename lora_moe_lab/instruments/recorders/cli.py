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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` shows every option's default and keeps the line breaks of the description and of
    the epilog (where each tool puts its examples)."""


# What a figure measured on a CPU means. On a GPU the host fills a queue the device runs from, and
# `.item()` makes the host wait until the queue has drained; the bubble is the GPU idling after it.
# A CPU runs every op inline in the host thread: nothing is queued, `.item()` reads memory the host
# already has, no device ever idles.
CPU_NOTE = ("Measured on a CPU (wall clock, torch ops run inline): nothing is queued, so `.item()` drains no queue. "
            "us_per_sync here is the host's own cost per guard call plus its noise, not a GPU bubble; GPU idle, where "
            "a table has it, is NaN on a CPU (no device trace). Run on a GPU for the lesson's figures.")


def measured_on_cpu(df) -> bool:
    """Do these rows (a sweep or recording table with `gpu` and/or `timer` columns) come from a CPU?"""
    cols = getattr(df, "columns", ())
    if "timer" in cols and len(df):
        return bool((df["timer"].astype(str) == "wall").all())
    if "gpu" in cols and len(df):
        return bool((df["gpu"].astype(str).str.lower() == "cpu").all())
    return False
