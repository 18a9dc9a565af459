"""Launch-config tables of the Triton kernels: tile sizes keyed on static shapes only (M rounded
up to a power of two, N, K, experts, slots), so the choice never reads device data and a warm-up
over the powers of two compiles every binary a CUDA-graph capture could need. Which LoRA path the
MoE layer runs, with which options, is the plan's (kernels/plan.py, from kernels/tile_tables/lora_plan_*.json).

Under the interpreter (no GPU) one small config is used everywhere: the interpreter runs each
program sequentially on numpy, so big tiles only cost CPU time.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .. import runtime
from . import tiles
from .common import cdiv
from .table_checks import TILE, TableError, check_fields


@dataclass(frozen=True)
class GemmConfig:
    """Base grouped GEMM tile: BLOCK_M comes from the alignment (see `moe_block_m`)."""

    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    w_desc: bool = False  # weight tiles through a TMA descriptor (kernels/fused_moe.py), where w allows it
    even: bool = True  # predicate-free loads where K, N are tile multiples; False only to measure the masked loads
    max_regs: int = 0  # register cap per thread (maxnreg, common.reg_cap); 0 = the compiler's choice. In a tile
    # table only beside a persistent grid (studies/kernels/record_base.py persist); record_fold.py caps the folded GEMM
    persistent: int = 0  # programs per SM of a persistent grid looping over the tiles; 0 = one program per tile
    flatten: bool = False  # persistent only: Triton pipelines the tile loop and the K loop as one loop
    early_loads: bool = False  # the epilogue's gathers (routed weights, LoRA rows) issued before the K loop
    # plain GEMM only: the rows of the kernel's tile when fewer than the alignment's BLOCK_M (a divisor of it, so the
    # alignment's blocks split into sub-blocks of one expert each: no second alignment); 0 = the alignment's BLOCK_M
    sub_m: int = 0

    def __post_init__(self):
        if self.persistent < 0:
            raise ValueError(f"GemmConfig.persistent is programs per SM (>= 0, 0 = a program per tile), "
                             f"got {self.persistent}")
        if self.flatten and not self.persistent:
            raise ValueError("GemmConfig.flatten flattens the persistent grid's tile loop: set persistent >= 1 too")
        if self.sub_m and (self.sub_m < 16 or self.sub_m & (self.sub_m - 1)):
            raise ValueError(f"GemmConfig.sub_m is the kernel's BLOCK_M, a power of two >= 16 (0 = the alignment's), "
                             f"got {self.sub_m}")


@dataclass(frozen=True)
class LoRAKernelConfig:
    """Fused LoRA tile: BLOCK_M comes from the alignment (see `lora_block_m`); split_n programs share
    the N columns of one block (more work items at small M)."""

    block_n: int
    block_k: int
    split_n: int = 1
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4  # persistent grid: programs = min(work items bound, SMs * this)
    # expand loop pipelined by hand (kernels/fused_moe_lora.py): 1 = tile j+1's loads are issued before
    # tile j's store; 2 = also the first tile's loads before the shrink. 0 = off.
    prefetch: int = 0
    max_regs: int = 0  # register cap per thread passed to ptxas (maxnreg); 0 = the compiler's choice
    # prefetch 0 only: Triton's loop pipeliner on the expand loop with this many stages (the `out` tiles
    # stream into shared memory ahead of their add); 0 = off
    expand_stages: int = 0

    def __post_init__(self):
        if self.expand_stages and self.prefetch:
            raise ValueError(f"LoRAKernelConfig: expand_stages={self.expand_stages} pipelines the expand loop by "
                             f"Triton, prefetch={self.prefetch} by hand; set one of them to 0")


@dataclass(frozen=True)
class DecodeConfig:
    """Decode-path LoRA tile (kernels/lora_decode.py): one program per (pair, slice, N share);
    split_n is a run-time argument of the kernel, so changing it compiles nothing new."""

    block_n: int
    block_k: int
    split_n: int = 1
    num_warps: int = 8
    num_stages: int = 1


_INTERP_GEMM = GemmConfig(block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)
_INTERP_LORA = LoRAKernelConfig(block_n=32, block_k=32, split_n=1, num_warps=4, num_stages=1)
_INTERP_DECODE = DecodeConfig(block_n=16, block_k=32, split_n=2, num_warps=4, num_stages=1)


def token_bucket(num_tokens: int) -> int:
    """Configs are keyed on M rounded up to a power of two (capped at 16384), so that `warmup` over
    the powers of two covers every M."""
    b = 1
    while b < num_tokens and b < 16384:
        b *= 2
    return b


RULES_FILE = tiles.TABLE_DIR / "rules.json"


def _bounded(items: list, key: str, f, entry: str) -> list:
    """The bounds of a rule's steps: numbers > 0 that rise, the last one null (any)."""
    bounds = [s[key] if isinstance(s, dict) else s[0] for s in items]
    inner = bounds[:-1]
    if (not bounds or bounds[-1] is not None or any(not isinstance(b, int) or isinstance(b, bool) or b <= 0
                                                     for b in inner) or inner != sorted(set(inner))):
        raise TableError(f, entry, f"the steps' bounds must be ints > 0 that rise, the last one null (any): got "
                                   f"{bounds}")
    return [float("inf") if b is None else b for b in bounds]


