"""The audit on code no one here wrote: transformers' MoE families and PEFT adapters, tiny random-init.

The expected syncs are derived without the audit, from the model's own source and its routing:
  * the experts class's forward is read line by line (inspect): a `.nonzero()` line syncs once per
    layer; per expert hit, an `if expert_idx == self.num_experts` line syncs once (bool), a
    `torch.where(...)` line once (where(cond)), and every `[expert_idx]` on a line once (a 0-d device
    tensor as an index: torch's C++ indexing calls .item());
  * the experts hit per layer come from a forward pre-hook on each experts module (numpy.unique of
    the routed ids it receives);
  * transformers' mask preprocessing (`find_packed_sequence_indices`) syncs once per call (a
    `.all()` read in an `if`), counted by wrapping it;
  * PEFT's mixed-adapter forward indexes with a Python list: one upload per `[sub_batch_indices_list[i]]`
    on a line (two on a `+=` line: a get and a set), per LoRA layer and adapter in the batch.
On a CPU `F.one_hot` reads its input's min and max (two .item()s a GPU does not make): the audit must
list them apart, not count them. On a GPU (the GPU check) the same expectations hold, and torch's
own sync debug mode must agree with the audit's count, with no kind `other`.
Line numbers and counts move between transformers versions: everything is derived at test time."""

from __future__ import annotations

import inspect
import os
import re
from collections import Counter

import numpy as np
import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import expert_loop
from lora_moe_lab.instruments.recorders.audit import FocusError, audit

transformers = pytest.importorskip("transformers")
from tests.third_party import corpus as C  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (the fixture, used below)

pytestmark = pytest.mark.usefixtures("one_thread")

DEV = "cuda" if runtime.has_cuda() else "cpu"
THIS = "tests/instruments/recorders/test_audit_corpus.py"
EAGER = list(C.BUILDERS)
DEFAULT = [n for n in C.BUILDERS if n != "dbrx"]  # DBRX has the per-expert loop only



# --- the independent derivation ---------------------------------------------------------------------
def _rel(path: str) -> str:
    root = os.path.dirname(os.path.dirname(transformers.__file__))
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")


def source_rules(cls) -> tuple[dict, dict, int | None, str]:
    """From the experts forward's source: ({(line, kind): syncs per layer}, {(line, kind): syncs per
    expert hit}, the one_hot line, the file as the audit names it)."""
    lines, first = inspect.getsourcelines(cls.forward)
    per_layer, per_hit, one_hot = {}, {}, None
    for i, raw in enumerate(lines, first):
        code = raw.split("#")[0]
        if ".nonzero()" in code:
            per_layer[(i, "shape")] = 1
        if re.search(r"if expert_idx == self\.num_experts", code):
            per_hit[(i, "item")] = 1
        if "torch.where(" in code:
            per_hit[(i, "shape")] = 1
        if code.count("[expert_idx]"):
            per_hit[(i, "index0d")] = code.count("[expert_idx]")
        if "one_hot(" in code:
            one_hot = i
    return per_layer, per_hit, one_hot, _rel(inspect.getsourcefile(cls))


class Routing:
    """Experts hit per layer, seen by a pre-hook on every experts module (independent of the audit)."""

    def __init__(self, model, cls):
        self.hits: list[int] = []
        self.handles = [m.register_forward_pre_hook(self._hook, with_kwargs=True)
                        for m in model.modules() if isinstance(m, cls)]

    def _hook(self, mod, args, kwargs):
        idx = args[1] if len(args) > 1 else next(v for k, v in kwargs.items() if k in ("top_k_index", "router_indices"))
        self.hits.append(len(np.unique(idx.detach().cpu().numpy())))

    def close(self):
        for h in self.handles:
            h.remove()


