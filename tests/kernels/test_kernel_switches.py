"""The library's kernels keep only the compile-time switches a plan can take (the builds the studies tried and no
plan takes live in studies/kernels/tried/), read from the source: the base GEMM's constexpr parameters, counted, and
no new module-global record of the last launch in the package."""
import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "lora_moe_lab"
MAX_SWITCHES = {"fused_moe_kernel": 23}


def constexprs(path: Path, kernel: str) -> list[str]:
    """The parameters of `kernel` in `path` annotated tl.constexpr."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == kernel:
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            return [a.arg for a in args if a.annotation is not None and ast.unparse(a.annotation) == "tl.constexpr"]
    raise AssertionError(f"{path.name} has no function {kernel}")


def test_the_base_gemm_has_at_most_23_switches():
    got = constexprs(PKG / "kernels" / "fused_moe.py", "fused_moe_kernel")
    assert len(got) <= MAX_SWITCHES["fused_moe_kernel"], got
    tried = {"LORA", "FOLD_DESC", "BLOCK_R", "EXPAND_UNROLL", "EXPAND_PREFETCH", "EXPAND_U_PTR", "EXPAND_EARLY"}
    assert not tried & set(got)  # studies/kernels/tried/fused_moe_switches.py has them
    assert "X_KEEP" not in constexprs(PKG / "kernels" / "fused_moe_lora_packed.py", "packed_shrink_kernel")


# The module-global records of a last launch the library still keeps (their readers: the kernel recorders in
# instruments/recorders/kernel_cases.py and studies/kernels/record*.py). The list only shrinks.
LAST_LAUNCH_RECORDS = {"kernels/fused_moe_lora.py: LAST_LORA_LAUNCH", "kernels/lora_decode.py: LAST_DECODE_LAUNCH"}


def test_no_new_module_global_records_a_launch():
    found = {f"{p.relative_to(PKG)}: {m.group(1)}" for p in PKG.rglob("*.py")
             for m in re.finditer(r"^(LAST_\w+)\s*[:=]", p.read_text(), re.M)}
    assert found <= LAST_LAUNCH_RECORDS, sorted(found - LAST_LAUNCH_RECORDS)
    assert not any("packed" in f for f in found)  # the packed build's launches: read from its arguments
