"""Where an eager LoRA launch's host time goes, per LoRA path: one MoE layer's op (gate_up and down) as the layer
issues it (kernels/paths/: the path's `prepare`, `delta` or `gemm`), timed on the host with perf_counter around
`--inner` calls and no sync inside, the median over `--reps` repetitions, each part with some of the work taken out:

    full        the call as the layer makes it (a GPU only: under the interpreter the kernel runs on the host)
    no_triton   the Triton kernels replaced by a stub that launches nothing: everything but Triton's own launch
    no_checks   the input checks replaced by no-ops too: the path's and the launcher's Python alone
    binder      Triton's own Python before its C launcher, for the step's kernels with the step's arguments: the
                binding of the arguments, their specialization (alignment, dtypes, small ints) and the cache key
                (triton.runtime.jit's binder and compute_cache_key, on a Hopper target where there is no GPU)
    launcher    the compiled kernels' C launchers alone, called with the step's arguments bound once (a GPU only):
                the floor of any launch of these kernels from Python, Triton's binder and our code skipped
    empty       an empty Triton kernel with one pointer, and one with the aligned LoRA kernel's 35 arguments
                (kernels/empty.py): Triton's launch floor on this machine (a GPU only; their binder on any machine)

Triton's own launch is full - no_triton: its binder (Python that grows with the arguments), the launcher, and the
rest of JITFunction.run. The checks are no_triton - no_checks. Every path runs with every adapter disabled (the
CUDA-graph case: the kernels launch and exit early), at M tokens of qwen3-30b-a3b's layer shape on a GPU, of the
tiny preset under the interpreter (its host-side parts only).

    python3 studies/launch_cost/record.py                  -> data/launch_cost/launch_cost_<GPU>.csv
    python3 studies/launch_cost/record.py --smoke          -> build/launch_cost/ (tiny, any machine)

Each row carries the recording's metadata (GPU, versions, commit); the file is one machine's, named by its GPU. On a
CPU the torch ops the paths issue run on the host too (the alignment, the buffers), so only a GPU's figures say
what an eager launch costs."""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from lora_moe_lab import runtime
from lora_moe_lab.kernels import align, common, fused_moe, fused_moe_lora, fused_moe_lora_packed, lora_decode, paths
from lora_moe_lab.kernels import plan as plan_mod
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.moe import LoRAHook
from lora_moe_lab.provenance import DATA, metadata

KERNELS = {fused_moe_lora: "fused_moe_lora_kernel", lora_decode: "lora_decode_kernel",
           fused_moe_lora_packed: "packed_shrink_kernel", fused_moe: "fused_moe_kernel"}
# the checks a no-op replaces (the ones that return the sizes they derive stay in: check_gemm_inputs,
# check_lora_gemm_inputs, _check_decode_inputs; a stub would need the launcher's arithmetic again)
CHECKS = ("check_tensor", "check_alignment", "check_compute_dtype", "num_pairs_of", "check_routed_weights")
ALIGN_KERNELS = [n for n in dir(align) if n.endswith("_kernel")]


class _Stub:
    """A kernel that launches nothing: `kernel[grid](...)` returns None; with `seen`, it keeps each launch's
    (kernel, grid, args, kwargs) there."""

    def __init__(self, kernel=None, seen: list | None = None):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        if self.seen is None:
            return lambda *a, **kw: None
        return lambda *a, **kw: self.seen.append((self.kernel, grid, a, kw))


@contextlib.contextmanager
def _taken_out(triton: bool, checks: bool, seen: list | None = None):
    """The kernels (and the checks) of every kernel module replaced for the block; with `seen`, the stubs keep
    each launch there."""
    saved = []
    mods = [*KERNELS, align, common]
    try:
        for m in mods:
            names = ([KERNELS[m]] if m in KERNELS else ALIGN_KERNELS if m is align else []) if triton else []
            names += [n for n in CHECKS if checks and hasattr(m, n)]
            for n in names:
                saved.append((m, n, getattr(m, n)))
                stub = (_Stub(getattr(m, n), seen) if n.endswith("_kernel")
                        else (lambda *a, n=n, **kw: _return_of(n, a, kw)))
                setattr(m, n, stub)
        yield
    finally:
        for m, n, v in reversed(saved):
            setattr(m, n, v)


def _return_of(name, a, kw):
    """What a check returns where its caller reads it (the sizes it derives), computed without checking."""
    if name == "num_pairs_of":
        x, top_k, gather = a[0], a[1], a[2]
        return x.shape[0] * top_k if gather else x.shape[0]
    if name == "check_alignment":
        return a[0].block_m
    return None


def _host_us(fn, inner: int, reps: int) -> float:
    fn()
    runtime.synchronize()
    out = []
    for _ in range(reps):
        runtime.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / inner)
    runtime.synchronize()
    return statistics.median(out)


