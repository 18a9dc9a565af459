"""The tuner's half that needs no device: what it may try, the tables it writes and the state it resumes from. The
measuring half (CUDA events, the float64 check, the card's memory) is instruments/recorders/tune.py.

    candidates   the base GEMM's tiles per token bucket (BLOCK_M about the rule's, each with the sweep's tiles
                 of that BLOCK_M, with and without TMA weight loads; and the tiles the code takes today: the
                 rule's and the recorded tables'); the LoRA delta's tiles per op (rules.json's and `LORA_TILES`);
                 the LoRA plan's entries per op (every entry the default plan holds, and each path plain)
    tables       the house's formats, checked by the house's loaders before a byte is written: tile tables
                 `<GPU>_E<experts>_H<hidden>_I<intermediate>.json` (kernels/tiles.py), the plan
                 `lora_plan_<GPU>.json` (kernels/plan_table.py), the GPU's LoRA tile rules `rules_<GPU>.json`
                 (kernels/configs.py: gpu_rules), each entry with its `why`
    state        one JSON file per GPU and shape under the output folder: the run's settings and every finished
                 (kind, op, M, candidate) cell, written after each cell, so a run killed or stopped by its
                 budget resumes where it was; resumed with other settings, it names the setting that differs
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from . import plan_table, tiles
from .table_checks import TableError

# the token buckets of the tile tables (studies/kernels/record_base.py's sweep): M rounded up to a power of two
BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BLOCK_MS = (16, 32, 64, 128)
# (BLOCK_N, BLOCK_K, GROUP_M, warps, stages) per BLOCK_M: the base sweep's grid, the rules' tiles among them
TILES = {
    16: [(64, 128, 1, 4, 4), (64, 64, 1, 4, 5), (64, 128, 1, 4, 3), (64, 256, 1, 4, 2), (128, 128, 1, 4, 2),
         (128, 128, 1, 4, 3), (64, 64, 32, 4, 3), (128, 64, 32, 4, 5), (128, 64, 1, 4, 4), (256, 128, 1, 8, 2)],
    32: [(64, 128, 4, 4, 4), (128, 64, 16, 4, 4), (128, 128, 16, 4, 3), (256, 128, 16, 4, 2), (128, 64, 1, 4, 3),
         (64, 64, 4, 4, 5), (256, 64, 8, 8, 3), (128, 128, 4, 4, 2)],
    64: [(128, 64, 8, 4, 4), (128, 64, 1, 4, 3), (128, 64, 16, 4, 3), (128, 128, 8, 4, 3), (256, 64, 8, 8, 3),
         (256, 64, 8, 8, 4), (128, 128, 8, 8, 3), (256, 128, 8, 8, 2)],
    128: [(128, 64, 8, 8, 4), (256, 64, 16, 8, 4), (256, 64, 1, 8, 4), (256, 64, 8, 8, 3), (128, 64, 1, 8, 3),
          (128, 128, 8, 8, 3), (256, 128, 8, 8, 2), (256, 64, 32, 8, 4)],
}
TILE_FIELDS = ("block_n", "block_k", "group_m", "num_warps", "num_stages")
# the LoRA delta kernel's tiles (fused_moe_lora_kernel: BLOCK_N, BLOCK_K, warps, stages and one of: a register cap,
# the hand-pipelined expand (prefetch) or Triton's pipeliner on it (expand_stages)), besides the ones rules.json gives
LORA_TILES = [dict(zip(("block_n", "block_k", "num_warps", "num_stages"), t), **extra)
              for t in ((64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (128, 32, 4, 4), (128, 64, 8, 3),
                        (256, 64, 8, 3))
              for extra in ({}, {"expand_stages": 3}, {"max_regs": 128})]
LORA_RULES = {"gate_up": "lora_tile", "down": "lora_down_tile"}  # each op's rule list (kernels/configs.py)
TUNER = "tuner"  # the `source` of a tile table and the start of a plan's `about` that the tuner wrote
STATE_VERSION = 1


class TuneError(ValueError):
    """The tuner refuses: what it was asked, and why."""


class UnsupportedShapeError(TuneError):
    """A layer shape, dtype or token bucket the kernels (or their tables) do not take."""


class CardTooSmallError(TuneError):
    """The card's free memory cannot hold the shape's weights, adapters and the largest bucket's work space."""


class ResumeMismatchError(TuneError):
    """A state file resumed with other settings than the run that wrote it (shape, dtype, candidates, commit...)."""


class CommittedTableError(TuneError):
    """A table the tuner would write over, which git tracks or the tuner did not write, without --overwrite."""


