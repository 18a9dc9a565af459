"""The harness every GPU recording script (scripts/record_*.py) uses: one tidy row list, device
timing of CUDA-graph replays, the copy-bandwidth ceiling, guarded sections, dry runs, and writing
`<name>.csv` beside `<name>.meta.json` (provenance.metadata: GPU, versions, commit, date, params).

    rec = Recorder("kernels", out_dir, params=vars(args))
    rec.section("check bf16", check, rec, ...)   # an exception is kept in meta["errors"], rows so far written
    rec.row(section="check", preset=..., M=..., ok=True)
    rec.write()                                  # out_dir/kernels.csv + out_dir/kernels.meta.json

A dry run (`--dry`, or a machine without a GPU) times every function once on the CPU with tiny
shapes: `graph_time_us` and `copy_bandwidth` then return 1.0, so every code path is exercised
without a device.
"""
from __future__ import annotations

import json
import os
import time
import traceback

import torch

from ... import runtime
from ...provenance import metadata
from .timing import time_device, time_graph

_DRY = False
ROWS: list[dict] = []  # the process's one row list: a recording script is one process, its sections share it


def set_dry(on: bool = True) -> None:
    """Dry run: timing calls each function once and report 1.0 (CPU, interpreter, tiny shapes)."""
    global _DRY
    _DRY = on


def is_dry() -> bool:
    return _DRY


def log(*a) -> None:
    print(*a, flush=True)


def graph_time_us(fns, inner: int = 1, reps: int = 25) -> float:
    """Median device time of one call, from replays of one CUDA graph holding [fns...] * inner (fns
    rotate input sets, so small-M weights are not all hot in L2; inner > 1 spreads the replay's launch)."""
    if _DRY:
        for f in fns:
            f()
        return 1.0
    return time_graph(lambda: [f() for f in fns], warmup=3, reps=reps, repeat=inner).median_us / len(fns)


def copy_bandwidth(dev) -> tuple[float, dict]:
    """Device-to-device copy ceiling in GB/s (bytes read + written per second): the best of a plain
    copy_ timed eagerly with events and inside a graph, on 2 GiB buffers (far beyond the 50 MB L2)."""
    if _DRY:
        return 1.0, {}
    n = 1 << 30  # bf16 elements: 2 GiB per buffer
    a = torch.randn(n // 2, device=dev, dtype=torch.float32).view(torch.bfloat16)
    b = torch.empty_like(a)
    t_graph = graph_time_us([lambda: b.copy_(a)], inner=4, reps=10)
    t_eager = time_device(lambda: b.copy_(a), warmup=2, reps=10).median_us
    nbytes = 2 * a.numel() * a.element_size()
    return max(nbytes / (t * 1e-6) / 1e9 for t in (t_graph, t_eager)), dict(graph_us=t_graph, eager_us=t_eager)


def matmul_rate(dev, n: int = 8192) -> tuple[float, dict]:
    """Dense bf16 matrix-product ceiling in TFLOP/s: an n x n x n product through torch (cuBLAS) on random data
    (zeros run faster on Hopper's tensor cores), the best of a graph replay and eager events, 10 repetitions
    each after a warm-up. The FLOP side of a kernel's floor, as `copy_bandwidth` is the byte side."""
    if _DRY:
        return 1.0, {}
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    t_graph = graph_time_us([lambda: torch.mm(a, b, out=c)], inner=2, reps=10)
    t_eager = time_device(lambda: torch.mm(a, b, out=c), warmup=3, reps=10).median_us
    flops = 2.0 * n ** 3
    return max(flops / (t * 1e-6) / 1e12 for t in (t_graph, t_eager)), dict(mm_graph_us=t_graph, mm_eager_us=t_eager)


def counted_launches(launches) -> None:
    """Run every launch once to compile and warm it, then once more between cudaProfilerStart/Stop: under
    `ncu --profile-from-start off` only those second launches are counted, in the order given."""
    for f in launches:
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for f in launches:
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def row(**kw) -> dict:
    """Append one tidy row to ROWS (and return it)."""
    ROWS.append(kw)
    return kw


def route(M: int, E: int, k: int, gen, dev):
    """Top-k routing of random router logits: (weights (M, k) float32 renormalised, ids (M, k) int32)."""
    logits = torch.randn(M, E, generator=gen, device=dev)
    w, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).float().contiguous(), ids.int().contiguous()


def cfg_str(bm: int, c) -> str:
    """A LoRA kernel tile as one token: bm64/bn64/bk128/split1/w4/s3/pps4[/pf2][/r128][/xs3]."""
    return (f"bm{bm}/bn{c.block_n}/bk{c.block_k}/split{c.split_n}/w{c.num_warps}/s{c.num_stages}"
            f"/pps{c.programs_per_sm}" + (f"/pf{c.prefetch}" if getattr(c, "prefetch", 0) else "")
            + (f"/r{c.max_regs}" if getattr(c, "max_regs", 0) else "")
            + (f"/xs{c.expand_stages}" if getattr(c, "expand_stages", 0) else ""))


