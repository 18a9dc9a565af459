"""LoRA's cost end to end: LoRA-on over LoRA-off throughput of the same model, with every request on an adapter.

    PYTHONPATH=$PWD python3 studies/lora_tax/record.py --session s1 --out $OUT/lora_tax   # one H200, ~4 min
    python studies/lora_tax/record.py --smoke --out /tmp/lora_tax                          # CPU, tiny, seconds

Cells (`regime`, `shape`, `tokens`, adapter setting, `mode`):
  prefill   the decoder (model/decoder.py: attention + MoE, 48 layers, TP=1) at the shapes of qwen3-30b-a3b and of one
            TP=4 rank (qwen3-30b-a3b-tp4): one chunk of C = 16384 tokens, `--requests` 16 requests of 1024
  decode    "the MoE part of decode": the 48-layer MoE model (model/lab.py: build_lab; the decoder has no KV cache) at
            M = 64 and 128 tokens, one token per request
  settings  r16              every request on one of 4 adapters of rank 16 (pool maximum rank 16), evenly
            mixed_even       4 adapters of ranks 8, 16, 32, 64 (pool maximum 64), requests spread evenly
            mixed_r64_70pct  the same, 70 % of the requests on the rank-64 adapter (the nearest whole number of
                             requests; `r64_share` is the share of tokens it got), the rest spread evenly
  modes     eager (the host issues every kernel) and graph (one CUDA-graph replay per forward; the batch metadata
            is written into the graph's buffers before each replay, as an engine does); guard cpu_flag
The LoRA-off arm is the same model and batch with no adapter active (`has_active_lora` False: the guard skips the LoRA
work), as the prefill CLI's `--adapters none`. Each model is built once: the settings of one pool maximum share an
adapter pool and one LoRA-off arm; the pool is swapped (16 -> 64) between them.

Own ranks: the decode kernel reads each adapter at its own rank (the batch's lora_ranks). In decode, each mixed-rank
setting also gets an arm `<setting>_padded`, the same batch with those ranks unset (every adapter read at the pool's
padded 64), timed in the same rotation: studies/lora_tax/own_rank.py reads padded over own from lora_tax_reps.csv.

Timing: per (regime, shape, tokens, pool, mode) the arms (off and each setting) are timed interleaved, each call from
an idle device (instruments/recorders/timing.py: time_interleaved, the order rotated per repetition), after `--warmup`
untimed calls per arm. stats.warmup_check drops the largest leading drift from every arm (pairs stay pairs) or marks
the block unstable (its ratios are NaN, never averaged). ratio = median(off) / median(on) over the kept repetitions
(= LoRA-on throughput / LoRA-off throughput), with its percentile bootstrap 95 % interval over the paired
repetitions (`interval` names it). floor_ratio = t_off / (t_off + t_lora_floor): t_lora_floor is the least time the
adapters' bytes and FLOPs take at their own ranks, over every layer and both ops (studies/lora_tax/floors.py), at the
H200's copy bandwidth and matmul rate recorded in data/kernels (read_floors.ceilings).

Writes, in --out: lora_tax.csv (one row per cell and session, appended through tables.append_rows: whole rows, fsync,
sealed in lora_tax.meta.json, which keeps every session's provenance) and lora_tax_reps.csv (every timed call, sealed
in lora_tax_reps.meta.json). A session is recorded once (--overwrite drops its rows first). A block that runs out of
GPU memory is written as status `oom` and the run goes on. studies/lora_tax/read.py pools the sessions.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gc
import os
import re
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from lora_moe_lab import runtime
from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.timing import rotated, time_interleaved
from lora_moe_lab.provenance import metadata

from studies.lora_tax import floors

ROOT = Path(__file__).resolve().parents[2]
QWEN3, TP4 = "qwen3-30b-a3b", "qwen3-30b-a3b-tp4"
SHAPE_ALIASES = {"qwen3": QWEN3, "tp4": TP4, "qwen3_tp4": TP4, QWEN3: QWEN3, TP4: TP4, "tiny": "tiny"}
REGIMES = ("prefill", "decode")
MODES = ("eager", "graph")
GUARD = "cpu_flag"
MAX_LORAS = 4
R64_SHARE = 0.70
INTERVAL = ("percentile bootstrap (10,000 resamples) of median(off) / median(on) over the kept paired repetitions, "
            "95 %")
CSV, REPS_CSV = "lora_tax.csv", "lora_tax_reps.csv"


@dataclasses.dataclass(frozen=True)
class Setting:
    label: str
    ranks: tuple
    mix: str  # "even" or "r64_70pct"
    pool_rank: int

    @property
    def ranks_str(self) -> str:
        return ",".join(map(str, self.ranks))


SETTINGS = (Setting("r16", (16, 16, 16, 16), "even", 16),
            Setting("mixed_even", (8, 16, 32, 64), "even", 64),
            Setting("mixed_r64_70pct", (8, 16, 32, 64), "r64_70pct", 64))

KEY = ["session", "regime", "shape", "tokens", "ranks", "mix", "mode"]
COLUMNS = KEY + ["setting", "requests", "tokens_per_request", "layers", "pool_max_rank", "r64_share", "guard",
                 "status", "n", "reps", "warmup", "warmup_dropped", "warmup_note", "off_ms", "on_ms",
                 "off_tok_per_s", "on_tok_per_s", "ratio", "lo", "hi", "interval", "t_lora_floor_ms", "floor_ratio",
                 "copy_gbps", "matmul_tflops", "error", "commit", "dirty", "gpu", "date", "torch", "triton", "dtype",
                 "backend", "device", "seed"]
REPS_KEY = ["session", "regime", "shape", "tokens", "pool_max_rank", "mode", "arm", "rep"]
REPS_COLUMNS = REPS_KEY + ["ranks", "mix", "order", "ms", "kept"]


class NeedsCuda(SystemExit):
    """The recording needs a CUDA GPU (an H200): refused before anything is built or written."""


# --- which request uses which adapter --------------------------------------------------------------------------------
def _largest_remainder(total: int, weights) -> list[int]:
    w = np.asarray(weights, float)
    raw = total * w / w.sum()
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out), kind="stable")[: total - out.sum()]:
        out[i] += 1
    return out.tolist()


def request_counts(requests: int, s: Setting) -> list[int]:
    """Requests per adapter of setting `s` (in the order of s.ranks): even, or 70 % (rounded) on the rank-64 adapter
    and the rest even."""
    n = len(s.ranks)
    if s.mix == "even":
        return _largest_remainder(requests, [1] * n)
    if s.mix == "r64_70pct":
        j = s.ranks.index(64)
        hot = round(R64_SHARE * requests)
        rest = _largest_remainder(requests - hot, [1] * (n - 1))
        return rest[:j] + [hot] + rest[j:]
    raise ValueError(f"unknown mix {s.mix!r}")


def assign(requests: int, s: Setting) -> list[int]:
    """The adapter (index into s.ranks) of each request, spread through the batch (smooth weighted round robin: each
    adapter's requests as evenly spaced as their counts allow)."""
    counts = request_counts(requests, s)
    cur, out = [0.0] * len(counts), []
    for _ in range(requests):
        for i, c in enumerate(counts):
            cur[i] += c
        i = max(range(len(counts)), key=lambda j: (cur[j], -j))
        cur[i] -= requests
        out.append(i)
    return out


# --- the cells -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cell:
    regime: str
    shape: str
    tokens: int
    setting: Setting
    mode: str

    @property
    def id(self) -> str:
        return f"{self.regime}/{self.shape}/{self.tokens}/{self.setting.label}/{self.mode}"


def cells(regimes, shapes, modes, prefill_tokens: int, decode_tokens, patterns=None) -> list[Cell]:
    out = [Cell(r, sh, t, s, m) for r in regimes for sh in shapes
           for t in ((prefill_tokens,) if r == "prefill" else tuple(decode_tokens)) for s in SETTINGS for m in modes]
    if patterns:
        out = [c for c in out if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    return out


def geometry(regime: str, tokens: int, requests: int) -> list[int]:
    """Tokens per request: prefill `requests` equal requests of tokens / requests; decode one token per request."""
    if regime == "decode":
        return [1] * tokens
    if tokens % requests:
        raise ValueError(f"prefill: {tokens} tokens do not split into {requests} equal requests")
    return [tokens // requests] * requests


# --- the labs --------------------------------------------------------------------------------------------------------
def build(regime: str, shape: str, a):
    from lora_moe_lab.model.decoder import build_decoder_lab
    from lora_moe_lab.model.lab import build_lab

    kw = dict(num_layers=a.layers, max_loras=MAX_LORAS, max_rank=16, dtype=a.dtype, device=a.device,
              backend=a.backend, seed=a.seed)
    if regime == "prefill":
        return build_decoder_lab(shape, guard_sites=1.0, **kw)
    return build_lab(shape, **kw)


def with_pool(lab, max_rank: int):
    """The same model with a fresh adapter pool of `max_rank`, swapped in place (Lab is mutable: no reference to the
    old pool, its packed and wide copies is left, so they are freed before the new one is allocated)."""
    from lora_moe_lab.config import LoRAConfig
    from lora_moe_lab.model.lora import AdapterPool

    if lab.pool.max_rank == max_rank and not lab.pool.loaded():
        return lab
    lab.model.pool = lab.pool = None
    _free()
    lab.pool = lab.model.pool = AdapterPool(lab.shape, LoRAConfig(MAX_LORAS, max_rank), dtype=lab.dtype,
                                            device=lab.device)
    return lab


def _free():
    gc.collect()
    if runtime.has_cuda():
        import torch

        torch.cuda.empty_cache()


def _mem() -> str:
    if not runtime.has_cuda():
        return ""
    import torch

    free, total = torch.cuda.mem_get_info()
    return f" [GPU memory: {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use]"


def adapter_names(s: Setting) -> list[str]:
    """The pool's adapters for setting `s`, by place and rank: the settings of one pool share them."""
    return [f"a{i}_r{r}" for i, r in enumerate(s.ranks)]


PADDED = "_padded"  # an arm's suffix: the same batch with its rows' ranks unset (lora_ranks 0: the padded rank read)


def batch_of(lab, adapters: list, counts: list[int], padded: bool):
    """The host batch of an arm; padded: its `lora_ranks` zeroed, so the decode kernel reads every adapter at the
    pool's padded rank (the path before it read each row's own), the same work otherwise."""
    from lora_moe_lab.model.lora import LoRABatchInfo

    b = LoRABatchInfo.build(lab.pool, adapters, counts)
    return dataclasses.replace(b, lora_ranks=[0] * len(b.lora_ranks)) if padded else b


def arm_fns(lab, arms: dict, counts: list[int], mode: str, seed: int) -> tuple[dict, list]:
    """{arm: fn} timing one forward each; `keep` holds what the graphs read (it must outlive them). An arm named
    `<setting>_padded` runs its setting's batch with the rows' ranks unset (`batch_of`)."""
    from lora_moe_lab.model.lora import LoRABatchTensors

    x = lab.random_input(sum(counts), seed=seed)
    fns, keep = {}, [x]
    if mode == "eager":
        for name, adapters in arms.items():
            def f(adapters=adapters, padded=name.endswith(PADDED)):
                batch = batch_of(lab, adapters, counts, padded)
                return lab.model(x, batch, LoRABatchTensors.from_batch(batch, lab.device), guard=GUARD)
            fns[name] = f
        return fns, keep
    import torch

    from lora_moe_lab.model import graphs

    mempool = torch.cuda.graph_pool_handle()  # the arms' graphs replay one at a time: one pool for all
    for name, adapters in arms.items():
        batch = batch_of(lab, adapters, counts, name.endswith(PADDED))
        tensors = LoRABatchTensors.from_batch(batch, lab.device)
        g, out = graphs.capture(lambda b=batch, t=tensors: lab.model(x, b, t, guard=GUARD), warmup=1, pool=mempool,
                                launch_all=False)  # the host decides: the off arm's graph holds no LoRA kernel
        keep += [batch, tensors, g, out]

        def f(g=g, batch=batch, tensors=tensors):
            LoRABatchTensors.from_batch(batch, lab.device, out=tensors)  # the step's metadata, in place
            g.replay()
        fns[name] = f
    torch.cuda.synchronize()
    return fns, keep


def measure(fns: dict, warmup: int, reps: int) -> dict:
    """Samples (ms, repetition order) per arm, interleaved, after `warmup` untimed calls per arm."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    runtime.synchronize()
    t = time_interleaved(fns, reps)
    return {n: [s / 1e3 for s in t[n].samples_us] for n in fns}


def cell_row(cell: Cell, counts, samples: dict, chk, c: dict, layers: int, base: dict) -> dict:
    s = cell.setting
    per_req = assign(len(counts), s)
    tok = [0] * len(s.ranks)
    for i, n in zip(per_req, counts):
        tok[i] += n
    M = sum(counts)
    r64 = sum(t for r, t in zip(s.ranks, tok) if r == 64) / M
    t_floor_us = floors.forward_floor_us(cell.shape, list(zip(s.ranks, tok)), c, layers)
    row = dict(base, regime=cell.regime, shape=cell.shape, tokens=M, ranks=s.ranks_str, mix=s.mix, mode=cell.mode,
               setting=s.label, requests=len(counts), tokens_per_request=counts[0], layers=layers,
               pool_max_rank=s.pool_rank, r64_share=r64, guard=GUARD, reps=len(samples["off"]) if samples else 0,
               t_lora_floor_ms=t_floor_us / 1e3, copy_gbps=c["copy_gbps"], matmul_tflops=c["matmul_tflops"],
               interval=INTERVAL)
    if chk is None:
        return row
    kept = slice(chk.dropped, None)
    off, on = np.asarray(samples["off"][kept]), np.asarray(samples[s.label][kept])
    row.update(n=len(off), warmup_dropped=chk.dropped, warmup_note=chk.note, status=chk.status,
               off_ms=float(np.median(off)), on_ms=float(np.median(on)))
    row.update(off_tok_per_s=M / (row["off_ms"] * 1e-3), on_tok_per_s=M / (row["on_ms"] * 1e-3),
               floor_ratio=floors.floor_ratio(row["off_ms"] * 1e3, t_floor_us))
    if chk.stable:
        row["ratio"], row["lo"], row["hi"] = stats.bootstrap_paired(off, on, "ratio_of_medians")
    return row


# --- the run ---------------------------------------------------------------------------------------------------------
def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session", default="s1", help="this device session's label: s1, s2, ... (default s1)")
    ap.add_argument("--out", default=None, help="output folder (default $OUT/lora_tax, else data/lora_tax; smoke: "
                                                "build/lora_tax_smoke)")
    ap.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    ap.add_argument("--shapes", nargs="+", default=["qwen3", "tp4"], help="qwen3, tp4 (or the preset names)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--cells", nargs="+", default=None, metavar="GLOB",
                    help="only the cells whose id regime/shape/tokens/setting/mode matches a glob, e.g. "
                         "'prefill/*/*/r16/*' or '*/qwen3-30b-a3b-tp4/*'; settings r16, mixed_even, mixed_r64_70pct")
    ap.add_argument("--reps", type=int, default=None, help="paired repetitions of prefill (default 14; smoke 10)")
    ap.add_argument("--decode-reps", type=int, default=None, help="paired repetitions of decode (default 30; smoke 10)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls per arm before timing (default 3; smoke 1)")
    ap.add_argument("--layers", type=int, default=None, help="layers (default 48; smoke 2)")
    ap.add_argument("--chunk", type=int, default=None, help="prefill tokens per forward C (default 16384; smoke 32)")
    ap.add_argument("--requests", type=int, default=16, help="prefill requests in the chunk (default 16: 1024 tokens "
                                                             "each)")
    ap.add_argument("--decode-tokens", type=int, nargs="+", default=None, help="decode M (default 64 128; smoke 8 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-padded-arms", dest="padded_arms", action="store_false",
                    help="leave out the decode cells' `<setting>_padded` arms (the mixed ranks read at the pool's "
                         "padded rank, timed beside the default that reads each adapter's own: own_rank.py)")
    ap.add_argument("--overwrite", action="store_true", help="drop this session's rows first and record it again")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny preset, 2 layers, eager only: the tests' path")
    a = ap.parse_args(argv)
    if not re.fullmatch(r"s\d+", a.session):
        ap.error(f"--session must look like s1, s2, ... (got {a.session!r})")
    try:
        a.shapes = [SHAPE_ALIASES[s] for s in a.shapes]
    except KeyError as e:
        ap.error(f"unknown shape {e.args[0]!r}; choose from qwen3, tp4")
    if a.smoke:
        a.shapes, a.device, a.dtype, a.backend = ["tiny"], "cpu", "float32", "torch"
        a.modes = [m for m in a.modes if m == "eager"]  # CUDA graphs need a GPU
        dflt = dict(reps=10, decode_reps=10, warmup=1, layers=2, chunk=32, decode_tokens=[8, 16])
    else:
        if not runtime.has_cuda():
            raise NeedsCuda("studies/lora_tax/record.py: no CUDA GPU on this machine; this recording needs an H200 "
                            "(48-layer models). Run it on the device machine, or pass --smoke for the CPU check. "
                            "Nothing was built or written.")
        a.device, a.dtype, a.backend = "cuda", "bfloat16", "triton"
        dflt = dict(reps=14, decode_reps=30, warmup=3, layers=48, chunk=16384, decode_tokens=[64, 128])
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    for k in ("reps", "decode_reps"):
        if getattr(a, k) < stats.MIN_PAIRED_REPS:
            ap.error(f"--{k.replace('_', '-')} must be >= {stats.MIN_PAIRED_REPS} (the rule for a paired interval)")
    if a.warmup < 0 or a.layers < 1 or a.requests < 1 or a.chunk < 1 or min(a.decode_tokens) < 1:
        ap.error("--warmup must be >= 0; --layers, --requests, --chunk and --decode-tokens >= 1")
    try:
        geometry("prefill", a.chunk, a.requests)
    except ValueError as e:
        ap.error(str(e))
    if a.out is None:
        a.out = str(ROOT / "build" / "lora_tax_smoke") if a.smoke else (
            os.path.join(os.environ["OUT"], "lora_tax") if os.environ.get("OUT") else str(ROOT / "data" / "lora_tax"))
    return a, ap


def claim(out: Path, session: str, overwrite: bool) -> None:
    """Before any work: both tables are of this kind, whole (a cut last row is dropped: that block is measured
    again), and hold no row of this session (or, with --overwrite, its rows are dropped)."""
    for name, cols in ((CSV, COLUMNS), (REPS_CSV, REPS_COLUMNS)):
        f = out / name
        if not f.exists() or f.stat().st_size == 0:
            continue
        tables.check_header(f, cols)
        s = tables.drop_cut_row(f)
        j = s.header.index("session")
        mine = [r[j] == session for r in s.rows]
        if any(mine) and not overwrite:
            raise tables.TableError(f, f"session {session} is already recorded here ({sum(mine)} rows): a session is "
                                       "recorded once; pass --overwrite to record it again, or another --session")
        if any(mine):
            tables.keep_rows(f, cols, [not m for m in mine], why=f"--overwrite of session {session}")
            tables.seal(f, out / name.replace(".csv", ".meta.json"))


def main(argv=None) -> int:
    a, ap = parse(argv)
    import torch

    threads = torch.get_num_threads()
    if a.smoke:
        torch.set_num_threads(1)  # tiny matrices: threads only contend (on a busy CI machine, badly)
    try:
        return _run(a, ap)
    finally:
        torch.set_num_threads(threads)


def _run(a, ap) -> int:
    out = Path(a.out)
    try:
        claim(out, a.session, a.overwrite)
    except ValueError as e:
        ap.error(str(e))
    todo = cells(a.regimes, a.shapes, a.modes, a.chunk, a.decode_tokens, a.cells)
    if not todo:
        ap.error("no cell matches --regimes/--shapes/--modes/--cells")
    from studies.kernels.read_floors import ceilings

    c = ceilings()
    t0 = time.monotonic()
    params = {k: v for k, v in vars(a).items()}
    meta = metadata(params=dict(params, cells=[x.id for x in todo], interval=INTERVAL, guard=GUARD))
    session_ceilings = {}
    if a.device == "cuda":  # this card's own, for the metadata (the floor uses the recorded ceilings)
        from lora_moe_lab.instruments.recorders.harness import copy_bandwidth, matmul_rate

        import torch

        session_ceilings = dict(copy_gbps=copy_bandwidth(torch.device("cuda"))[0],
                                matmul_tflops=matmul_rate(torch.device("cuda"))[0])
        _free()
    base = dict(session=a.session, commit=meta.get("commit"), dirty=meta.get("dirty"), gpu=meta.get("gpu"),
                date=meta.get("date"), torch=meta.get("torch"), triton=meta.get("triton"), dtype=a.dtype,
                backend=a.backend, device=a.device, seed=a.seed, warmup=a.warmup)
    out.mkdir(parents=True, exist_ok=True)
    meta_path, reps_meta = out / "lora_tax.meta.json", out / "lora_tax_reps.meta.json"

    def write_meta(done: int):
        old = tables.read_meta(meta_path)
        sessions = old.get("sessions", {}) if isinstance(old.get("sessions"), dict) else {}
        sessions[a.session] = dict(meta, ceilings=dict(c, used="read_floors.ceilings: the highest recorded"),
                                   session_ceilings=session_ceilings, wall_s=round(time.monotonic() - t0, 1),
                                   cells_written=done)
        m = dict(about="studies/lora_tax/record.py: LoRA-on / LoRA-off throughput per cell, a row per cell and "
                       "session; read by studies/lora_tax/read.py", columns=COLUMNS, sessions=sessions)
        if "files" in old:
            m["files"] = old["files"]
        tables.write_json_atomic(meta_path, m)
        r = tables.read_meta(reps_meta)
        r.update(about="every timed call of lora_tax.csv's cells (ms), `kept` after the warm-up check; provenance "
                       "in lora_tax.meta.json", columns=REPS_COLUMNS)
        tables.write_json_atomic(reps_meta, r)

    write_meta(0)
    written = 0
    print(f"{len(todo)} cells; ceilings {c['copy_gbps']:.0f} GB/s, {c['matmul_tflops']:.0f} TFLOP/s"
          + (f"; this card: {session_ceilings['copy_gbps']:.0f} GB/s, {session_ceilings['matmul_tflops']:.0f} "
             "TFLOP/s" if session_ceilings else ""), flush=True)
    groups = {}
    for x in todo:
        groups.setdefault((x.regime, x.shape), []).append(x)
    for (regime, shape), group in groups.items():
        t1 = time.monotonic()
        lab, err = None, None
        try:
            lab = build(regime, shape, a)
        except Exception as e:  # noqa: BLE001 - written as the cells' status, then the next model
            if a.smoke:
                raise
            err = _why(e)  # the exception (and its frames, holding tensors) is dropped as the clause ends
        if err is not None:
            lab = None
            _free()
            written += _fail(group, err, a, c, base, out, meta_path)
            continue
        print(f"{regime} {shape}: {a.layers} layers built in {time.monotonic() - t1:.0f} s{_mem()}", flush=True)
        for pool_rank in sorted({x.setting.pool_rank for x in group}):
            in_pool = [x for x in group if x.setting.pool_rank == pool_rank]
            err = None
            try:
                lab = with_pool(lab, pool_rank)
                settings = sorted({x.setting for x in in_pool}, key=SETTINGS.index)
                for s in settings:  # the settings of one pool share its 4 adapters
                    for nm, r in zip(adapter_names(s), s.ranks):
                        if nm not in lab.pool.loaded():
                            lab.pool.load(nm, rank=r)
            except Exception as e:  # noqa: BLE001
                if a.smoke:
                    raise
                err = _why(e)
            if err is not None:
                _free()
                written += _fail(in_pool, err, a, c, base, out, meta_path, lab.shape.num_layers)
                continue
            for tokens in sorted({x.tokens for x in in_pool}):
                for mode in [m for m in MODES if any(x.tokens == tokens and x.mode == m for x in in_pool)]:
                    block = [x for x in in_pool if x.tokens == tokens and x.mode == mode]
                    written += _block(lab, block, a, c, base, out, meta_path)
                    write_meta(written)
        del lab
        _free()
    write_meta(written)
    print(f"wrote {written} cells to {out / CSV} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


def _block(lab, block: list[Cell], a, c: dict, base: dict, out: Path, meta_path: Path) -> int:
    """One (regime, shape, tokens, pool, mode): the LoRA-off arm and each setting's arm, timed interleaved; a row per
    cell and per timed call appended (whole rows, fsynced, sealed)."""
    t1 = time.monotonic()
    x0 = block[0]
    counts = geometry(x0.regime, x0.tokens, a.requests)
    reps = a.reps if x0.regime == "prefill" else a.decode_reps
    arms = {"off": [None] * len(counts)}
    for cell in block:
        names = adapter_names(cell.setting)  # loaded by main (a KeyError names one that is not)
        arms[cell.setting.label] = [names[i] for i in assign(len(counts), cell.setting)]
        if a.padded_arms and x0.regime == "decode" and set(cell.setting.ranks) != {cell.setting.pool_rank}:
            arms[cell.setting.label + PADDED] = arms[cell.setting.label]  # own ranks against padded: own_rank.py
    fns = keep = err = None
    try:
        fns, keep = arm_fns(lab, arms, counts, x0.mode, a.seed)
        samples = measure(fns, a.warmup, reps)
    except Exception as e:  # noqa: BLE001 - an OOM (or a failed capture) is this block's status, not the run's end
        if a.smoke:
            raise
        err = _why(e)  # leaving the clause drops the exception's frames and the tensors they hold
    del fns, keep
    _free()
    if err is not None:
        return _fail(block, err, a, c, base, out, meta_path, lab.shape.num_layers)
    chk = stats.warmup_check(samples)
    rows = [cell_row(cell, counts, samples, chk, c, lab.shape.num_layers, base) for cell in block]
    order = {n: [rotated(list(samples), r).index(n) for r in range(reps)] for n in samples}
    rep_rows = []
    for n, xs in samples.items():
        s = next((cell.setting for cell in block if cell.setting.label == n.removesuffix(PADDED)), None)
        for r, ms in enumerate(xs):
            rep_rows.append(dict(session=a.session, regime=x0.regime, shape=x0.shape, tokens=x0.tokens,
                                 pool_max_rank=block[0].setting.pool_rank, mode=x0.mode, arm=n,
                                 ranks=s.ranks_str if s else "", mix=s.mix if s else "none", rep=r,
                                 order=order[n][r], ms=ms, kept=chk.stable and r >= chk.dropped))
    tables.append_rows(out / CSV, rows, COLUMNS, meta_path=meta_path)
    tables.append_rows(out / REPS_CSV, rep_rows, REPS_COLUMNS, meta_path=out / "lora_tax_reps.meta.json")
    for r in rows:
        rr = (f"ratio {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]" if chk.stable else "UNSTABLE")
        print(f"  {x0.regime}/{x0.shape}/{x0.tokens}/{r['setting']}/{x0.mode}: {rr}, floor {r['floor_ratio']:.3f} "
              f"(off {r['off_ms']:.3f} ms, on {r['on_ms']:.3f} ms, n {r['n']}; {chk.note})", flush=True)
    print(f"  ({time.monotonic() - t1:.1f} s{_mem()})", flush=True)
    return len(rows)


def _why(e: BaseException) -> tuple[bool, str]:
    """(out of GPU memory?, the error's first line): what a failed block's rows keep. Anything but an OOM is printed
    with its traceback (a bug to fix, not a figure)."""
    import torch

    oom = isinstance(e, torch.cuda.OutOfMemoryError)
    if not oom:
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    return oom, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _fail(group: list[Cell], why: tuple[bool, str], a, c, base, out: Path, meta_path: Path,
          layers: int | None = None) -> int:
    """Rows of status `oom` (out of GPU memory) or `error` for the cells a failure left unmeasured."""
    oom, msg = why
    rows = []
    for cell in group:
        counts = geometry(cell.regime, cell.tokens, a.requests)
        r = cell_row(cell, counts, {}, None, c, layers or a.layers, base)
        r.update(status="oom" if oom else "error", error=msg + _mem(), n=0)
        rows.append(r)
        print(f"  {cell.id}: {'OUT OF GPU MEMORY' if oom else 'FAILED'}: {msg}{_mem()}", flush=True)
    tables.append_rows(out / CSV, rows, COLUMNS, meta_path=meta_path)
    return len(rows)


if __name__ == "__main__":
    raise SystemExit(main())