# --------------------------------------------------------------------------------------------
# What the tuner tries
# --------------------------------------------------------------------------------------------
def check_shape(num_experts: int, hidden: int, intermediate: int, top_k: int, buckets) -> None:
    """The shapes the kernels and their tables take: the tables' bounds (kernels/tiles.py: positive ints below
    2**20), hidden and intermediate multiples of 16 (the smallest tile step, and the 16-byte rows of the TMA and
    wide builds), top_k at most the experts, and token buckets that are powers of two up to 16384."""
    for name, v in (("num_experts", num_experts), ("hidden", hidden), ("intermediate", intermediate)):
        if not 0 < v < 2 ** 20:
            raise UnsupportedShapeError(f"{name}={v}: the tables take 1 to {2 ** 20 - 1}")
    for name, v in (("hidden", hidden), ("intermediate", intermediate)):
        if v % 16:
            raise UnsupportedShapeError(f"{name}={v} is not a multiple of 16: the kernels' tiles step over it in "
                                        f"blocks of 16 or more and the TMA and wide builds need 16-byte rows")
    if not 0 < top_k <= num_experts:
        raise UnsupportedShapeError(f"top_k={top_k} must be from 1 to num_experts={num_experts}")
    bad = [b for b in buckets if b not in plan_table.BUCKETS]
    if bad or not buckets:
        raise UnsupportedShapeError(f"token buckets {bad or '(none)'}: each must be a power of two from 1 to "
                                    f"{plan_table.BUCKETS[-1]} (configs.token_bucket's keys)")


def block_ms(M: int, top_k: int, num_experts: int) -> list[int]:
    """BLOCK_M candidates at M: the rule's (configs.rule_block_m), a step either side, and 128 from M = 1024."""
    from .configs import rule_block_m

    i = BLOCK_MS.index(rule_block_m(M, top_k, num_experts))
    near = {BLOCK_MS[j] for j in (i - 1, i, i + 1) if 0 <= j < len(BLOCK_MS)}
    return sorted(near | ({128} if M >= 1024 else set()))


def gemm_candidates(M: int, top_k: int, num_experts: int, tiles_by_bm: dict | None = None,
                    w_desc=(False, True)) -> list[dict]:
    """The base GEMM's candidates at M: {"block_m", "tile"} with the tile in the tables' fields."""
    grid = TILES if tiles_by_bm is None else tiles_by_bm
    bms = block_ms(M, top_k, num_experts) if tiles_by_bm is None else sorted(grid)
    return [{"block_m": bm, "tile": {**dict(zip(TILE_FIELDS, t)), "w_desc": d}}
            for bm in bms for t in grid[bm] for d in w_desc]


def known_tiles(M: int, num_experts: int, hidden: int, intermediate: int, top_k: int,
                table_dir: Path | None = None) -> list[dict]:
    """The tiles the code takes today at bucket M, as candidates, so the tuner can only match or beat them: the
    rule's (configs.rule_block_m, rule_gemm_config) and each recorded GPU's tile table entry for this shape and
    bucket (both ops' tiles, persistent builds and all)."""
    from .configs import rule_block_m, rule_gemm_config

    bm = rule_block_m(M, top_k, num_experts)
    rule = rule_gemm_config(bm)
    out = [{"block_m": bm, "tile": {f: getattr(rule, f) for f in TILE_FIELDS}}]
    for f in tiles.table_files(table_dir):
        t = tiles.read(f)
        e = t["buckets"].get(str(M))
        if e and (t["num_experts"], t["hidden"], t["intermediate"]) == (num_experts, hidden, intermediate):
            out += [{"block_m": e["block_m"], "tile": dict(e[op])} for op in plan_table.OPS]
    return out


_FLAGS = (("persistent", "p"), ("flatten", "flat"), ("max_regs", "r"), ("early_loads", "early"), ("sub_m", "sub"))


def gemm_key(c: dict) -> str:
    """A base GEMM candidate as one token: bm64/bn128/bk64/g8/w4/s3[/tma][/p2][/flat][/r128][/early][/sub64]."""
    t = c["tile"]
    flags = "".join(f"/{a}" + ("" if v is True else str(v)) for k, a in _FLAGS if (v := t.get(k)))
    return (f"bm{c['block_m']}/bn{t['block_n']}/bk{t['block_k']}/g{t['group_m']}/w{t['num_warps']}"
            f"/s{t['num_stages']}" + ("/tma" if t.get("w_desc") else "") + flags)


def unique(cands: list[dict]) -> list[dict]:
    """The candidates without repeats (by key), in their first order."""
    seen = {}
    for c in cands:
        seen.setdefault(gemm_key(c), c)
    return list(seen.values())