@functools.lru_cache(maxsize=1)
def rules() -> dict:
    """tile_tables/rules.json (this GPU's own LoRA tile rules first, `gpu_rules`), read and checked once per process:
    the BLOCK_M steps ((at most this many pairs per group, BLOCK_M), ...) of the base GEMM's and the per-adapter
    alignments, the base GEMM's rule tiles ((up to this BLOCK_M, GemmConfig), ...) and the LoRA kernels' tile rules."""
    f = RULES_FILE
    _MEMO.clear()  # the tiles worked out from the rules read before
    raw = json.loads(f.read_text())
    if set(raw) != {"about", "moe_block_m", "lora_block_m", "rule_gemm", *_TILE_RULES}:
        raise TableError(f, "", f"holds about, moe_block_m, lora_block_m, rule_gemm and {', '.join(_TILE_RULES)}, "
                                f"got {sorted(raw)}")
    out = {key: _tile_rules(raw[key], f, key) for key in _TILE_RULES}
    gpu = tiles.gpu_name()
    for key, own in (gpu_rules(gpu_rules_file(gpu), gpu) if gpu else {}).items():
        out[key] = own + out[key]  # this GPU's tuned rules first; rules.json's catch what they do not
    for key in ("moe_block_m", "lora_block_m"):
        e = raw[key]
        if not (isinstance(e, dict) and set(e) == {"steps", "why"} and isinstance(e["steps"], list)
                and all(isinstance(s, list) and len(s) == 2 for s in e["steps"])):
            raise TableError(f, key, f"must hold steps [[at most this many pairs, BLOCK_M], ...] and why, got {e!r}")
        bms = [s[1] for s in e["steps"]]
        if any(bm not in (16, 32, 64, 128) for bm in bms):
            raise TableError(f, key, f"BLOCK_M must be 16, 32, 64 or 128, got {bms}")
        out[key] = tuple(zip(_bounded(e["steps"], 0, f, key), bms))
    e = raw["rule_gemm"]
    if not (isinstance(e, dict) and set(e) == {"tiles", "why"} and isinstance(e["tiles"], list)
            and all(isinstance(t, dict) and "max_block_m" in t for t in e["tiles"])):
        raise TableError(f, "rule_gemm", f"must hold tiles [{{max_block_m, tile fields}}, ...] and why, got {e!r}")
    for i, t in enumerate(e["tiles"]):
        check_fields({k: v for k, v in t.items() if k != "max_block_m"}, TILE, f, f"rule_gemm tile {i}", "tile")
    out["rule_gemm"] = tuple(zip(_bounded(e["tiles"], "max_block_m", f, "rule_gemm"),
                                 (GemmConfig(**{k: v for k, v in t.items() if k != "max_block_m"})
                                  for t in e["tiles"])))
    return out


