"""Argument types shared by the command-line tools (bench, prefill): each converts, range-checks
and names what it expected, so a bad value is a clear argparse error, never a traceback."""
from __future__ import annotations

import argparse
import math
import re
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


def _number(s: str) -> float:
    """float(s), refusing what float() takes but no one means as a number here: 'True'/'False' never
    reach it (float('True') fails), but 'inf', 'nan' and '1e400' (inf) do and are refused by `finite`."""
    return float(s)


def _finite(v: float) -> bool:
    return math.isfinite(v)


pos_int = arg_type(int, lambda v: v > 0, "a positive integer")
nonneg_int = arg_type(int, lambda v: v >= 0, "an integer >= 0")
pos_float = arg_type(_number, lambda v: _finite(v) and v > 0, "a finite positive number")
nonneg_float = arg_type(_number, lambda v: _finite(v) and v >= 0, "a finite number >= 0")
fraction = arg_type(_number, lambda v: _finite(v) and 0.0 <= v <= 1.0, "a fraction in [0, 1]")
guard_sites = arg_type(_number, lambda v: _finite(v) and 1.0 <= v <= 1000.0,
                       "guard decisions per layer: a finite number in [1, 1000]")
seed = arg_type(int, lambda v: 0 <= v < 2 ** 63, "a seed: an integer in [0, 2**63)")
DTYPES = ("auto", "bfloat16", "float16", "float32")


def dtype(s: str) -> str:
    """--dtype: auto or one of the float types the model computes in."""
    if s not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {s!r}; choose from {', '.join(DTYPES)}")
    return s

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def device(s: str) -> str:
    """--device: cpu, cuda, cuda:N or auto; a CUDA device must exist on this machine."""
    if not _DEVICE.match(s or ""):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, got {s!r}")
    if s.startswith("cuda"):
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        idx = int(s.split(":")[1]) if ":" in s else 0
        if n == 0:
            raise argparse.ArgumentTypeError(f"{s!r}: this machine has no CUDA GPU (use cpu or auto)")
        if idx >= n:
            raise argparse.ArgumentTypeError(f"{s!r}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
    return s


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
