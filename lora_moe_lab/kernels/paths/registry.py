"""What every LoRA path is asked (`LoRAPath`), and the registry the plan reads (`PATHS`).

The hook a path works for (model/moe.py: LoRAHook) is passed in, never imported: the kernels sit below the model.
It carries `info` (the batch's LoRAInfo: the layer's weights, token_lora_mapping, lora_ids, adapter_enabled,
lora_ranks), `backend` (the ops the path launches through), `E` (experts), and the per-batch state a path sets in
`prepare` (`align`, `topk_ids`)."""
from __future__ import annotations

from typing import NamedTuple

PATHS: dict = {}  # name -> LoRAPath, in registration order


class Question(NamedTuple):
    """What a rule is asked: op `op` of a layer of `shape` at M tokens, the table's entry for its bucket, the hook's
    static LoRA shapes (kernels/plan.py: LoRADims), the device's table, the base alignment's block_m, and whether the
    hook is the layer's only one (`alone`)."""

    op: str
    M: int
    shape: object
    entry: object
    lora: object
    table: object
    block_m: int
    alone: bool


def stacks(lw, op: str) -> tuple:
    """(A, B) of op as every LoRA kernel reads them, a slice axis first: gate_up (2, S, E, r, K) and (2, S, E, I, r),
    down (1, S, E, r, I) and (1, S, E, K, r)."""
    if op == "gate_up":
        return lw.gate_up_a, lw.gate_up_b
    return lw.down_a[None], lw.down_b[None]


class LoRAPath:
    """One LoRA path. `in_gemm`: its delta runs inside the op's base GEMM (`gemm`), so only a layer's first hook may
    take it; else at the op's hook point (`prepare` once per batch, then `delta`). `in_table`: a plan table's entry
    may name it."""

    name = ""
    in_gemm = False
    in_table = True

    def rule(self, q: Question):
        """The op's LoRAPlan where the table's entry names this path (it may hand over to another path's rule)."""
        raise NotImplementedError(f"the {self.name!r} path has no table rule")

    # --- per batch, at the hook points (the other paths) ---------------------------------------------------------
    def prepare(self, hook, p, topk_ids) -> None:
        """This batch's state for the deltas (an alignment, or the routing itself), set on the hook."""

    def delta(self, hook, p, x, a, b, out, top_k, **kw) -> None:
        """out += the op's delta (gate_up: into the intermediate; down: x routed weight, kw routed_weights)."""

    def after_gate_up(self, hook, p, x, inter, topk_ids, top_k) -> None:
        self.delta(hook, p, x, *stacks(hook.info.weights, "gate_up"), inter, top_k, gather=True)

    def after_down(self, hook, p, act, out, top_k, topk_w) -> None:
        self.delta(hook, p, act, *stacks(hook.info.weights, "down"), out, top_k, routed_weights=topk_w, gather=False)

    # --- inside the base GEMM (in-GEMM paths) ---------------------------------------------------------------------
    def gemm(self, hook, p, x, w, align, top_k, out, routed_weights=None):
        raise NotImplementedError(f"the {self.name!r} path does not run inside the base GEMM")

    # --- the layer's weights ------------------------------------------------------------------------------------
    def hold(self, lw, op: str, w, backend: str):
        """The layer's base weight of op as this path stores it (the wide build moves it into wider rows); the
        base weight itself where the path keeps none."""
        return w

    def layer_bytes(self, shape, lora, dtype, backend: str) -> int:
        """Bytes of one layer this path's own layout holds beside the pool's stacks (the build's sizing)."""
        return 0

    # --- warm-up ------------------------------------------------------------------------------------------------
    def warmup_jobs(self, ctx, M: int) -> list:
        """[(name, config, block_m, fn(config))]: the launches that compile this path's builds at M tokens, on the
        tiny inputs of `ctx` (ops/triton_backend.py: warmup)."""
        return []

    def __repr__(self):
        return f"<LoRA path {self.name}>"


def register(path: LoRAPath) -> LoRAPath:
    """Add a path (a module of this package does it on import; a test may register a toy path). The plan's tables
    may name it once registered."""
    if not isinstance(path, LoRAPath) or not path.name:
        raise TypeError(f"register takes a named LoRAPath instance, got {path!r}")
    PATHS[path.name] = path
    return path


def get(name: str) -> LoRAPath:
    if name not in PATHS:
        raise ValueError(f"no LoRA path {name!r}; the registered paths: {sorted(PATHS)}")
    return PATHS[name]


def table_paths() -> tuple:
    """The paths a table entry may name."""
    return tuple(n for n, p in PATHS.items() if p.in_table)
