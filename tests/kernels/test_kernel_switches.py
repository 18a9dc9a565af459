"""The library's kernels keep only the compile-time switches a plan can take (the builds the studies tried and no
plan takes live in studies/kernels/tried/), read from the source: the base GEMM's constexpr parameters, counted, and
no module-global record of the last launch anywhere in the package."""
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


def test_no_module_global_records_a_launch():
    """A launch's grid and tiles are read from its arguments (fused_moe_lora.lora_launch_plan,
    lora_decode.decode_launch_plan) or from the launch itself, never from a module's record of the last one."""
    found = [f"{p.relative_to(PKG)}: {m.group(1)}" for p in PKG.rglob("*.py")
             for m in re.finditer(r"^(LAST_\w+)\s*[:=]", p.read_text(), re.M)]
    assert not found, found


def runtime_params(path: Path, kernel: str) -> list[str]:
    """The parameters of `kernel` in `path` that are not tl.constexpr (what a launch passes positionally)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == kernel:
            args = node.args.posonlyargs + node.args.args
            return [a.arg for a in args if a.annotation is None or ast.unparse(a.annotation) != "tl.constexpr"]
    raise AssertionError(f"{path.name} has no function {kernel}")


def test_the_empty_reference_takes_the_lora_kernels_arguments():
    """kernels/empty.py's empty_args_kernel is launched with the aligned LoRA kernel's very arguments (the
    recorders' all-disabled reference, instruments/recorders/kernel_cases.py: aligned_empty)."""
    lora = runtime_params(PKG / "kernels" / "fused_moe_lora.py", "fused_moe_lora_kernel")
    assert len(runtime_params(PKG / "kernels" / "empty.py", "empty_args_kernel")) == len(lora)