def _binder(kernel):
    """Triton's binder of a kernel (the function its JIT launch calls on every launch with the arguments, before the
    cache lookup and the C launcher), built for this GPU's target, or for a Hopper one where there is none."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction, create_function_from_signature
    fn = kernel
    while hasattr(fn, "fn"):  # the interpreter's wrapper, then the JIT function, then the Python function
        fn = fn.fn
    target = driver.active.get_current_target() if runtime.has_cuda() else GPUTarget("cuda", 90, 32)
    jit = JITFunction(fn)
    return create_function_from_signature(jit.signature, jit.params, make_backend(target))


def binder_call(launches: list):
    """One call of Triton's binder and cache key for each of `launches` ((kernel, grid, args, kwargs), as a step made
    them): what Triton's own launch does in Python before its C launcher."""
    from triton.runtime.jit import compute_cache_key
    jobs = [(_binder(k), a, dict(kw, debug=False, instrumentation_mode=""), {}) for k, _, a, kw in launches]

    def call():
        for bind, a, kw, cache in jobs:
            _, spec, options = bind(*a, **kw)
            compute_cache_key(cache, spec, options)
    return call


def launcher_call(launches: list):
    """The C launcher alone for each of `launches` (a GPU only): Triton's own launch runs each once (it compiles or
    finds the kernel and returns it), the arguments are bound once with Triton's binder, and the call passes them
    to the compiled kernel's launcher as `JITFunction.run` does, with no launch hooks."""
    from triton.runtime import driver
    jobs = []
    for k, grid, a, kw in launches:
        compiled = k[grid](*a, **kw)
        bound, _, _ = _binder(k)(*a, **dict(kw, debug=False, instrumentation_mode=""))
        dev = driver.active.get_current_device()
        g = (*grid, 1, 1)[:3]
        jobs.append((compiled.run, g, driver.active.get_current_stream(dev), compiled.function,
                     compiled.packed_metadata, tuple(bound.values())))

    def call():
        for run, g, stream, fn, meta, args in jobs:
            run(g[0], g[1], g[2], stream, fn, meta, None, None, None, *args)
    return call


def _launcher_row(path, step, M, seen, inner, reps) -> dict:
    """The step's `launcher` row; where the direct call fails (a Triton whose launcher takes other arguments), a row
    without a time whose `error` says why, so the other parts are still recorded."""
    try:
        us = _host_us(launcher_call(seen), inner, reps)
    except Exception as e:  # noqa: BLE001 -- the message is the finding
        print(f"launch_cost: {path} {step}: the C launcher called directly failed: {type(e).__name__}: {e}")
        return dict(path=path, step=step, M=M, part="launcher", host_us=float("nan"), launches=len(seen),
                    error=f"{type(e).__name__}: {e}"[:200])
    return dict(path=path, step=step, M=M, part="launcher", host_us=us, launches=len(seen))


def _calls(lab, M: int) -> dict:
    """{(path, step): fn}: each path's steps of one layer at M tokens, every adapter disabled."""
    layer, be, sh = lab.model.layers[0], lab.model.backend, lab.shape
    k, K, I = sh.top_k, sh.hidden, sh.intermediate
    names = list(lab.pool.loaded())
    batch, tensors = lab.make_batch([names[i % len(names)] for i in range(M)], [1] * M)
    tensors.adapter_enabled.zero_()  # every adapter disabled: the kernels launch and exit early
    info = lab.model.lora_info(0, batch, tensors)
    x = lab.random_input(M, seed=0)
    topk_w, topk_ids = layer.route(x, be)
    out = {}
    for name in ("separate", "decode", "packed", "wide"):
        entry = plan_mod.entries(name if name in ("packed", "wide") else "separate")
        t = plan_mod.table_for(lab.device).but(decode_max_pairs=10 ** 6 if name == "decode" else 0,
                                               ops={"gate_up": entry, "down": entry}, shapes={})
        with plan_mod.override(t):
            hook = LoRAHook(info, be, sh.num_experts)
            p13, p2 = hook.plans(M, sh, lab.device)
        if p13.path != name:
            continue  # e.g. wide where gate_up's K does not step evenly
        out.update(_steps(lab, paths.get(name), hook, p13, p2, x, topk_w, topk_ids))
    act, y = x.new_zeros(M * k, I), x.new_zeros(M * k, K)
    al = be.align(topk_ids, sh.num_experts, p2.block_m)
    out[("base", "down gemm")] = lambda: be.moe_gemm(act, layer.w2, al, k, y, routed_weights=topk_w, gather=False)
    return out


