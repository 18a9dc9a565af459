"""Eager decode's LoRA cost on the host: what one MoE layer's forward costs the host with LoRA on and off.

    python -m studies.lora_tax.host --out /tmp/host                        # CPU (interpreter), ~1 min
    PYTHONPATH=$PWD python3 studies/lora_tax/host.py --out $OUT/host       # an H200: both arms, ~1 min

In eager mode at decode sizes the host issues kernels slower than the GPU runs them (lora_tax.csv: eager 27-68 ms a
forward against 15 ms in graphs), so LoRA's eager cost is the host work it adds, which bytes and FLOPs do not bound.
This splits that work per layer of the model's forward (model/moe.py: MiniMoEModel, `--layers` layers, M tokens, one
per request, every request on one of 4 adapters of rank 16; LoRA-off is the same batch with no adapter active):

  stubbed  every Triton launch replaced by a counter: the lab's own Python per layer (checks, plans, alignment and
           launch arguments, allocations), and the launches per layer by kernel
  issued   (a GPU only) the real launches: Python + Triton's launcher + the driver, timed from the forward's call to
           its return (the host's issue time; the device is synchronised after, outside the sample)

Per arm and shape, off and on are timed interleaved (rotated order): `--reps` paired repetitions, each the mean of
`--inner` forwards back to back, after `--warmup` untimed calls. ratio = median(off) / median(on), the eager ratio
the host alone allows, with its percentile bootstrap 95 % interval over the pairs. On a CPU the launches run under
the interpreter's decorator but never execute; the plan is the H200's table (kernels/tile_tables/
lora_plan_NVIDIA_H200.json), so the paths are the ones the H200 runs.

Writes --out/lora_tax_host.csv (a row per shape, tokens and arm) and its metadata (provenance, the host's CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import platform
import time

import numpy as np

from lora_moe_lab import runtime
from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.instruments.recorders.harness import Recorder, log
from lora_moe_lab.instruments.recorders.timing import rotated

SHAPES = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
TOKENS = (64, 128)
INTERVAL = "percentile bootstrap (10,000 resamples) of median(off) / median(on) over the paired repetitions, 95 %"


@contextlib.contextmanager
def stubbed_launches(counts: dict):
    """Every `kernel[grid](...)` counts into `counts` (by kernel name) instead of launching: the host's Python stays,
    the launch does not. Covers the GPU's JITFunction and the interpreter's InterpretedFunction, and runs the GPU's
    alignment (moe_align_triton) on a CPU as well."""
    from triton.runtime import interpreter, jit

    from lora_moe_lab.kernels.align import moe_align_triton
    from lora_moe_lab.ops.triton_backend import TritonBackend

    classes = [c for c in (jit.JITFunction, getattr(interpreter, "InterpretedFunction", None)) if c is not None]
    saved = {c: c.__dict__.get("__getitem__") for c in classes}
    align = TritonBackend.__dict__.get("align")

    def getitem(self, grid):
        name = getattr(getattr(self, "fn", None), "__name__", None) or getattr(self, "__name__", "kernel")

        def launch(*a, **k):
            counts[name] = counts.get(name, 0) + 1
        return launch
    try:
        for c in classes:
            c.__getitem__ = getitem
        # the GPU's alignment (its Triton kernels) on a CPU too, where the backend would run the torch version
        TritonBackend.align = staticmethod(moe_align_triton)
        yield counts
    finally:
        if align is None:
            del TritonBackend.align
        else:
            TritonBackend.align = align
        for c, f in saved.items():
            if f is None:
                del c.__getitem__
            else:
                c.__getitem__ = f


def build(shape: str, layers: int, dev):
    """The MoE model of `shape` (`layers` layers, 4 adapters of rank 16 loaded): fp16 under the interpreter (its bf16
    is wrong), bf16 on a GPU."""
    from lora_moe_lab.model.lab import build_lab

    dtype = "bfloat16" if dev.type == "cuda" else "float16"
    lab = build_lab(shape, num_layers=layers, max_loras=4, max_rank=16, dtype=dtype, device=str(dev),
                    backend="triton")
    for i in range(4):
        lab.pool.load(f"a{i}", rank=16)
    return lab


def arms_of(lab, M: int):
    """(off, on): forwards of M tokens, no adapter active / every request on one of the 4 adapters."""
    import torch

    from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors

    x = torch.randn(M, lab.shape.hidden, dtype=lab.dtype, device=lab.device)
    out = {}
    for arm, names in (("off", [None] * M), ("on", [f"a{i % 4}" for i in range(M)])):
        b = LoRABatchInfo.build(lab.pool, names, [1] * M)
        t = LoRABatchTensors.from_batch(b, lab.device)
        out[arm] = (lambda b=b, t=t: lab.model(x, b, t))
    return out


def time_host(fns: dict, reps: int, warmup: int, inner: int) -> dict:
    """Host microseconds per call of each function, interleaved (rotated order): a sample is `inner` calls back to
    back from an idle device (synchronised after them, outside the sample)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    runtime.synchronize()
    got = {n: [] for n in fns}
    for r in range(reps):
        for n in rotated(list(fns), r):
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[n]()
            got[n].append((time.perf_counter() - t0) * 1e6 / inner)
            runtime.synchronize()
    return got