_LORA_FLAGS = (("programs_per_sm", "pps"), ("prefetch", "pf"), ("expand_stages", "es"), ("max_regs", "r"))


def lora_key(tile: dict) -> str:
    """A LoRA delta tile as one token: bn64/bk128/w4/s3[/pps2][/pf1][/es3][/r128]."""
    return (f"bn{tile['block_n']}/bk{tile['block_k']}/w{tile.get('num_warps', 4)}/s{tile.get('num_stages', 3)}"
            + "".join(f"/{a}{tile[k]}" for k, a in _LORA_FLAGS if tile.get(k)))


def lora_candidates(op: str) -> list[dict]:
    """The op's LoRA delta tiles: every tile of its rule list in rules.json (so a tuned rule can only match or beat
    what the code takes today), then `LORA_TILES`, each once."""
    from .configs import RULES_FILE

    raw = json.loads(RULES_FILE.read_text())[LORA_RULES[op]]["rules"]
    seen = {}
    for t in [r["tile"] for r in raw] + LORA_TILES:
        seen.setdefault(lora_key(t), dict(t))
    return list(seen.values())


def rules_file(gpu: str, shape: tuple, picks: dict, old: dict | None) -> dict:
    """The GPU's own LoRA tile rules (kernels/configs.py: gpu_rules) with this layer shape's tuned tiles: picks
    {op: {M: (tile, why)}}. Per op, a rule per tuned bucket that tests the op's N and K, the largest bucket first
    (min_bucket: a bucket between two tuned ones takes the one below, as a tile table is read; the smallest takes
    the buckets below it too). old: the file the tuner wrote before, its other shapes' rules kept."""
    from .configs import check_gpu_rules, gpu_rules_file

    _, H, I = shape
    keep = old if old and str(old.get("about", "")).startswith(TUNER) else {}
    raw = {"gpu": gpu, "about": f"{TUNER}: this GPU's LoRA delta tiles per layer shape and token bucket, each the "
                                f"fastest candidate that matched float64 (timed as its why says), tried "
                                f"before rules.json's"}
    for op, key in LORA_RULES.items():
        N, K = (I, H) if op == "gate_up" else (H, I)
        mine = {"N": N, "K": K}
        others = [r for r in keep.get(key, {}).get("rules", []) if {k: r["when"].get(k) for k in mine} != mine]
        tuned = sorted(picks.get(op, {}), reverse=True)
        ours = [{"when": ({"min_bucket": M} if i < len(tuned) - 1 else {}) | mine, "tile": picks[op][M][0],
                 "why": picks[op][M][1]} for i, M in enumerate(tuned)]
        if ours or others:
            raw[key] = {"rules": ours + others}
    check_gpu_rules(raw, gpu_rules_file(gpu), gpu)  # the house's checks, before a byte is written
    return raw


def raw_entry(e: plan_table.Entry) -> dict:
    """A plan entry as a file holds it (options inline), without its why."""
    out = {"path": e.path}
    if e.per_slot:
        out["per_slot"] = True
    for k in ("shrink", "wide_shrink", "expand"):
        v = getattr(e, k)
        if v:
            out[k] = v.dict()
    if e.window:
        out["window"] = True
    return out


def plan_key(raw: dict) -> str:
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def plan_candidates(op: str, table: plan_table.PlanTable) -> list[dict]:
    """The op's candidates: each path plain, then every distinct entry the table holds for the op (at every
    bucket, with each of its layer shapes' changes), in a fixed order."""
    seen = {plan_key(r): r for r in ({"path": p} for p in plan_table.table_paths())}
    for shape in [(None, None), *sorted(table.shapes)]:
        for b in plan_table.BUCKETS:
            r = raw_entry(table.entry(op, b, *shape))
            if op != "down":
                r.pop("window", None)
            seen.setdefault(plan_key(r), r)
    return list(seen.values())


def fingerprint(items) -> str:
    """A short hash of the candidate lists: a resumed run must try the same candidates."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------
def tile_table(gpu: str, preset: str, shape: tuple, commit: str, buckets: dict) -> dict:
    """A tile table (kernels/tiles.py's format) from the picks: buckets {M: {"block_m", "gate_up", "down",
    "gate_up_us", "down_us", "why"}}; checked by the house's loader."""
    E, H, I = shape
    t = {"gpu": gpu, "num_experts": E, "hidden": H, "intermediate": I, "preset": preset,
         "source": f"{TUNER} (lora_moe_lab.instruments.recorders.tune) at {commit}",
         "buckets": {str(m): buckets[m] for m in sorted(buckets)}}
    return tiles.check_table(t, tiles.file_name(gpu, E, H, I))