class MaskCalls:
    """Calls of transformers' packed-sequence check (one bool sync each), counted by a wrapper."""

    def __init__(self, monkeypatch):
        import transformers.masking_utils as mu

        self.n = 0
        self.line = None
        fn = getattr(mu, "find_packed_sequence_indices", None)
        if fn is None:
            return
        lines, first = inspect.getsourcelines(fn)
        self.line = next(i for i, l in enumerate(lines, first) if ".all()" in l and "if " in l)
        self.file = _rel(inspect.getsourcefile(fn))

        def counted(*a, **k):
            self.n += 1
            return fn(*a, **k)

        monkeypatch.setattr(mu, "find_packed_sequence_indices", counted)


def expected(c: C.Corpus, impl: str, monkeypatch, extra: Counter | None = None):
    """(expected {(site, kind): count}, expected CPU-only {site: count}, the plain output)."""
    routing, masks = Routing(c.model, c.experts_cls), MaskCalls(monkeypatch)
    try:
        y = c.forward()
    finally:
        routing.close()
    exp = Counter()
    cpu_only = Counter()
    if impl == "eager":
        per_layer, per_hit, one_hot, f = source_rules(c.experts_cls)
        for hit in routing.hits:
            for (line, kind), n in per_layer.items():
                exp[(f"{f}:{line}", kind)] += n
            for (line, kind), n in per_hit.items():
                exp[(f"{f}:{line}", kind)] += n * hit
            if DEV == "cpu":
                cpu_only[f"{f}:{one_hot}"] += 2
    if masks.n:
        exp[(f"{masks.file}:{masks.line}", "item")] += masks.n
    exp.update(extra or {})
    return exp, cpu_only, y


def got(rep) -> Counter:
    return Counter((e.site, e.kind) for e in rep.events)


def _check(rep, exp, cpu_only):
    g = got(rep)
    if DEV == "cuda":
        # the GPU's transformers may add host-data uploads of its own version (e.g. a mask constant built by
        # torch.tensor(..., device=...)): torch's debug mode is the independent count there (checked below)
        g = Counter({k: v for k, v in g.items() if k in exp or k[1] not in ("upload", "d2h")})
    assert g == exp, rep.summary(30)
    assert Counter(e.site for e in rep.cpu_only) == cpu_only, rep.summary(30)
    assert all(not s.startswith("tests/") for s, _ in got(rep)), "a site names the caller, not the library line"
    # the user's line beside it: the corpus's forward (the mask check's is this file's counting wrapper)
    assert {e.called_from.split(":")[0] for e in rep.events} <= {"tests/third_party/corpus.py", THIS}
    if DEV == "cuda":  # torch's own count agrees, nothing unexplained
        assert rep.torch_count == rep.debug_mode_count == rep.count and "other" not in rep.kinds, rep.summary(30)


# --- the corpus ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EAGER)
def test_eager_expert_loop_every_sync_at_its_line(name, monkeypatch):
    c = C.build(name, "eager", device=DEV)
    exp, cpu_only, y = expected(c, "eager", monkeypatch)
    rep = audit(c.forward, warmup=0, profile=False, focus="transformers")
    _check(rep, exp, cpu_only)
    per_hit = source_rules(c.experts_cls)[1]
    assert sum(per_hit.values()) >= 4  # bool or none, where + its 0-d index, the weights' 0-d indices
    assert torch.equal(c.forward(), y)  # the audit changes no result


@pytest.mark.skipif(DEV != "cuda", reason="the full-size layer is the GPU check's case (2.4 B parameters)")
def test_qwen3_moe_full_size_every_sync_at_its_line(monkeypatch):
    # Qwen3-30B-A3B's layer, 4 layers x 128 experts, 2048 tokens, bf16: the expected count from the source's
    # rules and the experts each layer hits; the audit equals it and torch's debug mode, 0 `other`
    c = C.qwen3_moe_full(DEV)
    exp, cpu_only, y = expected(c, "eager", monkeypatch)
    rep = audit(c.forward, warmup=0, profile=False, focus="transformers")
    _check(rep, exp, cpu_only)
    assert sum(exp.values()) > 1000 and all(s.startswith("transformers/") for s, _ in exp), rep.summary(30)
    assert torch.equal(c.forward(), y)
    del c
    torch.cuda.empty_cache()