def measure(lab, shape: str, M: int, arm: str, reps: int, warmup: int, layers: int, inner: int = 10) -> dict:
    from lora_moe_lab.kernels import plan_table

    fns = arms_of(lab, M)
    counts: dict = {}
    launches = {}
    with plan_table.override(plan_table.load("NVIDIA_H200")):
        if arm == "issued":
            got = time_host(fns, reps, warmup, inner)
        else:
            if lab.device.type == "cuda":  # compiled, and each launcher's first-launch bookkeeping done (occupancy)
                for f in fns.values():
                    f()
                runtime.synchronize()
            with stubbed_launches(counts):
                for n, f in fns.items():  # the launches of one forward per arm
                    counts.clear()
                    f()
                    launches[n] = sum(counts.values()) / layers
                got = time_host(fns, reps, warmup, inner)
    off, on = np.asarray(got["off"]) / layers, np.asarray(got["on"]) / layers
    ratio, lo, hi = stats.bootstrap_paired(off, on, "ratio_of_medians")
    return dict(shape=shape, tokens=M, arm=arm, layers=layers, reps=reps, inner=inner, warmup=warmup,
                off_us_per_layer=float(np.median(off)), on_us_per_layer=float(np.median(on)),
                added_us_per_layer=float(np.median(on) - np.median(off)), ratio=ratio, lo=lo, hi=hi,
                interval=INTERVAL, launches_off=launches.get("off", ""), launches_on=launches.get("on", ""),
                device=lab.device.type)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--inner", type=int, default=10, help="forwards per sample (their mean)")
    ap.add_argument("--overwrite", action="store_true", help="replace a recording already at --out")
    args = ap.parse_args(argv)
    if args.reps < stats.MIN_PAIRED_REPS:
        raise SystemExit(f"--reps must be >= {stats.MIN_PAIRED_REPS} (a paired bootstrap interval), got {args.reps}")
    if args.layers < 1:
        raise SystemExit(f"--layers must be >= 1, got {args.layers}")
    tokens = [int(t) for t in args.tokens.split(",")]
    dev = runtime.default_device()
    arms = ("stubbed", "issued") if dev.type == "cuda" else ("stubbed",)
    rows: list[dict] = []
    rec = Recorder("lora_tax_host", args.out, params=vars(args), rows=rows, overwrite=args.overwrite)
    rec.meta["cpu"] = platform.processor() or platform.machine()
    for shape in args.shapes.split(","):
        lab = build(shape, args.layers, dev)
        for M in tokens:
            for arm in arms:
                r = measure(lab, shape, M, arm, args.reps, args.warmup, args.layers, args.inner)
                rows.append(r)
                rec.write()
                log(f"{shape} M={M} {arm}: off {r['off_us_per_layer']:.0f} us/layer, on {r['on_us_per_layer']:.0f} "
                    f"(+{r['added_us_per_layer']:.0f}); ratio {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]; "
                    f"launches {r['launches_off']} -> {r['launches_on']}")
        del lab
    rec.write()


if __name__ == "__main__":
    main()
