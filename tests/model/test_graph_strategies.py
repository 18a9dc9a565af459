"""The three LoRA-under-graphs strategies: selection, padding and compaction on the host (any
machine, eager), and on a GPU capture + replay after adapter switches, bit for bit against the
eager run of the same graph."""
import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab import runtime
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.graph_strategies import (STRATEGIES, GraphSet, NoGraphFits, buckets, graph_keys,
                                                 pick_rows)
from lora_moe_lab.model.lab import build_lab

gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# adapter switches: none -> one -> all -> half -> none (per request; 4 requests, 3 slots)
SWITCHES = [[None] * 4, ["a", None, None, "a"], ["a", "b", "c", "a"], [None, "b", None, "c"], [None] * 4]


def _lab(kind="moe", device="cpu", backend="auto"):
    build = build_lab if kind == "moe" else build_decoder_lab
    lab = build("tiny", num_layers=2, max_loras=3, max_rank=8, dtype="float32", device=device,
                backend=backend, seed=1)
    for i, n in enumerate("abc"):
        lab.pool.load(n, rank=8 - 2 * i)
    return lab


def test_keys_buckets_and_picks():
    assert buckets(4) == [1, 2, 4] and buckets(3) == [1, 2, 3] and buckets(1) == [1]
    assert graph_keys("one_graph", 4) == [4]
    assert graph_keys("lora_split", 4) == [0, 4]
    assert graph_keys("per_active_count", 4) == [0, 1, 2, 4]
    assert [pick_rows("per_active_count", n, 4) for n in range(5)] == [0, 1, 2, 4, 4]
    assert [pick_rows("lora_split", n, 4) for n in range(3)] == [0, 4, 4]
    assert [pick_rows("one_graph", n, 4) for n in range(3)] == [4, 4, 4]