class Recorder:
    """The rows and metadata of one recording, written as out_dir/<name>.csv + <name>.meta.json (each
    atomically; the metadata keeps the CSV's seal, rows + sha256). With `overwrite` given (a recorder's
    --overwrite flag), a recording already at out_dir/<name>.csv is refused before any work unless it is
    True (tables.claim: TableExistsError naming the file); None (the default) checks nothing."""

    def __init__(self, name: str, out_dir, params: dict | None = None, rows: list[dict] | None = None,
                 overwrite: bool | None = None):
        self.name, self.out_dir = name, str(out_dir)
        if overwrite is not None:
            self.claim(self.out_dir, name, overwrite)
        os.makedirs(self.out_dir, exist_ok=True)
        if rows is None:  # a new recording in this process starts from no rows: one recorded before (a test that
            ROWS.clear()  # ran another recorder in the same process) is not this one's
        self.rows = ROWS if rows is None else rows
        self.meta = metadata(params=dict(params or {}, interpreter=runtime.interpreter(), dry=_DRY))
        self.meta["errors"] = []
        self.t0 = time.time()

    @staticmethod
    def claim(out_dir, name: str, overwrite: bool) -> None:
        """Before any work: refuse a recording already at out_dir/<name>.csv unless `overwrite`
        (tables.claim: TableExistsError, a ValueError naming the file)."""
        from . import tables

        tables.claim(os.path.join(str(out_dir), f"{name}.csv"), overwrite=overwrite)

    def row(self, **kw) -> dict:
        self.rows.append(kw)
        return kw

    def select(self, section: str, **match) -> list[dict]:
        return [r for r in self.rows if r.get("section") == section and all(r.get(k) == v for k, v in match.items())]

    def section(self, name: str, fn, *a, **kw):
        """fn(*a, **kw); an exception is recorded in meta["errors"] (one failing section must not lose
        the others), and the rows so far are written either way."""
        try:
            return fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001 - kept in the recording, the next section runs
            traceback.print_exc()
            self.meta["errors"].append(f"{name}: {type(exc).__name__}: {exc}"[:500])
            runtime.synchronize()
        finally:
            self.write()

    def write(self, path: str | None = None) -> str:
        """The CSV (columns in first-seen order), its metadata, then the CSV's seal in it, each written
        atomically (temp file + os.replace: a reader never sees half a file; tables.write_table); returns
        the CSV's path. With no rows yet no CSV is written (an empty one would block a rerun and no reader
        can read it); the metadata is. The run owns its table: each write replaces the one before."""
        from . import tables

        self.meta["wall_s"] = time.time() - self.t0
        f = path or os.path.join(self.out_dir, f"{self.name}.csv")
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        tables.write_table(f, self.rows, keys, meta=self.meta, meta_path=f[:-len(".csv")] + ".meta.json",
                           replace=True, default=str)
        return f


def pack_session(work, out, name: str, meta: dict, t0: float, **extra) -> None:
    """A session folder's meta.json (with `extra`, the wall time and the card after the work: clocks
    and power under load) and its tarball `out/<name>.tar.gz`, written after every task so that a
    call killed at its time limit still returns what it measured."""
    import tarfile
    from pathlib import Path

    from ...provenance import gpu_state

    work, out = Path(work), Path(out)
    meta.update(extra)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["gpu_state_end"] = gpu_state()
    from .tables import write_text_atomic

    write_text_atomic(work / "meta.json", json.dumps(meta, indent=1) + "\n")
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(work, arcname=name)


def session_parser(doc: str, out: str, reps: int, minutes: float, tasks: list[str]):
    """The flags every session recording shares (studies/production/record.py,
    studies/tp_emulation/record.py): --session, --out, --reps, --minutes, --tasks, --smoke."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session", default="s1", help="this device session's label (default s1)")
    ap.add_argument("--out", default=os.environ.get("OUT", out), help=f"default: $OUT, else {out}")
    ap.add_argument("--reps", type=int, default=reps, help=f"interleaved repetitions per task (default {reps})")
    ap.add_argument("--minutes", type=float, default=minutes,
                    help=f"start no repetition after this (default {minutes:g})")
    ap.add_argument("--tasks", nargs="+", default=tasks, help=f"default: {' '.join(tasks)}")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 2 layers, 12 reps (CPU or GPU)")
    return ap


def log_rows(sections, line) -> None:
    """log(line(r)) for every row of ROWS whose section is `sections` (a name) or one of them (a
    tuple): the summary printouts of the recording scripts."""
    names = (sections,) if isinstance(sections, str) else tuple(sections)
    for r in ROWS:
        if r.get("section") in names:
            log(line(r))
