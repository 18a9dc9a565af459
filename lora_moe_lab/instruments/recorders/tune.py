"""The tuner: on the GPU it runs on, the base GEMM's tile table, the LoRA delta's tiles and the LoRA plan for one layer
shape, written as kernels/tile_tables/ holds them (kernels/tune_tables.py: the candidates, the formats, the state).

    python -m lora_moe_lab.instruments.recorders.tune --preset qwen3-30b-a3b [--resume] [--budget-s 540]
    scripts/gpu_tune.sh                     # both presets, in device calls of 10 minutes
    make tune TUNE_ARGS="--preset qwen3-30b-a3b-tp4 --resume --budget-s 540"

Cells, M outermost: per token bucket M, each base GEMM candidate of gate_up and of down (BLOCK_M, BLOCK_N,
BLOCK_K, GROUP_M, warps, stages, TMA weight loads; and the tiles the code takes today, persistent builds and all),
then each LoRA delta tile of each op (the separate path's kernel alone: rules.json's tiles and a small grid), then
each LoRA plan candidate of each op (the whole layer with rank-16 adapters on every token, the op's entry
swapped into the default plan: each path plain and every entry that plan holds; the base GEMMs on the tiles this
GPU read when the process started, so a plan tuned after the tile table is in place is tuned against it). Each
candidate runs once and is held against float64 (ops/reference.py's grouped references, ops.reference.tolerance)
before it is timed; one that raises or misses is recorded as failed with its error and never chosen. Timing:
CUDA-graph replays between CUDA events (warm-up, then --reps >= 10 repetitions; short kernels 8 to a replay), the
median. Without a GPU the tuner refuses unless --allow-cpu (the Triton interpreter, wall-clock times: tests and dry
runs only).

Every finished cell goes to the state file under --out at once; --resume goes on from it, --budget-s stops before
a cell that the longest cell so far says would pass the budget (exit 3, the state saved). When every cell is done
the tables are written to --tables (the package's tile_tables by default): `<GPU>_E.._H.._I...json` with per bucket
and op the tile, its time and `why` (median, repetitions, the runner-up and its time, the commit);
`rules_<GPU>.json` with a delta tile rule per op and bucket that tests this shape's N and K (kernels/configs.py tries
them before rules.json's); `lora_plan_<GPU>.json` with this shape's entries under `shapes`. A table git tracks, or one
the tuner did not write, is replaced only with --overwrite (refused before any device work).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from ... import runtime
from ...config import LoRAConfig, MoEShape, get_shape, parse_dtype
from ...kernels import configs, plan_table, tiles
from ...kernels import tune_tables as tt
from ...kernels.align import moe_align
from ...kernels.configs import GemmConfig
from ...kernels.fused_moe import moe_gemm
from ...kernels.fused_moe_lora import lora_delta
from ...model import sizing
from ...model.lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo
from ...model.moe import LoRAHook, MoELayer, hold_weights
from ...ops import get_backend
from ...ops.reference import ref_lora_delta_grouped, ref_moe_gemm_grouped, rel, tolerance
from ...provenance import git_commit
from .harness import route
from .timing import time_device, time_graph

CPU_NAME = "cpu-interpreter"  # the tables' GPU name for a dry run without a GPU
MIN_GPU_REPS = 10
SLOTS, RANK = 4, 16  # the LoRA plan's recordings: 4 adapters of rank 16, every token on one
BUDGET_EXIT = 3


def default_timer(dev: torch.device, reps: int):
    """(fn, cell) -> {median_us, reps, timer}: CUDA-graph replays between CUDA events on a GPU (8 calls to a
    replay up to M = 256), the wall clock on the CPU."""
    def timer(fn, cell):
        if dev.type == "cuda":
            t = time_graph(fn, warmup=3, reps=reps, repeat=8 if cell["M"] <= 256 else 1)
        else:
            t = time_device(fn, warmup=0, reps=reps, cuda=False)
        return {"median_us": t.median_us, "reps": t.reps, "timer": t.timer}
    return timer


def needed_bytes(shape: MoEShape, dtype, max_m: int) -> int:
    """What the tuner holds at once: the layer with its adapter pool and wide weights (model/sizing.py), the
    largest bucket's work space, its float64 reference (per pair: gate_up's 2I and its delta's 2I, the activation's
    I, down's K and its delta's K; the layer's output per token) and the context's reserve."""
    lora = LoRAConfig(max_loras=SLOTS, max_rank=RANK)
    ref = (max_m * shape.top_k * (5 * shape.intermediate + 2 * shape.hidden) + max_m * shape.hidden) * 8
    return (sizing.layer_bytes(shape, lora, dtype, "triton", decoder=False)
            + sizing.workspace_bytes(shape, max_m, dtype, decoder=False) + ref + sizing.RESERVE_BYTES)


def check_fits(shape: MoEShape, dtype, max_m: int, capacity) -> None:
    usable, total = capacity()
    need = needed_bytes(shape, dtype, max_m)
    if need > usable:
        g = sizing.GIB
        raise tt.CardTooSmallError(f"{shape.name} at M up to {max_m} ({dtype}) needs {need / g:.1f} GiB, the card "
                                   f"has {usable / g:.1f} GiB free of {total / g:.1f}: tune smaller buckets "
                                   f"(--buckets) on this card, or a card with more memory")


def _layer_reference(layer, x, info, backend):
    """The layer's output in float64 on x's device (the grouped references), on the experts the layer's router
    picks (near-ties may pick differently in float64), their weights computed in float64."""
    k, I = layer.top_k, layer.shape.intermediate
    _, ids = layer.route(x, backend)
    logits = x.double() @ layer.router_w.double().T
    if layer.router_bias is not None:
        logits = logits + layer.router_bias.double()
    tw = torch.softmax(logits, -1).gather(1, ids.long())
    tw = tw / tw.sum(-1, keepdim=True)
    w, m, lids, en = info.weights, info.token_lora_mapping, info.lora_ids, info.adapter_enabled
    inter = ref_moe_gemm_grouped(x, layer.w13, ids, k)
    inter += ref_lora_delta_grouped(x, w.gate_up_a, w.gate_up_b, ids, m, lids, en, k)[0]
    g, u = inter[:, :I], inter[:, I:]
    act = g * torch.sigmoid(g) * u
    out = ref_moe_gemm_grouped(act, layer.w2, ids, k, tw, gather=False)
    out += ref_lora_delta_grouped(act, w.down_a[None], w.down_b[None], ids, m, lids, en, k, tw, gather=False)[0]
    return out.view(-1, k, out.shape[-1]).sum(1)


def candidate_table(base: plan_table.PlanTable, op: str, raw: dict, hidden: int, intermediate: int):
    """The plan with `op`'s entry `raw` at every bucket; the other op keeps the base's entries for this shape."""
    fields = {k: v for k, v in raw.items() if k != "path"}
    other = next(o for o in plan_table.OPS if o != op)
    ops = {op: plan_table.entries(raw["path"], **fields),
           other: {b: base.entry(other, b, hidden, intermediate) for b in plan_table.BUCKETS}}
    return base.but(ops=ops, shapes={})


class Tuner:
    """One layer shape on one device: its cells, their state, the picks and the tables."""

    def __init__(self, shape: MoEShape, *, dev, dtype, out: Path, tables: Path, buckets, reps: int, resume: bool,
                 overwrite: bool, what=("gemm", "lora", "plan"), gemm_grid=None, tma=(False, True), plan_cands=None,
                 lora_cands=None, timer=None, gpu=None, commit=None):
        self.shape, self.dev, self.dtype, self.reps, self.what = shape, dev, dtype, reps, tuple(what)
        E, H, I, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
        self.buckets = tuple(sorted(buckets))
        tt.check_shape(E, H, I, k, self.buckets)
        self.gpu = gpu or (torch.cuda.get_device_name(dev) if dev.type == "cuda" else CPU_NAME)
        self.commit = commit or git_commit() or "unknown"
        self.tables, self.overwrite = Path(tables), overwrite
        self.tile_path = self.tables / tiles.file_name(self.gpu, E, H, I)
        self.plan_path = self.tables / plan_table.file_name(self.gpu)
        self.rules_path = self.tables / configs.gpu_rules_file(self.gpu).name
        for p, kind in ((self.tile_path, "gemm"), (self.plan_path, "plan"), (self.rules_path, "lora")):
            if kind in self.what:
                tt.check_writable(p, overwrite)
        self.base = plan_table.load(None)  # the default plan (the candidates' source, the other op's entries)
        self.gemm_c = {M: tt.unique(tt.gemm_candidates(M, k, E, gemm_grid, tma)
                                    + ([] if gemm_grid else tt.known_tiles(M, E, H, I, k)))
                       for M in self.buckets}
        self.plan_c = {op: (plan_cands or {}).get(op) or tt.plan_candidates(op, self.base) for op in plan_table.OPS}
        self.lora_c = {op: (lora_cands or {}).get(op) or tt.lora_candidates(op) for op in plan_table.OPS}
        settings = {"gpu": self.gpu, "preset": shape.name, "shape": [E, H, I, k], "dtype": str(dtype),
                    "commit": self.commit, "buckets": list(self.buckets), "reps": reps, "what": list(self.what),
                    "lora": [SLOTS, RANK],
                    "candidates": tt.fingerprint([[tt.gemm_key(c) for M in self.buckets for c in self.gemm_c[M]],
                                                  {op: [tt.plan_key(r) for r in c] for op, c in self.plan_c.items()}]
                                                 + ([{op: [tt.lora_key(t) for t in c] for op, c in self.lora_c.items()}]
                                                    if "lora" in self.what else []))}
        stem = self.tile_path.stem
        state = Path(out) / f"tune_state_{stem}.json"
        self.state = tt.State(state, settings, state.exists() if resume == "auto" else resume)
        self.timer = timer or default_timer(dev, reps)
        self.tol = tolerance(dtype, dev)
        self._layer = None

    # ---------------------------------------------------------------------------------- the cells
    def cells(self):
        for M in self.buckets:
            if "gemm" in self.what:
                for op in plan_table.OPS:
                    for c in self.gemm_c[M]:
                        yield "gemm", op, M, tt.gemm_key(c), c
            if "lora" in self.what:
                for op in plan_table.OPS:
                    for t in self.lora_c[op]:
                        yield "lora", op, M, tt.lora_key(t), t
            if "plan" in self.what:
                for op in plan_table.OPS:
                    for r in self.plan_c[op]:
                        yield "plan", op, M, tt.plan_key(r), r

    def run(self, budget_s: float | None = None, clock=time.monotonic) -> bool:
        """Every cell not yet in the state; False where the budget stopped it (the state saved), True when done
        and the tables are written."""
        start, longest = clock(), 0.0
        todo = [c for c in self.cells() if not self.state.done(tt.State.key(*c[:4]))]
        for i, (kind, op, M, key, cand) in enumerate(todo):
            if budget_s is not None and clock() - start + longest > budget_s:
                print(f"tune: budget {budget_s:g} s: stopped before {kind} {op} M={M} ({len(todo) - i} of "
                      f"{len(todo)} cells left); the state is in {self.state.path}: go on with --resume", flush=True)
                return False
            t0 = clock()
            res = self._cell(kind, op, M, key, cand)
            self.state.put(tt.State.key(kind, op, M, key), res)
            longest = max(longest, clock() - t0)
        self.write()
        return True

    def _cell(self, kind, op, M, key, cand) -> dict:
        cell = {"kind": kind, "op": op, "M": M, "cand": key}
        step = "run"
        try:
            fn, check = {"gemm": self._gemm, "lora": self._lora, "plan": self._plan}[kind](op, M, cand)
            err = check(fn())
            if not err <= self.tol:  # NaN too
                return {"ok": False, "error": f"relative error {err:.3g} against float64 above {self.tol:g}"}
            step = "timing"
            return {"ok": True, "rel_err": err, **self.timer(fn, cell)}
        except Exception as e:  # a candidate that does not build, run or capture: recorded, never chosen
            return {"ok": False, "error": f"{step}: {type(e).__name__}: {e}"[:400]}

    def _inputs(self, M):
        """This M's inputs, drawn once (seeded by M): the layer, x, the down GEMM's input, routing, references."""
        if self._layer is None:  # the layer as the lab holds it: w13 and w2 inside the pool's wide builds
            self._layer = MoELayer(self.shape, self.dtype, self.dev, torch.Generator(device=self.dev).manual_seed(1))
            self._pool = AdapterPool(self.shape, LoRAConfig(max_loras=SLOTS, max_rank=RANK), num_layers=1,
                                     dtype=self.dtype, device=self.dev)
            for s in range(SLOTS):
                self._pool.load(f"a{s}", rank=RANK, seed=s)
            self._backend = get_backend("triton", self.dev)
            hold_weights([self._layer], self._pool, self._backend)
        if getattr(self, "_m", None) != M:
            sh, g = self.shape, torch.Generator(device=self.dev).manual_seed(M)
            x = torch.randn(M, sh.hidden, generator=g, device=self.dev).to(self.dtype)
            h = torch.randn(M * sh.top_k, sh.intermediate, generator=g, device=self.dev).to(self.dtype)
            rw, ids = route(M, sh.num_experts, sh.top_k, g, self.dev)
            self._m, self._in, self._al, self._ref = M, dict(x=x, h=h, rw=rw, ids=ids), {}, {}
        return self._in

    def _gemm(self, op, M, cand):
        d, L, k = self._inputs(M), self._layer, self.shape.top_k
        bm = cand["block_m"]
        if bm not in self._al:
            self._al[bm] = moe_align(d["ids"], self.shape.num_experts, bm)
        al, cfg = self._al[bm], GemmConfig(**cand["tile"])
        gate_up = op == "gate_up"
        x, w, rw = (d["x"], L.w13, None) if gate_up else (d["h"], L.w2, d["rw"])
        out = torch.full((M * k, w.shape[1]), float("nan"), dtype=self.dtype, device=self.dev)
        if op not in self._ref:
            self._ref[op] = ref_moe_gemm_grouped(x, w, d["ids"], k, rw, gather=gate_up)
        ref = self._ref[op]
        return (lambda: moe_gemm(x, w, al, k, out, routed_weights=rw, gather=gate_up, config=cfg),
                lambda y: rel(y, ref))

    def _lora(self, op, M, tile):
        """The op's LoRA delta alone, as the separate path launches it (kernels/paths/separate.py): rank-16 adapters
        on every token, taking turns, over the alignment per adapter at the rules' BLOCK_M; the candidate's tile, the
        launcher's split. It adds into a buffer of zeros: the first call's output is the delta."""
        d, w, sh = self._inputs(M), self._pool.layers[0], self.shape
        E, k, S = sh.num_experts, sh.top_k, SLOTS
        key = ("lora", op)
        if key not in self._ref:
            slot = (torch.arange(M, device=self.dev) % S).to(torch.int32)
            rows = torch.arange(S, dtype=torch.int32, device=self.dev)
            bm = configs.lora_block_m(M, k, E, S)
            al = moe_align(d["ids"], E, bm, slot, S)
            gate_up = op == "gate_up"
            x, a, b = (d["x"], w.gate_up_a, w.gate_up_b) if gate_up else (d["h"], w.down_a[None], w.down_b[None])
            rw = None if gate_up else d["rw"]
            ref = ref_lora_delta_grouped(x, a, b, d["ids"], slot, rows, torch.ones_like(rows), k, rw,
                                         gather=gate_up)[0]
            N, K = b.shape[3], a.shape[4]
            base = (configs.lora_config if gate_up else configs.lora_down_config)(M, k, E, S, bm, N, K)
            self._ref[key] = (x, a, b, al, rows, torch.ones_like(rows), rw, gate_up, ref, base)
        x, a, b, al, rows, on, rw, gate_up, ref, base = self._ref[key]
        cfg = dataclasses.replace(base, **tile)
        out = torch.zeros(ref.shape, dtype=self.dtype, device=self.dev)
        return (lambda: lora_delta(x, a, b, al, rows, on, k, out, routed_weights=rw, gather=gate_up, config=cfg),
                lambda y: rel(y, ref))

    def _plan(self, op, M, raw):
        d, pool, backend = self._inputs(M), self._pool, self._backend
        if "layer" not in self._ref:  # every token on an adapter, the adapters taking turns
            batch = LoRABatchInfo.build(pool, [f"a{i % SLOTS}" for i in range(M)], [1] * M)
            info = LoRAInfo(pool.layers[0], LoRABatchTensors.from_batch(batch, self.dev), RANK)
            self._ref["info"], self._ref["layer"] = info, _layer_reference(self._layer, d["x"], info, backend)
        info, ref = self._ref["info"], self._ref["layer"]
        table = candidate_table(self.base, op, raw, self.shape.hidden, self.shape.intermediate)
        hook = LoRAHook(info, backend, self.shape.num_experts)
        with plan_table.override(table):  # gate_up's wide build reads x in wider rows, where the lab's norm writes it
            x = self._layer.lead(M, [hook], backend).gate_up_input(d["x"])

        def fn():
            with plan_table.override(table):
                return self._layer(x, [hook], backend)
        return fn, lambda y: rel(y, ref)

    # ---------------------------------------------------------------------------------- the picks
    def _ranked(self, kind, op, M, keys) -> list[tuple[float, str, dict]]:
        got = [(self.state.cells[tt.State.key(kind, op, M, c)], c) for c in keys]
        return sorted((r["median_us"], c, r) for r, c in got if r.get("ok"))

    def _why(self, ranked, n, what) -> str:
        us, key, r = ranked[0]
        run = (f"; runner-up {ranked[1][1]} {ranked[1][0]:.2f} us" if len(ranked) > 1 else "; no runner-up")
        return (f"{what} {key}: median {us:.2f} us over {r['reps']} repetitions ({r['timer']}){run}; "
                f"{n} candidates, {n - len(ranked)} failed the float64 check or did not run; commit {self.commit}")

    def gemm_picks(self) -> dict:
        """Per bucket: the BLOCK_M whose best gate_up + best down is least (the two share one alignment), each
        op's best tile at it."""
        out = {}
        for M in self.buckets:
            by_bm = {}
            for bm in sorted({c["block_m"] for c in self.gemm_c[M]}):
                keys = [tt.gemm_key(c) for c in self.gemm_c[M] if c["block_m"] == bm]
                r = {op: self._ranked("gemm", op, M, keys) for op in plan_table.OPS}
                if all(r.values()):
                    by_bm[bm] = r, len(keys)
            if not by_bm:
                raise tt.TuneError(f"{self.shape.name} M={M}: no BLOCK_M with a gate_up and a down candidate that "
                                   f"matched float64 (the errors: {self.state.path})")
            bm = min(by_bm, key=lambda b: sum(v[0][0] for v in by_bm[b][0].values()))
            cands = {tt.gemm_key(c): c for c in self.gemm_c[M]}
            e = {"block_m": bm, "why": {}}
            ranked_at, n = by_bm[bm]  # the why counts the candidates of the chosen BLOCK_M, as `ranked` does
            for op, ranked in ranked_at.items():
                e[op] = dict(cands[ranked[0][1]]["tile"])
                e[f"{op}_us"] = round(ranked[0][0], 2)
                e["why"][op] = self._why(ranked, n, f"BLOCK_M {bm} (least gate_up + down of {len(by_bm)}),")
            out[M] = e
        return out

    def _best(self, kind: str, op: str, cands: dict, what) -> dict:
        """{M: (candidate, why)}: the op's fastest candidate of `kind` per bucket that matched float64 (what(M) starts
        its why); a bucket where none did is a TuneError naming the state file that holds the errors."""
        out = {}
        for M in self.buckets:
            ranked = self._ranked(kind, op, M, list(cands))
            if not ranked:
                raise tt.TuneError(f"{self.shape.name} {op} M={M}: no {kind} candidate matched float64 (the errors: "
                                   f"{self.state.path})")
            out[M] = (dict(cands[ranked[0][1]]), self._why(ranked, len(cands), what(M)))
        return out

    def lora_picks(self) -> dict:
        """{op: {M: (tile, why)}}: each op's fastest LoRA delta tile per bucket."""
        return {op: self._best("lora", op, {tt.lora_key(t): t for t in self.lora_c[op]},
                               lambda M: f"at {M} tokens, the delta") for op in plan_table.OPS}

    def plan_picks(self) -> dict:
        """{op: {M: raw entry with decided_by and why}}: each op's fastest plan entry per bucket."""
        tag = f"tune_{self.commit[:12]}"
        return {op: {M: {**e, "decided_by": [tag], "why": why} for M, (e, why) in
                     self._best("plan", op, {tt.plan_key(r): r for r in self.plan_c[op]},
                                lambda M: "the layer with").items()}
                for op in plan_table.OPS}

    def write(self) -> list[Path]:
        E, H, I = self.shape.num_experts, self.shape.hidden, self.shape.intermediate
        written = []
        if "gemm" in self.what:
            t = tt.tile_table(self.gpu, self.shape.name, (E, H, I), self.commit, self.gemm_picks())
            tt.check_writable(self.tile_path, self.overwrite)
            tt.write_json(self.tile_path, t)
            tiles.read(self.tile_path)  # the house's loader, file name against content
            written.append(self.tile_path)
        if "lora" in self.what:
            raw = tt.rules_file(self.gpu, (E, H, I), self.lora_picks(), tt.tuner_plan(self.rules_path))
            tt.check_writable(self.rules_path, self.overwrite)
            tt.write_json(self.rules_path, raw)
            written.append(self.rules_path)
        if "plan" in self.what:
            old = tt.tuner_plan(self.plan_path)
            decode = {"max_pairs": self.base.decode_max_pairs, "decided_by": [],
                      "why": f"not tuned: the bound of the plan this GPU read "
                                 f"({(self.base.source or self.base.gpu).replace(f'{plan_table.TABLE_DIR}/', '')})"}
            raw = tt.plan_file(self.gpu, (E, H, I), self.plan_picks(), decode, old)
            tt.check_writable(self.plan_path, self.overwrite)
            tt.write_json(self.plan_path, raw)
            written.append(self.plan_path)
        for p in written:
            print(f"tune: wrote {p}", flush=True)
        return written


