"""Triton path vs the torch backend, whole MoE+LoRA layers, same inputs.

    PYTHONPATH=. python3 studies/backends/record.py --out DIR     -> DIR/backends.csv (+ .meta.json, with its seal)

For each preset and M: a 2-layer model (every layer has the same shapes, so 2 layers show the
per-layer cost), bf16, 4 adapter slots of rank 32 all in use, requests cycling over the 4
adapters; one forward with backend="torch" and one with backend="triton" on the same weights
and input. Checks the two agree (bf16 tolerance 2e-2 relative Frobenius), then times each as
CUDA-graph replay (device time; median of --reps). On CPU (smoke test): eager wall clock, tiny.
The agreement check pins the expert choice of the Triton run in both (see pinned_forward).
"""
import argparse
import os

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.timing import time_device, time_graph
from lora_moe_lab.model.lab import LabCache, split_tokens
from lora_moe_lab.provenance import META_KEYS, metadata


_ROUTES: list = []


def pinned_forward(lab, fn, record: bool):
    """Run fn with the expert choice of the first (recorded) run pinned in every layer: bf16 rounding
    differences between backends can flip a near-tie in the next layer's router, which changes a
    token's experts and says nothing about either backend's arithmetic."""
    layers = lab.model.layers
    if record:
        _ROUTES.clear()
        lab.model.routing_log = _ROUTES
        try:
            return fn()
        finally:
            lab.model.routing_log = None
    saved = [l.route for l in layers]
    for l, r in zip(layers, _ROUTES):
        l.route = (lambda r=r: (lambda h, *a, **k: r))()
    try:
        return fn()
    finally:
        for l, s in zip(layers, saved):
            l.route = s


def table_name(check_only: bool) -> str:
    return "backends_check.csv" if check_only else "backends.csv"


def write(out: str, rows: list[dict], meta: dict, check_only: bool = False, overwrite: bool = False) -> str:
    """The table (temp file + os.replace), then its metadata (backends.meta.json; backends_check.meta.json for
    --check-only), then the table's seal in it (instruments/recorders/tables.write_table). A table of another
    kind at the path is refused unless `overwrite`; no rows, no CSV (the metadata is still written)."""
    path = os.path.join(out, table_name(check_only))
    tables.write_table(path, rows, meta=meta, replace=overwrite)  # its sibling <name>.meta.json
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace a table already at --out")
    ap.add_argument("--presets", nargs="+", default=["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 1024, 8192])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--check-only", action="store_true", help="agreement with pinned routing, no timing")
    a = ap.parse_args(argv)
    try:  # before any model is built: an existing table is replaced only with --overwrite
        tables.claim(os.path.join(a.out, table_name(a.check_only)), overwrite=a.overwrite)
    except tables.TableError as e:
        ap.error(str(e))
    cuda = runtime.has_cuda()
    dtype = runtime.resolve_dtype("auto")  # bf16 on a GPU, fp32 under the CPU interpreter
    os.makedirs(a.out, exist_ok=True)
    meta = metadata(params={k: v for k, v in vars(a).items() if k != "overwrite"})
    write(a.out, [], meta, a.check_only)  # the metadata first (no rows yet: no CSV)
    row_meta = {k: meta[k] for k in META_KEYS}
    rows, labs = [], LabCache()
    for preset in a.presets:
        lab = labs.get(preset=preset, num_layers=2, dtype=dtype, max_loras=4, max_rank=32, backend="triton")
        for i in range(4):
            lab.pool.load(f"a{i}", rank=32)
        for M in a.tokens:
            R = min(M, 64)
            batch, tensors = lab.make_batch([f"a{i % 4}" for i in range(R)], split_tokens(M, R))
            x = lab.random_input(M, seed=M)
            out, t = {}, {}
            for be in ("triton", "torch"):
                lab.model.backend_name = be  # the model looks its backend up by name at each forward
                fn = lambda: lab.model(x, batch, tensors, guard="cpu_flag")  # noqa: E731
                out[be] = pinned_forward(lab, fn, be == "triton").float()
                if not a.check_only:
                    t[be] = (time_graph(fn, warmup=2, reps=a.reps) if cuda
                             else time_device(fn, warmup=1, reps=2)).median_us
                else:
                    t[be] = float("nan")
            err = ((out["triton"] - out["torch"]).norm() / out["torch"].norm()).item()
            row = dict(preset=preset, layers=2, M=M, dtype=dtype, rank=32, torch_us=t["torch"], triton_us=t["triton"],
                       speedup=t["torch"] / t["triton"], rel_err=err, ok=err < 2e-2, **row_meta)
            rows.append(row)
            print(f"{preset:18s} M={M:6d} torch {t['torch']:10.1f} us  triton {t['triton']:9.1f} us  "
                  f"x{row['speedup']:6.2f}  rel err {err:.1e}", flush=True)
    labs.free()
    write(a.out, rows, meta, a.check_only, overwrite=True)  # claimed above: this run's table
    print("ALL AGREE" if all(r["ok"] for r in rows) else "BACKENDS DISAGREE")


if __name__ == "__main__":
    main()
