"""Adding a LoRA path is its module and its table entries (kernels/paths/). A toy path, written here as a module of
kernels/paths/ would write it and registered, is named by a table's entries: the plan returns it, the layer runs it
at its hook points, the table's checks accept it, and the forward matches the float64 reference model. No other file
changes: the plan, the layer, the pool and the backends name no path but the base cases."""
import ast
import json
from pathlib import Path

import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab.kernels import paths, plan
from lora_moe_lab.kernels.plan import LoRAPlan
from lora_moe_lab.kernels.table_checks import TableError
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.ops import reference as ref

PKG = Path(paths.__file__).resolve().parents[2]


class ToyPath(paths.LoRAPath):
    """The delta per (token, k) pair in plain torch, straight from the routing: no alignment, no kernel of its own."""

    name = "toy"

    def __init__(self):
        self.calls = []

    def rule(self, q: paths.Question) -> LoRAPlan:
        return LoRAPlan(q.op, self.name, q.block_m, decided_by=q.entry.decided_by)

    def prepare(self, hook, p, topk_ids) -> None:
        hook.align, hook.topk_ids = None, topk_ids

    def delta(self, hook, p, x, a, b, out, top_k, routed_weights=None, gather=True) -> None:
        i, ids = hook.info, hook.topk_ids
        pair = torch.arange(ids.numel(), device=ids.device)
        tok = pair // top_k
        row = i.token_lora_mapping.long()[tok]
        slot = i.lora_ids.long()[row.clamp(min=0)]
        live = (row >= 0) & (slot >= 0) & (i.adapter_enabled[row.clamp(min=0)] != 0)
        e, s = ids.reshape(-1).long(), slot.clamp(min=0)
        xr = x[tok] if gather else x[pair]
        N = b.shape[3]
        for q in range(a.shape[0]):
            d = torch.bmm(torch.bmm(xr[:, None, :], a[q][s, e].transpose(1, 2)), b[q][s, e].transpose(1, 2))[:, 0]
            if routed_weights is not None:
                d = d * routed_weights.reshape(-1)[:, None].to(d.dtype)
            out[:, q * N:(q + 1) * N] += torch.where(live[:, None], d, torch.zeros_like(d))
        self.calls.append(p.op)


@pytest.fixture
def toy():
    path = paths.register(ToyPath())
    yield path
    paths.PATHS.pop(path.name, None)  # also where a test failed while the toy was unregistered


def test_a_toy_path_runs_from_its_module_and_its_table_entries(toy, device, monkeypatch):
    t = plan.table_for().but(decode_max_pairs=0, ops={op: plan.entries("toy", decided_by=["toy run"])
                                                      for op in plan.OPS}, shapes={})
    monkeypatch.setattr(plan, "table_for", lambda device=None: t)
    lab = build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, device=str(device), backend="triton", seed=4)
    lab.pool.load("r3", rank=3)
    lab.pool.load("r8", rank=8, scaling=0.5)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    assert [plan.plan(op, 6, lab.shape, lora=plan.LoRADims(3, 8, 3)).path for op in plan.OPS] == ["toy", "toy"]
    x = lab.random_input(batch.num_tokens, seed=1)
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    assert toy.calls == ["gate_up", "down"] * 2  # both layers, at both hook points
    lora = [dict(weights=lab.pool.layers[i], token_slot=tensors.token_lora_mapping.cpu(),
                 lora_ids=tensors.lora_ids.cpu(), adapter_enabled=tensors.adapter_enabled.cpu()) for i in range(2)]
    want = ref.ref_model(x, lab.model, lora, routing=lab.model.routing_log)
    assert rel_err(y, want) < fp32_tol(device)


def _raw_default() -> dict:
    raw = json.loads((plan.TABLE_DIR / plan.DEFAULT_FILE).read_text())
    while "follows" in raw:  # the default follows a GPU's plan
        raw = json.loads((plan.TABLE_DIR / plan.file_name(raw["follows"])).read_text())
    return raw


def test_a_table_names_a_path_once_it_is_registered(toy):
    raw = _raw_default()
    raw["ops"]["gate_up"]["128"] = {"path": "toy"}
    assert plan.check_table(raw, "toy.json").ops["gate_up"][128].path == "toy"
    del paths.PATHS["toy"]
    with pytest.raises(TableError, match=r"toy\.json.*gate_up bucket 128.*path must be one of"):
        plan.check_table(raw, "toy.json")
    paths.register(toy)  # for the fixture's teardown


def _literals(file: Path) -> set:
    """The string constants of a file's code (its docstrings left out)."""
    tree = ast.parse(file.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


@pytest.mark.parametrize("rel", ["kernels/plan.py", "model/moe.py", "model/lora.py",
                                 "model/sizing.py", "ops/triton_backend.py", "ops/torch_backend.py"])
def test_the_plan_layer_pool_and_backends_name_no_path_but_the_base_cases(rel):
    """Only "none" (no LoRA work) and "separate" (the torch backend's plan; a fused entry of a later hook) may appear:
    every other path's rule, launches, weights and warm-up live in its own module. (kernels/plan_table.py reads the
    files: its "decode" is the decode bound's key, checked by the table tests.)"""
    named = _literals(PKG / rel) & set(paths.PATHS)
    assert named <= {"none", "separate"}, f"{rel} names the paths {sorted(named)}"
