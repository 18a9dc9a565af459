"""The tuned tile tables (kernels/tiles.py): a lookup falls back to the rules where no table applies, and a malformed
table is an error naming the file and bucket (every committed table: tests/kernels/test_tables.py)."""
import pytest

from lora_moe_lab.kernels import configs, tiles


def test_entry_takes_the_largest_swept_bucket_below():
    t = {"buckets": {"1": "one", "16": "sixteen", "1024": "k"}}
    assert tiles._entry(t, 1) == "one" and tiles._entry(t, 8) == "one" and tiles._entry(t, 512) == "sixteen"
    assert tiles._entry(t, 16384) == "k"


def test_lookup_falls_back_to_the_rules(monkeypatch):
    monkeypatch.setattr(tiles, "gpu_name", lambda: "NVIDIA H200")
    assert tiles.lookup(128, None, None, 16) is None  # no layer shape given: the rules decide
    assert tiles.lookup(64, 2048, 768, 16) is None  # no file for 64 experts
    e = tiles.lookup(128, 2048, 768, 8192)
    assert e["block_m"] in (16, 32, 64, 128)
    tile = tiles.gemm_tile(128, 1536, 2048, 8192, e["block_m"])  # gate_up of qwen3-30b-a3b
    assert tile == e["gate_up"]
    assert tiles.gemm_tile(128, 1536, 2048, 8192, 999) is None  # another alignment's BLOCK_M: the rules
    monkeypatch.setattr(tiles, "gpu_name", lambda: "Some Other GPU")
    assert tiles.lookup(128, 2048, 768, 8192) is None
    assert tiles.gemm_tile(128, 1536, 2048, 8192, 128) is None


def test_configs_use_the_rules_without_a_table(monkeypatch):
    monkeypatch.setattr(configs.runtime, "interpreter", lambda: False)
    monkeypatch.setattr(tiles, "gpu_name", lambda: None)  # a CPU machine: no GPU name, no table
    assert configs.moe_block_m(8192, 8, 128, 2048, 768) == configs.rule_block_m(8192, 8, 128)
    assert configs.gemm_config(8192, 128, 1536, 2048, 128) == configs.rule_gemm_config(128)


@pytest.mark.parametrize("bad,match", [
    ({}, "missing key 'gpu'"),
    ({"buckets": {"3": {}}}, "not a power of two"),
    ({"buckets": {"4": {"block_m": 48}}}, "block_m must be"),
    ({"buckets": {"4": {"block_m": 16, "gate_up": {"block_n": 64}}}}, "bucket 4 gate_up: must hold"),
    ({"buckets": {"4": {"block_m": 16, "gate_up": dict(block_n=64, block_k=0, group_m=1, num_warps=4, num_stages=2),
                        "down": {}}}}, "block_k must be a power of two from 16 to 256, got 0"),
    ({"buckets": {"4": {"block_m": 16, "gate_up": dict(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=2,
                                                       persistent=-1), "down": {}}}}, "persistent must be an int"),
    ({"buckets": {"4": {"block_m": 16, "gate_up": dict(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=2,
                                                       flatten=1), "down": {}}}}, "flatten must be true or false"),
    ({"buckets": {"4": {"block_m": 32, "gate_up": dict(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=2,
                                                       sub_m=64), "down": {}}}}, "sub_m .* must divide block_m=32"),
])
def test_malformed_tables_are_named_errors(bad, match):
    base = dict(gpu="G", num_experts=8, hidden=64, intermediate=32, buckets={"1": {}})
    base.update(bad)
    if not bad:
        base.pop("gpu")
    with pytest.raises(ValueError, match=match):
        tiles.check_table(base, "t.json")
