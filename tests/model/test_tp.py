"""Tensor parallelism: weight slices of the same seeded full weights, TP=2 (two gloo processes
launched by torchrun on CPU) equal to TP=1, per-rank sync counts, and named errors."""
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, fp32_tol, rel_err

from lora_moe_lab.config import PRESETS, get_shape
from lora_moe_lab.model.attention import Attention
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.moe import MoELayer
from lora_moe_lab.model.tp import TPGroup, check_world, init_tp, tp_shape

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
import _tp_worker  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes; threads only spin-wait on a loaded machine
    yield
    torch.set_num_threads(n)


def _gen():
    return torch.Generator().manual_seed(11)


def test_rank_weights_are_slices_of_the_full_weights():
    full, half = get_shape("tiny"), tp_shape(get_shape("tiny"), 2)
    I, D = half.intermediate, half.head_dim
    m = MoELayer(full, torch.float32, "cpu", _gen())
    a = Attention(full, torch.float32, "cpu", _gen())
    for r in range(2):
        mr = MoELayer(half, torch.float32, "cpu", _gen(), tp_rank=r, tp_size=2)
        gate, up = m.w13[:, r * I:(r + 1) * I], m.w13[:, 2 * I + r * I:2 * I + (r + 1) * I]
        assert torch.equal(mr.w13, torch.cat([gate, up], 1))
        assert torch.equal(mr.w2, m.w2[:, :, r * I:(r + 1) * I]) and torch.equal(mr.router_w, m.router_w)
        ar = Attention(half, torch.float32, "cpu", _gen(), tp_rank=r, tp_size=2)
        H, KV = half.num_heads * D, half.num_kv_heads * D  # rows per rank
        q, k, v = a.qkv_w.split([2 * H, 2 * KV, 2 * KV])
        want = torch.cat([q[r * H:(r + 1) * H], k[r * KV:(r + 1) * KV], v[r * KV:(r + 1) * KV]])
        assert torch.equal(ar.qkv_w, want) and torch.equal(ar.o_w, a.o_w[:, r * H:(r + 1) * H])


def test_adapter_slices_match_the_full_adapter():
    full = build_decoder_lab("tiny", num_layers=1, backend="torch", device="cpu")
    full.pool.load("a", rank=4)
    I = full.shape.intermediate // 2
    w = full.pool.layers[0]
    for r in range(2):
        # a group object that was never initialised: only rank and size are read to build
        lab = build_decoder_lab("tiny", num_layers=1, backend="torch", device="cpu", tp=TPGroup(rank=r, size=2))
        lab.pool.load("a", rank=4)
        wr = lab.pool.layers[0]
        assert torch.equal(wr.gate_up_a, w.gate_up_a) and torch.equal(wr.down_b, w.down_b)
        assert torch.equal(wr.gate_up_b, w.gate_up_b[:, :, :, r * I:(r + 1) * I])
        assert torch.equal(wr.down_a, w.down_a[..., r * I:(r + 1) * I])


def test_tp4_of_qwen3_is_the_tp4_preset():
    assert tp_shape(PRESETS["qwen3-30b-a3b"], 4) == PRESETS["qwen3-30b-a3b-tp4"]


def test_tp2_with_gloo_equals_tp1(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(HERE, "_tp_worker.py"), str(tmp_path), "2.5"]
    # --standalone picks a free port; the timeout stops a hung rank from hanging the test run
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    lab = build_decoder_lab("tiny", backend="torch", dtype="float32", device="cpu", guard_sites=2.5)
    lab.pool.load("a", rank=8)
    lab.pool.load("b", rank=4)
    for b, (adapters, counts) in enumerate(_tp_worker.BATCHES):
        batch, tensors = lab.make_batch(adapters, counts)
        want = lab.model(lab.random_input(batch.num_tokens, seed=b), batch, tensors)
        for res in ranks:
            assert res["size"] == 2 and res["intermediate"] == lab.shape.intermediate // 2
            for g in ("sync", "cpu_flag", "launch_always"):
                assert rel_err(res["outs"][b, g], want) < fp32_tol("cpu")
                assert torch.equal(res["outs"][b, g], ranks[0]["outs"][b, "cpu_flag"])
                # each rank runs its own guard: 2.5 sites a layer x 2 layers, on every rank
                assert res["syncs"][b, g] == (5 if g == "sync" else 0)


@pytest.mark.parametrize("shape,size,msg", [
    (get_shape("tiny"), 3, "num_heads=4 is not divisible by the tp size 3"),
    (get_shape("tiny"), 4, "num_kv_heads=2 is not divisible by the tp size 4"),
    (get_shape("tiny", intermediate=30), 4, "num_kv_heads=2 is not divisible"),  # kv heads fail first
    (get_shape("tiny", intermediate=30, num_heads=4, num_kv_heads=4), 4, "intermediate=30 is not divisible"),
])
def test_shapes_that_do_not_split_are_named(shape, size, msg):
    with pytest.raises(ValueError, match=msg or "not divisible"):
        tp_shape(shape, size)
    with pytest.raises(ValueError, match=msg or "not divisible"):
        build_decoder_lab(shape, tp=TPGroup(size=size))


def test_launch_errors_are_named(monkeypatch):
    assert check_world(2, 2, "cpu", 0, False) == "gloo"
    assert check_world(4, 4, "cuda", 8, True) == "nccl"
    with pytest.raises(ValueError, match="4 ranks on this host but only 2 GPU"):
        check_world(4, 4, "cuda", 2, True)
    with pytest.raises(RuntimeError, match="no NCCL backend"):
        check_world(2, 2, "cuda", 2, False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="RANK is not set: launch with torchrun"):
        init_tp(device="cpu")
    with pytest.raises(RuntimeError, match="tp rank 1/2: all_reduce failed"):
        TPGroup(rank=1, size=2).all_reduce(torch.zeros(2))  # no process group was initialised