def fill_buckets(picks: dict) -> dict:
    """Every plan bucket from the tuned ones: an untuned bucket takes the tuned bucket below it (the first tuned
    one below the smallest), as kernels/tiles.py reads a tile table, and its why says so."""
    tuned = sorted(picks)
    out = {}
    for b in plan_table.BUCKETS:
        below = [m for m in tuned if m <= b]
        src = below[-1] if below else tuned[0]
        e = dict(picks[src])
        if src != b:
            e["why"] = f"not tuned at {b}: the entry of bucket {src}. {e['why']}"
        out[str(b)] = e
    return out


def plan_file(gpu: str, shape: tuple, picks: dict, decode: dict, old: dict | None) -> dict:
    """The plan file of `gpu` with this layer shape's tuned entries (picks {op: {M: raw entry with decided_by and
    why}}): under `shapes` H<hidden>_I<intermediate>, and as `ops` too where the file has none of the tuner's yet.
    old: the file the tuner wrote before (its other shapes kept), else None."""
    _, H, I = shape
    per_op = {op: fill_buckets(picks[op]) for op in plan_table.OPS}
    keep = old if old and str(old.get("about", "")).startswith(TUNER) else None
    raw = {"gpu": gpu,
           "about": f"{TUNER}: the LoRA path per op and token bucket, each entry the fastest of the candidates "
                    f"that matched float64 (the layer's time, CUDA events); `shapes` per tuned layer shape",
           "decode": decode, "ops": keep["ops"] if keep else per_op,
           "shapes": {**(keep or {}).get("shapes", {}), f"H{H}_I{I}": per_op}}
    plan_table.check_table(raw, plan_table.file_name(gpu))
    return raw


def _tracked(path: Path) -> bool | None:
    """Whether git tracks the file (None: no git checkout here to ask)."""
    try:
        r = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent,
                           capture_output=True, text=True)
    except OSError:
        return None
    if r.returncode and "not a git repository" in r.stderr.lower():
        return None
    return r.returncode == 0


def _tuner_file(path: Path) -> dict | None:
    """The file's JSON where the tuner wrote it (a tile table's `source`, a plan's `about`), else None."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ours = isinstance(raw, dict) and any(str(raw.get(k, "")).startswith(TUNER) for k in ("source", "about"))
    return raw if ours else None


def tuner_wrote(path: Path) -> bool:
    return _tuner_file(path) is not None


def tuner_plan(path: Path) -> dict | None:
    """The plan file the tuner wrote here before (its other shapes are kept), else None."""
    return _tuner_file(path)


def check_writable(path: Path, overwrite: bool) -> None:
    """A CommittedTableError where `path` holds a table git tracks, or one the tuner did not write, and
    --overwrite was not given."""
    if overwrite or not path.exists():
        return
    tracked = _tracked(path)
    if tracked or not tuner_wrote(path):
        why = "git tracks it" if tracked else "the tuner did not write it"
        raise CommittedTableError(f"{path}: {why}; pass --overwrite to replace it, or --tables DIR to write "
                                  f"elsewhere")


def write_json(path: Path, data: dict) -> None:
    """Written whole or not at all (a temporary file renamed over the target)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# The state of a run
# --------------------------------------------------------------------------------------------
class State:
    """The settings of a run and its finished cells {key: result}, one JSON file, rewritten after each cell."""

    def __init__(self, path: Path, settings: dict, resume: bool):
        self.path, self.settings, self.cells = Path(path), settings, {}
        if not self.path.exists():
            if resume:
                raise TuneError(f"{self.path}: no state to resume (a fresh run: leave out --resume)")
            return
        if not resume:
            raise TuneError(f"{self.path}: a run's state is here; pass --resume to go on with it, or remove the file "
                            f"to start again")
        try:
            raw = json.loads(self.path.read_text())
            old, cells = raw["settings"], raw["cells"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TableError(self.path, "", f"not a tuner state file ({e})") from None
        differ = [f"{k}: the state has {old.get(k)!r}, this run {settings.get(k)!r}"
                  for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
        if differ:
            raise ResumeMismatchError(f"{self.path}: resumed with other settings ({'; '.join(differ)}); run with "
                                      f"the state's settings, or remove the file to start again")
        self.cells = cells

    @staticmethod
    def key(kind: str, op: str, M: int, cand: str) -> str:
        return f"{kind}|{op}|{M}|{cand}"

    def done(self, key: str) -> bool:
        return key in self.cells

    def put(self, key: str, result: dict) -> None:
        self.cells[key] = result
        self.save()

    def save(self) -> None:
        write_json(self.path, {"version": STATE_VERSION, "settings": self.settings, "cells": self.cells})