def tune(preset, *, device=None, dtype=None, out="build/tune", tables=None, buckets=tt.BUCKETS, reps=MIN_GPU_REPS,
         resume=False, overwrite=False, budget_s=None, allow_cpu=False, what=("gemm", "lora", "plan"), capacity=None,
         clock=time.monotonic, **kw) -> bool:
    """Tune one layer shape (a preset's name or a MoEShape) on this machine's device: True when its tables are
    written, False where the budget stopped it. The refusals are tune_tables' named errors."""
    shape = get_shape(preset)
    dev = runtime.resolve_device(device)
    if dev.type != "cuda" and not allow_cpu:
        raise tt.TuneError("no CUDA device: the tuner times kernels on the GPU it tunes for; --allow-cpu runs it "
                           "under the Triton interpreter with wall-clock times (tests and dry runs only)")
    dtype = parse_dtype(dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    if dev.type == "cuda" and reps < MIN_GPU_REPS:
        raise tt.TuneError(f"--reps {reps}: a GPU's times take at least {MIN_GPU_REPS} repetitions")
    if capacity is not None or dev.type == "cuda":
        check_fits(shape, dtype, max(buckets), capacity or (lambda: runtime.gpu_capacity(dev)))
    t = Tuner(shape, dev=dev, dtype=dtype, out=Path(out), tables=Path(tables or tiles.TABLE_DIR), buckets=buckets,
              reps=reps, resume=resume, overwrite=overwrite, what=what, **kw)
    return t.run(budget_s, clock)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lora_moe_lab.instruments.recorders.tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-30b-a3b", help="the layer shape (config.PRESETS)")
    p.add_argument("--out", default="build/tune", help="the state files' folder")
    p.add_argument("--tables", default=None, help="where the tables go (default: the package's tile_tables)")
    p.add_argument("--buckets", default=",".join(map(str, tt.BUCKETS)), help="token buckets, comma-separated")
    p.add_argument("--only", choices=("gemm", "lora", "plan"), default=None, help="tune one table only")
    p.add_argument("--reps", type=int, default=MIN_GPU_REPS, help=f"timed repetitions (>= {MIN_GPU_REPS} on a GPU)")
    p.add_argument("--dtype", default=None, help="bfloat16 on a GPU (default), float32 under the interpreter")
    p.add_argument("--budget-s", type=float, default=None, help="stop before this many seconds, state saved")
    p.add_argument("--resume", action="store_const", const=True, default=False,
                   help="go on from the state under --out")
    p.add_argument("--auto-resume", dest="resume", action="store_const", const="auto",
                   help="go on from the state where there is one, else start")
    p.add_argument("--overwrite", action="store_true", help="replace a table git tracks or the tuner did not write")
    p.add_argument("--allow-cpu", action="store_true", help="run under the Triton interpreter without a GPU")
    a = p.parse_args(argv)
    try:
        buckets = tuple(int(b) for b in a.buckets.split(","))
    except ValueError:
        p.error(f"--buckets {a.buckets!r}: comma-separated ints")
    try:
        done = tune(a.preset, dtype=a.dtype, out=a.out, tables=a.tables, buckets=buckets, reps=a.reps,
                    resume=a.resume, overwrite=a.overwrite, budget_s=a.budget_s, allow_cpu=a.allow_cpu,
                    what=(a.only,) if a.only else ("gemm", "lora", "plan"))
    except (tt.TuneError, ValueError) as e:
        print(f"tune: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0 if done else BUDGET_EXIT


if __name__ == "__main__":
    sys.exit(main())