def gpu_rules_file(gpu: str) -> Path:
    """A GPU's own LoRA tile rules (the tuner writes them): tile_tables/rules_<GPU>.json."""
    return tiles.TABLE_DIR / f"rules_{gpu.replace(' ', '_')}.json"


def gpu_rules(f: Path, gpu: str) -> dict:
    """{key: rules} of a GPU's rules file, checked ({} where it has none): any of rules.json's three tile rule lists,
    each tried before rules.json's own, so its last rule may test something (rules.json's then catch the rest). The
    file names its GPU, and that must be the one of its file name."""
    if not f.exists():
        return {}
    try:
        raw = json.loads(f.read_text())
    except ValueError as e:
        raise TableError(f, "", f"not JSON ({e})") from None
    return check_gpu_rules(raw, f, gpu)


def check_gpu_rules(raw, f: Path, gpu: str) -> dict:
    """`gpu_rules` of a file's content (f names it in the errors)."""
    if not isinstance(raw, dict) or not {"gpu", "about"} <= set(raw) or set(raw) - {"gpu", "about", *_TILE_RULES}:
        raise TableError(f, "", f"holds gpu, about and any of {', '.join(_TILE_RULES)}, got "
                                f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    if raw["gpu"] != gpu or gpu_rules_file(gpu).name != f.name:
        raise TableError(f, "gpu", f"the file says {raw['gpu']!r}, its name says {f.name}, this GPU is {gpu!r}")
    return {key: _tile_rules(raw[key], f, key, fallback=False) for key in _TILE_RULES if key in raw}


# the LoRA kernels' tile rules in rules.json: the config each builds, and what its `when` may test
_TILE_RULES = {"lora_tile": (LoRAKernelConfig, ("block_m", "avg", "bucket", "N", "K")),
               "lora_down_tile": (LoRAKernelConfig, ("block_m", "avg", "bucket", "K", "N")),
               "decode_tile": (DecodeConfig, ("units", "K", "block_r"))}
_POW2 = tuple(2 ** i for i in range(4, 11))
_TILE_BOUNDS = {"block_n": _POW2, "block_k": _POW2, "num_warps": (1, 2, 4, 8, 16), "num_stages": range(1, 9),
                "programs_per_sm": range(1, 33), "prefetch": (0, 1, 2), "max_regs": (0, *range(32, 256)),
                "expand_stages": range(0, 9)}


def _said(values) -> str:
    return f"{values.start}..{values.stop - 1}" if isinstance(values, range) else str(values)


_TESTS = {"min_": lambda x, v: x >= v, "max_": lambda x, v: x <= v, "over_": lambda x, v: x > v}


def _test_of(key: str):
    """A `when` key: (variable, test): min_X (at least), max_X (at most), over_X (above), or X itself (equal)."""
    for prefix, fn in _TESTS.items():
        if key.startswith(prefix):
            return key[len(prefix):], fn
    return key, lambda x, v: x == v


def _tile_rules(e, f, key: str, fallback: bool = True) -> tuple:
    """((tests, tile fields), ...) of one tile rule list, checked: the first rule whose tests all hold gives the tile
    (split_n stays the launcher's: it follows the shape); the last one tests nothing where the list is the fallback
    (rules.json's)."""
    cls, variables = _TILE_RULES[key]
    fields = {fl.name for fl in dataclasses.fields(cls)} - {"split_n"}
    rs = e.get("rules") if isinstance(e, dict) and set(e) == {"rules"} else None
    if not isinstance(rs, list) or not rs:
        raise TableError(f, key, f"must hold rules [{{when, tile, why}}, ...], got {e!r}")
    out = []
    for i, r in enumerate(rs):
        where = f"{key} rule {i}"
        if not (isinstance(r, dict) and set(r) == {"when", "tile", "why"} and isinstance(r["when"], dict)
                and isinstance(r["tile"], dict) and isinstance(r["why"], str) and r["why"]):
            raise TableError(f, where, f"must hold when, tile and a why, got {r!r}")
        tests = [(*_test_of(k), v) for k, v in r["when"].items()]
        bad = [k for k, (var, _, v) in zip(r["when"], tests) if var not in variables
               or not isinstance(v, (int, float)) or isinstance(v, bool)]
        if bad:
            raise TableError(f, where, f"when may test {variables} (min_, max_, over_ or equal) against a number, "
                                       f"got {bad}")
        if set(r["tile"]) - fields:
            raise TableError(f, where, f"tile takes {sorted(fields)}, got {sorted(r['tile'])}")
        for k, v in r["tile"].items():
            if not isinstance(v, int) or isinstance(v, bool) or v not in _TILE_BOUNDS[k]:
                raise TableError(f, where, f"tile {k} must be one of {_said(_TILE_BOUNDS[k])}, got {v!r}")
        try:
            cls(**r["tile"])
        except (TypeError, ValueError) as err:
            raise TableError(f, where, str(err)) from None
        out.append((tuple(tests), r["tile"]))
    if fallback and out[-1][0]:
        raise TableError(f, f"{key} rule {len(out) - 1}", "the last rule's when must be empty (it takes any input)")
    return tuple(out)


def _tile(key: str, **at) -> dict:
    """The tile fields of the first rule of rules.json's `key` whose tests hold at these values."""
    return next(t for tests, t in rules()[key] if all(fn(at[var], v) for var, fn, v in tests))


def _step_pick(avg: float, steps) -> int:
    return next(bm for limit, bm in steps if avg <= limit)


def rule_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """BLOCK_M by rule (any GPU, any shape): about the mean number of pairs per expert (rules.json)."""
    return _step_pick(token_bucket(num_tokens) * top_k / num_experts, rules()["moe_block_m"])


def moe_block_m(num_tokens: int, top_k: int, num_experts: int, hidden: int | None = None,
                intermediate: int | None = None) -> int:
    """BLOCK_M for the base GEMM's alignment (shared by gate_up and down): the tuned tile table's
    (kernels/tiles.py) where one exists for this GPU and layer shape (hidden, intermediate given),
    else `rule_block_m`."""
    if runtime.interpreter():
        return 16
    entry = tiles.lookup(num_experts, hidden, intermediate, token_bucket(num_tokens))
    return entry["block_m"] if entry else rule_block_m(num_tokens, top_k, num_experts)


def lora_block_m(num_tokens: int, top_k: int, num_experts: int, num_slots: int) -> int:
    """BLOCK_M for the per-adapter alignment: mean pairs per (slot, expert) if the tokens spread
    over all slots."""
    if runtime.interpreter():
        return 16
    return _step_pick(token_bucket(num_tokens) * top_k / (num_experts * num_slots), rules()["lora_block_m"])


def gemm_config(num_tokens: int, block_m: int, N: int, K: int, num_experts: int | None = None) -> GemmConfig:
    """The base GEMM's tile: the tuned table's for this GPU, GEMM shape (N, K) and token bucket when
    its BLOCK_M is the alignment's, else `rule_gemm_config`."""
    if runtime.interpreter():
        return _INTERP_GEMM
    tile = tiles.gemm_tile(num_experts, N, K, token_bucket(num_tokens), block_m)
    return GemmConfig(**tile) if tile else rule_gemm_config(block_m)


def base_gemm_source(device_name: str | None, props=None) -> tuple[str, str]:
    """(source, why) of the base GEMM's tiles on the GPU `device_name` (None: no GPU): the GPU whose tile tables it
    reads (its own name where it has some), or "rule" (`rule_block_m`, `rule_gemm_config`). A GPU without tables
    takes the choice of tile_tables/gpus.json's `base_gemm` entry, else the closest recorded GPU's of its
    architecture (kernels/gpus.py); props: its `gpus.DeviceProps` (None: the driver's, else gpus.json's)."""
    if device_name is None:
        return "rule", "no GPU: the interpreter's one small tile" if runtime.interpreter() else "no GPU"
    return tiles.source(device_name, props)


def rule_gemm_config(block_m: int) -> GemmConfig:
    """The tile by rule (any GPU, any shape), by BLOCK_M only (rules.json)."""
    return next(cfg for limit, cfg in rules()["rule_gemm"] if block_m <= limit)


_NUM_SMS_GUESS = 132  # H100/H200; only used to size split_n, a static function of the shape
_MEMO: dict = {}  # (function, arguments) -> tile; emptied whenever rules.json is read again (`rules`)


def _memo(fn):
    """The LoRA kernels' tile for these arguments, worked out once: an eager launch asks for it every time, and
    walking the rules and building the frozen config costs the host some microseconds per launch. The interpreter's
    fixed tile is not kept (a test may switch the interpreter off and on)."""
    @functools.wraps(fn)
    def tile(*args):
        if runtime.interpreter():
            return fn(*args)
        rules()  # first: a read of rules.json again empties the memo
        key = (fn.__name__, args)
        got = _MEMO.get(key)
        if got is None:
            got = _MEMO[key] = fn(*args)
        return got
    return tile


@_memo
def lora_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel: rules.json's `lora_tile` (each rule with the H200 recordings behind it) by
    BLOCK_M and the mean pairs per (adapter, expert) group; split_n from the shape."""
    if runtime.interpreter():
        return _INTERP_LORA
    b = token_bucket(num_tokens)
    tile = _tile("lora_tile", block_m=block_m, avg=b * top_k / (num_experts * num_slots), bucket=b, N=N, K=K)
    # Rough count of busy blocks, from shapes only: at most one per pair, and about one per
    # (slot, expert) group while the groups are smaller than a block.
    busy = max(1, min(b * top_k, num_experts * num_slots))
    n_tiles = cdiv(N, tile["block_n"])
    # Split N until about two work items per SM exist; past a few dozen blocks, keep >= 256
    # columns per item (the shrink is recomputed per item).
    split = max(1, min(n_tiles, (2 * _NUM_SMS_GUESS + busy - 1) // busy))
    if busy >= 64:
        split = max(1, min(split, N // 256))
    return LoRAKernelConfig(split_n=split, **tile)


@_memo
def lora_down_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                     N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel for the down delta (P=1, routed weights): rules.json's `lora_down_tile`. Its N
    (hidden) is wide and each work item's time goes to the read-add-write of `out`, so its tiles are wider than
    gate_up's and keep more of those bytes in flight; registers decide the programs per SM (65536 per SM: 128 per
    thread for 4 programs of 4 warps), so some rules cap them. split_n: gate_up's, at most one per 128 columns."""
    base = lora_config(num_tokens, top_k, num_experts, num_slots, block_m, N, K)
    if runtime.interpreter():
        return base
    b = token_bucket(num_tokens)
    tile = _tile("lora_down_tile", block_m=block_m, avg=b * top_k / (num_experts * num_slots), bucket=b, K=K, N=N)
    return LoRAKernelConfig(split_n=max(1, min(base.split_n, cdiv(N, 128))), **tile)


def block_r(rank: int) -> int:
    """BLOCK_R: next power of two >= max(rank, 16)."""
    r = 16
    while r < rank:
        r *= 2
    return r


_DECODE_PROGRAMS = 2 * _NUM_SMS_GUESS  # about two programs per SM


@_memo
def decode_config(num_pairs: int, P: int, N: int, K: int, R: int) -> DecodeConfig:
    """Decode tile: rules.json's `decode_tile` by the programs' units (pairs x slices), K and BLOCK_R; N split in
    64-column shares until about two programs per SM exist."""
    if runtime.interpreter():
        return _INTERP_DECODE
    split = max(1, min(cdiv(N, 64), cdiv(_DECODE_PROGRAMS, max(1, num_pairs * P))))
    return DecodeConfig(split_n=split, **_tile("decode_tile", units=num_pairs * P, K=K, block_r=block_r(R)))
