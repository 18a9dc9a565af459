"""The one exit-code table of every kernel that exits early: which program returns before loading any activation or
weight, and why. A code means one condition in every kernel (its subject is the kernel's unit of work: a (slot,
block) of the aligned LoRA kernel, a (token, k) pair of the decode kernel, a tile of the base GEMM); `KERNELS` says
which codes each kernel takes, in the order it checks them (0, ran, last). The two LoRA kernels write their codes
into a debug buffer (`exit_codes=`, WRITE_EXIT), which ops/reference.py (`exit_codes`) and ops/reference_rows.py
(`decode_exit_codes`) compute on the host; notebook 02 draws its exit maps and names from here (`names`,
ui/kernel_plots.py). docs/design.md ("Early exit") gives the table in prose."""
from __future__ import annotations

from typing import NamedTuple

NEVER_WRITTEN = -7  # the value a debug buffer is filled with: a program that never wrote its code


class Exit(NamedTuple):
    code: int
    name: str  # short: exit_summary's columns (instruments/recorders/early_exit.py)
    condition: str


EXITS = (
    Exit(0, "ran", "did the work"),
    Exit(1, "empty slot", "its LoRA row holds no adapter (lora_ids = -1)"),
    Exit(2, "disabled", "its adapter is disabled for this batch (adapter_enabled = 0)"),
    Exit(3, "past the end", "past the live work (a block at or past num_tokens_post_padded, a pair at or past "
                            "num_live_pairs)"),
    Exit(4, "expert -1", "routed to no expert (expert id = -1)"),
    Exit(5, "token without adapter", "its token has no LoRA row (token_lora_mapping = -1)"),
    Exit(6, "nothing live", "no adapter is live in the whole launch (every row empty or disabled)"),
    Exit(7, "padding only", "its sub-block holds padding rows only"),
)

# kernel: the codes it exits with, in the order it checks them (0, ran, last where it writes codes)
KERNELS = {
    "fused_moe_lora_kernel": (1, 2, 3, 4, 0),  # kernels/fused_moe_lora.py, writes its codes (WRITE_EXIT)
    "lora_decode_kernel": (3, 5, 1, 2, 4, 0),  # kernels/lora_decode.py, writes its codes (WRITE_EXIT)
    "packed_shrink_kernel": (6, 3),  # kernels/fused_moe_lora_packed.py: an empty block range, zeros where read
    "fused_moe_kernel": (3, 4, 7),  # kernels/fused_moe.py, a program per tile (its persistent loop skips them)
}
_BY_CODE = {e.code: e for e in EXITS}


def names(kernel: str) -> dict[int, str]:
    """{code: "ran (did the work)" / "exit: <condition>"} of the codes `kernel` takes, in code order."""
    if kernel not in KERNELS:
        raise ValueError(f"no kernel {kernel!r} exits early; the kernels that do: {sorted(KERNELS)}")
    return {c: (f"ran ({_BY_CODE[c].condition})" if c == 0 else f"exit: {_BY_CODE[c].condition}")
            for c in sorted(KERNELS[kernel])}


def short(kernel: str) -> dict[int, str]:
    """{code: "<code> <short name>"} of the codes `kernel` takes, in code order (exit_summary's columns)."""
    names(kernel)  # the kernel's check
    return {c: f"{c} {_BY_CODE[c].name}" for c in sorted(KERNELS[kernel])}
