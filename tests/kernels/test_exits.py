"""One exit-code table (kernels/exits.py): every kernel's codes are the table's, the LoRA kernels' names and the
exit map's columns are derived from it, and a code the host rule computes is one the kernel may write."""
import pytest
import torch

from lora_moe_lab.instruments.recorders import early_exit
from lora_moe_lab.kernels import exits, fused_moe_lora, lora_decode
from lora_moe_lab.ops.reference_rows import decode_exit_codes


def test_every_kernel_reads_the_one_table():
    codes = {e.code for e in exits.EXITS}
    assert len(codes) == len(exits.EXITS) and exits.NEVER_WRITTEN not in codes
    for kernel, taken in exits.KERNELS.items():
        assert set(taken) <= codes and len(set(taken)) == len(taken), kernel
    assert fused_moe_lora.EXIT_CODES == exits.names("fused_moe_lora_kernel")
    assert lora_decode.DECODE_EXIT_CODES == exits.names("lora_decode_kernel")
    assert list(early_exit.EXIT_SHORT) == sorted(exits.KERNELS["fused_moe_lora_kernel"])
    with pytest.raises(ValueError, match="no kernel 'router_kernel' exits early"):
        exits.names("router_kernel")


def test_the_host_rule_writes_only_the_kernels_codes():
    g = torch.Generator().manual_seed(torch.seed() % 2 ** 31)
    M, k, L = 5, 2, 3
    topk = torch.randint(-1, 4, (M, k), generator=g, dtype=torch.int32)
    mapping = torch.randint(-1, L, (M,), generator=g, dtype=torch.int32)
    codes = decode_exit_codes(topk, mapping, torch.tensor([0, -1, 2], dtype=torch.int32),
                              torch.tensor([1, 1, 0], dtype=torch.int32), torch.tensor([M * k - 1], dtype=torch.int32))
    assert set(codes.tolist()) <= set(exits.names("lora_decode_kernel"))