@pytest.mark.parametrize("name", DEFAULT)
def test_default_experts_are_sync_free(name, monkeypatch):
    # bf16: CUDA's grouped GEMM runs it natively; in float32 ATen's fallback reads the group offsets back
    # (one sync per grouped GEMM, kind d2h: test_default_experts_in_float32_read_their_offsets)
    c = C.build(name, "grouped_mm", device=DEV, dtype=torch.bfloat16)
    exp, cpu_only, y = expected(c, "grouped_mm", monkeypatch)
    rep = audit(c.forward, warmup=0, profile=False)
    _check(rep, exp, cpu_only)
    assert not [k for k in got(rep) if "modeling_" in k[0]]  # nothing in the model's own file
    assert torch.equal(c.forward(), y)


def test_default_experts_in_float32_read_their_offsets(monkeypatch):
    import transformers.integrations.moe as moe

    c = C.build("qwen3_moe", "grouped_mm", device=DEV)
    gemms = inspect.getsource(moe.grouped_mm_experts_forward).count("_grouped_linear(")  # up and down
    rep = audit(c.forward, warmup=0, profile=False)
    d2h = Counter(e.site for e in rep.events if e.kind == "d2h")
    assert sum(d2h.values()) == gemms * c.model.config.num_hidden_layers, rep.summary()
    assert all(s.startswith("transformers/integrations/moe.py:") for s in d2h)


def test_hoisted_rewrite_one_tolist_per_layer_and_bit_equal(monkeypatch):
    c = C.build("qwen3_moe", "eager", device=DEV)
    y = c.forward()
    c.model.config._experts_implementation = expert_loop.register()
    masks = MaskCalls(monkeypatch)
    rep = audit(c.forward, warmup=0, profile=False)
    layers = c.model.config.num_hidden_layers
    assert rep.kinds == Counter({"tolist": layers, "item": masks.n}), rep.summary()
    assert {e.site for e in rep.events if e.kind == "tolist"} == {
        f"lora_moe_lab/instruments/recorders/expert_loop.py:"
        f"{next(i for i, l in enumerate(inspect.getsourcelines(expert_loop)[0], 1) if '.tolist()' in l and '=' in l)}"}
    assert torch.equal(c.forward(), y)


