"""The bounds every tuned value of the kernel tables (kernels/tile_tables/) must hold, and the error a table that
breaks them raises. A table is checked whole when it is read (once per process): an option the code does not have,
or a value the kernels could not take (a block of 2**62), is refused at load, naming the file and the entry.

The option names are the launchers' own: the base GEMM's tile (`configs.GemmConfig`), the packed shrink's keywords
(`fused_moe_lora_packed.lora_shrink_packed`) and the packed GEMM's expand options (`EXPAND_OPTIONS` there);
tests/kernels/test_tables.py holds the three lists against the code. The bounds are those of the hardware and the
kernels: blocks are powers of two (Triton's `tl.arange`) no larger than a tile the shared memory of one SM can hold;
a program has 1 to 16 warps; ptxas takes a register cap from 24 to 255 per thread."""
from __future__ import annotations

from typing import NamedTuple


class TableError(ValueError):
    """A tuned table the code cannot take: its file, the entry (where in the file) and what is wrong."""

    def __init__(self, file, entry: str, what: str):
        self.file, self.entry = str(file), entry
        super().__init__(f"{file}: {entry}: {what}" if entry else f"{file}: {what}")


class Bound(NamedTuple):
    """One option's values: true or false (`flag`), else an int from lo to hi (a power of two where `pow2`; 0 too,
    the option off, where `off`)."""

    lo: int = 0
    hi: int = 0
    pow2: bool = False
    off: bool = False
    flag: bool = False

    def describe(self) -> str:
        if self.flag:
            return "true or false"
        s = f"{'a power of two' if self.pow2 else 'an int'} from {self.lo} to {self.hi}"
        return f"0 (off) or {s}" if self.off else s

    def holds(self, v) -> bool:
        if self.flag:
            return isinstance(v, bool)
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        if self.off and v == 0:
            return True
        return self.lo <= v <= self.hi and (not self.pow2 or v & (v - 1) == 0)


FLAG = Bound(flag=True)
BLOCK = Bound(16, 256, pow2=True)
WARPS = Bound(1, 16, pow2=True)
STAGES = Bound(1, 8)
MAX_REGS = Bound(24, 255, off=True)  # ptxas maxnreg; 0: the compiler's choice

# the base GEMM's tile (configs.GemmConfig), as a tile table or an expand `tile` sets it
TILE = {"block_n": BLOCK, "block_k": BLOCK, "group_m": Bound(1, 64), "num_warps": WARPS, "num_stages": STAGES,
        "w_desc": FLAG, "persistent": Bound(0, 16), "flatten": FLAG, "max_regs": MAX_REGS, "early_loads": FLAG,
        "sub_m": Bound(16, 128, pow2=True, off=True)}
# the packed shrink's keywords a plan may set (the others are the launcher's own: gather, u_pair, tail_cols, ...)
SHRINK = {"block_k": BLOCK, "num_warps": WARPS, "num_stages": STAGES, "sub_m": Bound(16, 128, pow2=True, off=True),
          "slot_window": Bound(1, 64, pow2=True, off=True), "both_slices": FLAG, "row_ptrs": FLAG,
          "max_regs": MAX_REGS, "slot_order": FLAG}
# the packed GEMM's expand options; `tile` is a partial TILE
EXPAND = {"depth": Bound(16, 1024, pow2=True), "tile": None}


def check_fields(values, bounds: dict, file, entry: str, what: str) -> None:
    """Every key of `values` is one of `bounds`' and holds its bound; a TableError naming the file, the entry and
    the key otherwise."""
    if not isinstance(values, dict):
        raise TableError(file, entry, f"{what} must be a dict, got {values!r}")
    unknown = sorted(set(values) - set(bounds))
    if unknown:
        raise TableError(file, entry, f"{what}: no option {unknown} (the options a table sets: {sorted(bounds)})")
    for k, v in values.items():
        if bounds[k] is None:  # expand's tile: GemmConfig fields
            check_fields(v, TILE, file, entry, f"{what} tile")
        elif not bounds[k].holds(v):
            raise TableError(file, entry, f"{what} {k} must be {bounds[k].describe()}, got {v!r}")