@pytest.mark.parametrize("kind", ["moe", "decoder"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_computes_the_eager_forward(kind, strategy):
    lab = _lab(kind)
    gs = GraphSet(lab, strategy, sizes=[2, 6], tokens_per_request=2)
    for i, adapters in enumerate(SWITCHES):
        counts = [2] * len(adapters)
        x = lab.random_input(sum(counts), seed=i)
        y = gs(x, adapters, counts)
        batch, tensors = lab.make_batch(adapters, counts)
        want = lab.model(x, batch, tensors, guard="cpu_flag")
        assert y.shape == want.shape
        assert rel_err(y, want) < fp32_tol("cpu"), (strategy, adapters)
    used = {(g.size, g.rows) for g in gs.graphs.values() if g.replays}
    assert {s for s, _ in used} == {6}  # 4 requests padded to the 6-request graph
    if strategy == "per_active_count":
        assert {r for _, r in used} == {0, 1, 2, 3}  # none, one, three ("c" too), two adapters
    if strategy == "lora_split":
        assert {r for _, r in used} == {0, 3}


def test_compacted_batch_rows():
    lab = _lab()
    gs = GraphSet(lab, "per_active_count", sizes=[4])
    g, ad, counts = gs.pick([None, "c"], [1, 1])
    assert (g.size, g.rows) == (4, 1) and ad == [None, "c", None, None] and counts == [1] * 4
    b = gs._batch(ad, counts, g.rows)
    assert b.lora_ids == [2] and b.adapter_enabled == [1] and b.req_slots == [-1, 0, -1, -1]


def test_batches_no_graph_fits_get_named_errors():
    lab = _lab()
    gs = GraphSet(lab, "lora_split", sizes=[1, 2])
    x = lab.random_input(3)
    with pytest.raises(NoGraphFits, match="batch of 3 requests fits no captured graph .largest: 2"):
        gs(x, [None, "a", None], [1, 1, 1])
    with pytest.raises(NoGraphFits, match="requests of 1 token"):
        gs(x, [None, "a"], [1, 2])
    with pytest.raises(KeyError, match="unknown adapter 'zz'"):
        gs(lab.random_input(1), ["zz"], [1])
    with pytest.raises(TypeError, match="the graphs take torch.float32"):
        gs(lab.random_input(1).double(), ["a"], [1])
    eager = GraphSet(lab, "lora_split", sizes=[1, 2], fallback="eager")
    batch, tensors = lab.make_batch([None, "a", None], [1, 1, 1])
    assert torch.equal(eager(x, [None, "a", None], [1, 1, 1]), lab.model(x, batch, tensors))
    assert eager.eager_fallbacks == 1


@pytest.mark.parametrize("bad,match", [
    (dict(strategy="per_adapter"), "unknown graph strategy 'per_adapter'"),
    (dict(sizes=[]), "sizes must be"), (dict(sizes=[0]), "sizes must be"),
    (dict(tokens_per_request=0), "tokens_per_request"), (dict(fallback="retry"), "fallback"),
])
def test_bad_arguments(bad, match):
    kw = dict(strategy="one_graph", sizes=[1]) | bad
    with pytest.raises(ValueError, match=match):
        GraphSet(_lab(), **kw)


def test_capture_without_a_gpu_is_a_clear_error():
    if runtime.has_cuda():
        pytest.skip("has a GPU")
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA GPU"):
        GraphSet(_lab(), "one_graph", sizes=[1]).capture()


@gpu_only
@pytest.mark.parametrize("kind", ["moe", "decoder"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replay_after_adapter_switches_is_the_eager_graph_bit_for_bit(kind, strategy, sync_check):
    lab = _lab(kind, device="cuda", backend="triton")
    gs = GraphSet(lab, strategy, sizes=[4, 8]).capture()
    # the pool's own bytes (the global reserved delta may be negative: under memory pressure, with other test
    # processes on the card, the allocator frees cached blocks of other pools during the capture)
    assert gs.capture_s > 0 and set(gs.memory) >= {"allocated", "reserved"}
    if "pool_segments" in gs.memory:
        assert gs.memory["pool_segments"] >= gs.memory["pool_allocated"] > 0
    for i, adapters in enumerate(SWITCHES):
        x = lab.random_input(len(adapters), seed=i)
        with sync_check():  # choosing, loading and replaying a graph never waits for the GPU
            y = gs(x, adapters, [1] * len(adapters))
        y = y.clone()
        g, *_ = gs.pick(adapters, [1] * len(adapters))
        assert torch.equal(y, gs.eager(g, len(adapters))), (strategy, adapters)
        batch, tensors = lab.make_batch(adapters, [1] * len(adapters))
        assert rel_err(y, lab.model(x, batch, tensors)) < fp32_tol("cuda")


def test_the_strategies_are_a_registry_and_no_name_means_two_things():
    from lora_moe_lab.model import graph_strategies as GS
    from lora_moe_lab.model.guards import guard_names

    assert GS.strategy_names() == STRATEGIES == ("one_graph", "per_active_count", "lora_split")
    assert not set(STRATEGIES) & set(guard_names())  # a strategy is never also a guard
    with pytest.raises(ValueError, match="renamed 'one_graph'"):
        GS.check_strategy("launch_always")
    with pytest.raises(TypeError, match="GraphStrategy subclass"):
        GS.register_strategy(object)

    @GS.register_strategy
    class Always(GS.OneGraph):
        name = "test_always_one"

    try:
        assert GS.pick_rows("test_always_one", 0, 4) == 4 and "test_always_one" in GS.strategy_names()
        with pytest.raises(ValueError, match="already registered"):
            GS.register_strategy(type("Other", (GS.OneGraph,), {"name": "test_always_one"}))
    finally:
        GS._REGISTRY.pop("test_always_one")


def test_graph_forward_keeps_what_its_callable_closes_over(monkeypatch):
    """A graph reads device addresses, not tensors: GraphForward must keep `fn` (and so every tensor it
    closes over) alive, or the allocator reuses that memory and a replay reads someone else's data."""
    import gc
    import weakref

    from lora_moe_lab.model import graphs

    monkeypatch.setattr(graphs, "capture", lambda fn, warmup: (object(), fn()))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def make():
        meta = torch.arange(8)
        return weakref.ref(meta), graphs.GraphForward(lambda: meta + 1)

    ref, g = make()
    gc.collect()
    assert ref() is not None, "GraphForward dropped its callable: the captured graph would read freed memory"
    del g
    gc.collect()
    assert ref() is None


@gpu_only
def test_graph_forward_replays_after_its_callable_goes_out_of_scope():
    """On a GPU: the metadata a graph reads is created inside a helper and nothing but the closure holds
    it; fresh allocations after capture must not change what the replay computes."""
    from lora_moe_lab.model.graphs import GraphForward

    def make():
        ids = torch.arange(4096, device="cuda")
        return GraphForward(lambda: ids * 2)

    g = make()
    junk = [torch.full((4096,), -7, dtype=torch.int64, device="cuda") for _ in range(16)]
    assert torch.equal(g.replay(), torch.arange(4096, device="cuda") * 2), "the replay read reused memory"
    del junk