def _peft(adapters: int, params: bool):
    from peft import LoraConfig, get_peft_model

    c = C.build("qwen3_moe", "eager", device=DEV)
    kw = dict(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    first = LoraConfig(**kw, **({"target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
                                if params else {}))
    pm = get_peft_model(c.model, first, adapter_name="one").eval()
    for i in range(1, adapters):
        pm.add_adapter(f"a{i}", LoraConfig(**kw))
    return c, pm


def _peft_uploads(pm, names) -> Counter:
    """PEFT's mixed-batch forward, from its source: a Python-list index per `[sub_batch_indices_list[i]]`."""
    from peft.tuners.lora.layer import Linear, LoraLayer

    fn = LoraLayer._mixed_batch_forward
    lines, first = inspect.getsourcelines(fn)
    f = _rel(inspect.getsourcefile(fn)).replace("../", "")
    f = f[f.index("peft/"):]
    layers = sum(isinstance(m, Linear) for m in pm.modules())
    active = len({n for n in names if n != "__base__"})
    out = Counter()
    for i, raw in enumerate(lines, first):
        code = raw.split("#")[0]
        # vanilla LoRA's two lines: the sub-batch gather (one list index) and `result[idx] += ...` (a get
        # and a set); the variant branch's lines are not taken
        n = code.count("[sub_batch_indices_list[i]]")
        if n and ("sub_batch = x[" in code or "+=" in code):
            out[(f"{f}:{i}", "upload")] += n * (2 if "+=" in code else 1) * layers * active
    return out


def test_peft_lora_on_attention_and_expert_parameters(monkeypatch):
    c, pm = _peft(1, params=True)
    c.model = pm
    exp, cpu_only, y = expected(c, "eager", monkeypatch)
    rep = audit(c.forward, warmup=0, profile=False)
    _check(rep, exp, cpu_only)  # LoRA on the experts' parameters adds no sync of its own
    assert torch.equal(c.forward(), y)


def test_peft_mixed_adapter_batch_uploads_its_index_lists(monkeypatch):
    c, pm = _peft(2, params=False)
    names = ["one", "a1", "__base__"]
    ids = torch.randint(0, C.VOCAB, (3, 8), generator=torch.Generator().manual_seed(1)).to(DEV)

    def fwd():
        with torch.no_grad():
            return pm(input_ids=ids, use_cache=False, adapter_names=names).logits

    c.forward = fwd
    exp, cpu_only, y = expected(c, "eager", monkeypatch, extra=_peft_uploads(pm, names))
    rep = audit(fwd, warmup=0, profile=False)
    assert got(rep) == exp, rep.summary(30)
    assert Counter(e.site for e in rep.cpu_only) == cpu_only
    assert sum(n for (s, k), n in got(rep).items() if k == "upload") == 8 * 3  # 4 LoRA layers x 2 adapters x 3
    assert torch.equal(fwd(), y)


def test_peft_mixed_batch_over_expert_parameters_keeps_peft_error():
    c, pm = _peft(1, params=True)
    pm.add_adapter("a1", __import__("peft").LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    with pytest.raises(ValueError, match="mixed adapter batches") as ei:
        audit(lambda: pm(input_ids=c.ids, use_cache=False, adapter_names=["one"]).logits, warmup=0, profile=False)
    assert "peft" in str(ei.traceback[-1].path)  # PEFT's own frame raised it


def test_generate_per_step_structure(monkeypatch):
    """generate(): the experts' syncs of every step by the closed form; the generation loop's own
    syncs sited in transformers, the same number at every extra step."""
    c = C.build("qwen3_moe", "eager", device=DEV)
    per_layer, per_hit, _, f = source_rules(c.experts_cls)

    reps = {}
    for n in (3, 5):
        routing = Routing(c.model, c.experts_cls)
        with torch.no_grad():
            rep = audit(lambda: c.model.generate(c.ids, max_new_tokens=n, do_sample=False, pad_token_id=0),
                        warmup=0, profile=False)
        routing.close()
        exp = Counter()
        for hit in routing.hits:
            for (line, kind), k in per_layer.items():
                exp[(f"{f}:{line}", kind)] += k
            for (line, kind), k in per_hit.items():
                exp[(f"{f}:{line}", kind)] += k * hit
        experts = Counter({k: v for k, v in got(rep).items() if k[0].startswith(f + ":")})
        assert experts == exp, rep.summary(30)
        rest = got(rep) - experts
        assert all(s.startswith("transformers/") or s.startswith(THIS) for s, _ in rest), rest
        reps[n] = sum(rest.values())
    assert len(routing.hits) == 5 * c.model.config.num_hidden_layers  # one forward per new token
    assert reps[5] > reps[3]  # the loop syncs in every step (its stopping checks)


def test_focus_and_user_collapse():
    c = C.build("qwen3_moe", "eager", device=DEV)
    rep = audit(c.forward, warmup=0, profile=False, focus="user")
    assert {e.site.split(":")[0] for e in rep.events} == {"tests/third_party/corpus.py"}
    with pytest.raises(FocusError, match="no_such_pkg_zz"):
        audit(c.forward, warmup=0, profile=False, focus="no_such_pkg_zz")


def test_cli_focus(tmp_path, capsys):
    from lora_moe_lab.audit import main

    mod = tmp_path / "hf_target.py"
    mod.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        "from tests.third_party import corpus as C\n"
        f"c = C.build('mixtral', 'eager', device={DEV!r})\n"
        "def forward():\n    return c.forward()\n"
    )
    assert main([f"{mod}:forward", "--warmup", "0", "--focus", "transformers"]) == 0
    out = capsys.readouterr().out
    assert "transformers/models/mixtral/modeling_mixtral.py:" in out and "index0d" in out
    assert main([f"{mod}:forward", "--focus", "no_such_pkg_zz"]) == 2
    assert "FocusError" in capsys.readouterr().err
