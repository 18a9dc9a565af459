"""What the studies' blocks share (each study's block.py; scripts/readme_tables.py renders them): the checkout's
root and the number formats every figure uses."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f}"


def _ci(est, lo, hi, unit=" %", nd=1) -> str:
    return f"**{est:+.{nd}f}{unit}** [{lo:+.{nd}f}, {hi:+.{nd}f}]"


def _gain(r, fmt="{:+.1f}") -> str:
    return f"{fmt.format(r.estimate)} % [{fmt.format(r.lo)}, {fmt.format(r.hi)}]"