def _steps(lab, path, hook, p13, p2, x, topk_w, topk_ids) -> dict:
    """{(path, step): fn} of one path: its two GEMMs (in-GEMM paths), or its prepare and two deltas."""
    layer, be, sh = lab.model.layers[0], lab.model.backend, lab.shape
    M, k, K, I = x.shape[0], sh.top_k, sh.hidden, sh.intermediate
    al = be.align(topk_ids, sh.num_experts, p13.block_m)
    inter = x.new_zeros(M * k, 2 * I)
    act = x.new_zeros(M * k, I + p2.columns)[:, :I]
    y = x.new_zeros(M * k, K)
    xw = x.new_zeros(M, K + p13.columns)[:, :K] if p13.columns else x
    if path.in_gemm:
        return {(path.name, "gate_up gemm"): lambda: hook.gemm("gate_up", xw, layer.w13, al, k, inter),
                (path.name, "down gemm"): lambda: hook.gemm("down", act, layer.w2, al, k, y, topk_w)}
    hook.prepare(topk_ids)
    return {(path.name, "prepare"): lambda: hook.prepare(topk_ids),
            (path.name, "gate_up delta"): lambda: path.after_gate_up(hook, p13, x, inter, topk_ids, k),
            (path.name, "down delta"): lambda: path.after_down(hook, p2, act, y, k, topk_w)}


def record(preset: str, tokens, inner: int, reps: int) -> pd.DataFrame:
    gpu = runtime.has_cuda()
    lab = build_lab(preset, num_layers=1, max_loras=4, max_rank=16, backend="triton", dtype="auto", seed=0)
    for i in range(4):
        lab.pool.load(f"a{i}", rank=16, seed=i)
    rows = []
    if gpu:
        from lora_moe_lab.kernels.empty import empty_args_kernel, empty_kernel
        d = torch.zeros(1, device=lab.device)
        p12 = [d] * 12
        rows += [dict(path="empty", step="1 pointer", M=0, part="full",
                      host_us=_host_us(lambda: empty_kernel[(1,)](d), inner, reps)),
                 dict(path="empty", step="12 pointers, 23 ints", M=0, part="full",
                      host_us=_host_us(lambda: empty_args_kernel[(1,)](*p12, *range(1, 24)), inner, reps)),
                 _launcher_row("empty", "1 pointer", 0, [(empty_kernel, (1,), (d,), {})], inner, reps),
                 _launcher_row("empty", "12 pointers, 23 ints", 0,
                               [(empty_args_kernel, (1,), (*p12, *range(1, 24)), {})], inner, reps)]
    if not gpu:
        from lora_moe_lab.kernels.empty import empty_args_kernel, empty_kernel
        d = torch.zeros(1)
    rows += [dict(path="empty", step="1 pointer", M=0, part="binder",
                  host_us=_host_us(binder_call([(empty_kernel, (1,), (d,), {})]), inner, reps)),
             dict(path="empty", step="12 pointers, 23 ints", M=0, part="binder",
                  host_us=_host_us(binder_call([(empty_args_kernel, (1,), (*[d] * 12, *range(1, 24)), {})]), inner,
                                   reps))]
    for M in tokens:
        for (path, step), fn in _calls(lab, M).items():
            parts = (["full"] if gpu else []) + ["no_triton", "no_checks"]
            for part in parts:
                with _taken_out(part != "full", part == "no_checks"):
                    rows.append(dict(path=path, step=step, M=M, part=part, host_us=_host_us(fn, inner, reps)))
            seen: list = []
            with _taken_out(True, False, seen):
                fn()
            if seen:  # the steps that launch only torch ops (an alignment on a CPU) have no Triton launch
                rows.append(dict(path=path, step=step, M=M, part="binder",
                                 host_us=_host_us(binder_call(seen), inner, reps), launches=len(seen)))
                if gpu:
                    rows.append(_launcher_row(path, step, M, seen, inner, reps))
    df = pd.DataFrame(rows)
    meta = metadata(dict(preset=preset, inner=inner, reps=reps))
    for k, v in meta.items():
        if not isinstance(v, (dict, list)):
            df[k] = v
    return df


def machine_name() -> str:
    if runtime.has_cuda():
        return torch.cuda.get_device_name().replace(" ", "_")
    import platform
    return "cpu_" + (platform.processor() or platform.machine()).replace(" ", "_")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="folder (default: data/launch_cost/ on a GPU)")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--inner", type=int, default=50)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="the tiny preset at 4 tokens, any machine (under the "
                                                         "interpreter the host-side parts only), into build/")
    a = ap.parse_args(argv)
    if a.inner < 1 or a.reps < 10:
        ap.error("--inner must be >= 1 and --reps >= 10 (the statistics rule)")
    if not runtime.has_cuda() and not a.smoke:
        ap.error("needs a CUDA GPU (Triton's own launch is the point); --smoke runs the host-side parts anywhere")
    preset, tokens = ("tiny", [4]) if a.smoke else (a.preset, a.tokens)
    df = record(preset, tokens, a.inner, a.reps)
    folder = a.out or (Path("build") / "launch_cost" if a.smoke else DATA / "launch_cost")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"launch_cost_{machine_name()}.csv"
    df.to_csv(out, index=False)
    print(df.pivot_table(index=["path", "step", "M"], columns="part", values="host_us").round(1).to_string())
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
