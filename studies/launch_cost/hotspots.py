"""cProfile of each LoRA path's eager steps (every adapter disabled), the functions that take the host's time:
    python3 -m studies.launch_cost.hotspots [--tokens 256] [--calls 2000] [--top 18]
A GPU's figures only (under the interpreter the kernels themselves run on the host)."""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
from pathlib import Path

from lora_moe_lab.model.lab import build_lab
from studies.launch_cost import record


ROOT = Path(__file__).resolve().parents[2]


def short_paths(text: str) -> str:
    """The profile's file names without the machine's folders: the checkout's relative to it, an installed
    package's from its site-packages (the same file on every machine reads the same)."""
    text = text.replace(f"{ROOT}/", "")
    return re.sub(r"/\S*/site-packages/", "site-packages/", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=18)
    a = ap.parse_args(argv)
    lab = build_lab(a.preset, num_layers=1, max_loras=4, max_rank=16, backend="triton", dtype="auto", seed=0)
    for i in range(4):
        lab.pool.load(f"a{i}", rank=16, seed=i)
    for (path, step), fn in record._calls(lab, a.tokens).items():
        fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.calls):
            fn()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
        lines = [ln for ln in s.getvalue().splitlines() if ln.strip()][2:]
        print(f"=== {path} / {step}: {a.calls} calls")
        print(short_paths("\n".join(lines[: a.top + 3])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
