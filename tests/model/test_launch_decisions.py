"""Every guard's launch decision, counted at the seam: the LoRA hook points `after_gate_up` and `after_down`
(model/moe.py: LoRAHook), where a layer's LoRA work runs. Outputs cannot tell the guards apart (they are equal by
design), so the tests count the hook calls per forward and assert the design (model/guards.py):

    eager     sync and cpu_flag launch only when some request with tokens uses an enabled adapter;
              launch_always launches in every layer whatever the batch
    capture   every guard launches in every layer (the host cannot know the adapters of the batches the
              graph will replay: the kernels' early exit decides then), and `sync` asks the device nothing

Capture mode is the host flag `runtime.capture_mode()` (what `graphs.capture` sets around a real CUDA graph), so
these run on a CPU; on a GPU (the GPU check) the same tests run on the Triton backend.
"""
import pytest

from lora_moe_lab import runtime
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.guards import count_guard_syncs, guard_names
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.moe import LoRAHook

LAYERS = 2
GUARDS = ("sync", "cpu_flag", "launch_always")
# (requests' adapters, tokens each): what the batch holds
BATCHES = {
    "active": (["a", "b"], [3, 2]),
    "mixed": (["a", None], [3, 2]),
    "inactive": ([None, None], [3, 2]),
    "zero_token_adapter": (["a", None], [0, 5]),  # the adapter's only request has no token: nothing is active
}
ACTIVE = {"active": True, "mixed": True, "inactive": False, "zero_token_adapter": False}


def expected_launches(guard: str, active: bool, capture: bool) -> int:
    """The design, per forward: one launch per layer, or none."""
    launch = capture or guard == "launch_always" or active
    return LAYERS if launch else 0


@pytest.fixture
def seam(monkeypatch):
    """Counts the calls of each hook point during a forward."""
    calls = {"after_gate_up": 0, "after_down": 0}
    for name in calls:
        orig = getattr(LoRAHook, name)

        def spy(self, *a, _orig=orig, _name=name, **k):
            calls[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(LoRAHook, name, spy)
    return calls


def _lab(kind: str):
    lab = (build_lab("tiny", num_layers=LAYERS) if kind == "moe"
           else build_decoder_lab("tiny", num_layers=LAYERS, guard_sites=1.5))
    lab.pool.load("a", rank=4)
    lab.pool.load("b", rank=8)
    return lab


@pytest.fixture(scope="module")
def labs():
    return {k: _lab(k) for k in ("moe", "decoder")}


def _run(lab, batch_name, guard, capture, seam):
    adapters, counts = BATCHES[batch_name]
    batch, tensors = lab.make_batch(adapters, counts)
    x = lab.random_input(sum(counts), seed=len(adapters))
    for k in seam:
        seam[k] = 0
    with runtime.capture_mode(capture), count_guard_syncs() as syncs:
        y = lab.model(x, batch, tensors, guard=guard)
    assert y.shape == x.shape
    return dict(seam), syncs.count


def test_the_builtin_guards_are_the_ones_asserted():
    assert set(GUARDS) <= set(guard_names())


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "capture"])
@pytest.mark.parametrize("batch_name", list(BATCHES))
@pytest.mark.parametrize("guard", GUARDS)
def test_launches_per_guard_batch_and_mode(labs, seam, guard, batch_name, capture):
    n = expected_launches(guard, ACTIVE[batch_name], capture)
    got, syncs = _run(labs["moe"], batch_name, guard, capture, seam)
    assert got == {"after_gate_up": n, "after_down": n}, (guard, batch_name, capture)
    # `sync` asks the device once per layer in eager mode (a host-device sync), never under capture
    assert syncs == (LAYERS if guard == "sync" and not capture else 0)


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "capture"])
@pytest.mark.parametrize("guard", GUARDS)
def test_decoder_launches_follow_the_same_rule(labs, seam, guard, capture):
    """The decoder asks at several sites per layer (guard_sites 1.5: 3 sites over 2 layers); the first decides."""
    for batch_name in ("mixed", "inactive"):
        n = expected_launches(guard, ACTIVE[batch_name], capture)
        got, syncs = _run(labs["decoder"], batch_name, guard, capture, seam)
        assert got == {"after_gate_up": n, "after_down": n}, (guard, batch_name, capture)
        assert syncs == (3 if guard == "sync" and not capture else 0)


def test_rank_zero_pool_launches_only_under_capture(seam):
    """No adapter loaded: rank 0 is a host fact and no guard launches in eager mode; under capture the graph must
    hold the kernels for adapters loaded later (the pool's max rank), so every guard launches."""
    lab = build_lab("tiny", num_layers=LAYERS)
    for guard in GUARDS:
        for capture in (False, True):
            got, _ = _run(lab, "inactive", guard, capture, seam)
            n = LAYERS if capture else 0
            assert got == {"after_gate_up": n, "after_down": n}, (guard, capture)


def test_debug_check_catches_a_host_flag_that_lies(labs, monkeypatch):
    """With `debug_check` the host-flag guards compare `has_active_lora` with the device (a sync, debug only): a batch
    whose flag says inactive while an adapter is in use is an error, not a silently dropped delta."""
    lab = labs["moe"]
    monkeypatch.setattr(lab.model, "debug_check", True)
    batch, tensors = lab.make_batch(["a", None], [3, 2])
    x = lab.random_input(5)
    lab.model(x, batch, tensors, guard="cpu_flag")  # the flag is right: passes
    batch.has_active_lora = False
    for guard in ("cpu_flag", "launch_always"):
        with pytest.raises(AssertionError, match="has_active_lora=False but the device says an adapter is active"):
            lab.model(x, batch, tensors, guard=guard)
