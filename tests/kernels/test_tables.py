"""The tuned tables checked at load (kernels/table_checks.py) and the GPU each device follows (kernels/gpus.py): every
committed table validates; an option the code does not have, a value out of bounds, a file whose content is not what
its name says, a `follows` to a GPU without a table and a cycle of follows are TableErrors naming the file and the
entry; a GPU without tables takes the closest recorded GPU's (fake properties, on the CPU) and says so once."""
import dataclasses
import inspect
import json
import re
import shutil
import warnings
from pathlib import Path

import pytest

from lora_moe_lab.kernels import configs, fused_moe_lora_packed, gpus, plan_table, table_checks, tiles
from lora_moe_lab.kernels.table_checks import TableError

H100 = "NVIDIA H100 80GB HBM3"
HOPPER = gpus.DeviceProps("NVIDIA H100 PCIe", 9, 0, 114, 80.0)
AMPERE = gpus.DeviceProps("NVIDIA A100-SXM4-80GB", 8, 0, 108, 80.0)


def _clear():
    for f in (plan_table.load, tiles._tables_of, tiles._recorded, tiles._source, tiles._followed_in, gpus.registry,
              configs.rules):
        f.cache_clear()
    gpus._SAID.clear()


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """A copy of the committed tables that a test may edit, read in place of the package's."""
    for f in plan_table.TABLE_DIR.glob("*.json"):
        shutil.copy(f, tmp_path)
    for mod in (tiles, plan_table):
        monkeypatch.setattr(mod, "TABLE_DIR", tmp_path)
    monkeypatch.setattr(gpus, "GPUS_FILE", tmp_path / gpus.GPUS_FILE.name)
    monkeypatch.setattr(configs, "RULES_FILE", tmp_path / configs.RULES_FILE.name)
    monkeypatch.setattr(gpus, "_SAID", set())
    _clear()
    yield tmp_path
    _clear()


def _edit(folder, name, change):
    f = folder / name
    raw = json.loads(f.read_text())
    change(raw)
    f.write_text(json.dumps(raw))
    return f


def test_every_committed_table_validates():
    """Every tile table, every plan (through its follows), gpus.json, rules.json, and each recorded GPU has its
    properties."""
    files = tiles.table_files()
    assert {f.name for f in files} >= {f"{g}_E128_H2048_I{i}.json" for g in ("NVIDIA_H200", "NVIDIA_H100_80GB_HBM3")
                                       for i in (768, 192)}
    for f in files:  # the kernels study's recorder wrote the H200's, the tuner the others
        src = tiles.read(f)["source"]
        assert "record_kernels_base.py" in src or src.startswith("tuner (lora_moe_lab.instruments.recorders.tune)")
    for f in plan_table.TABLE_DIR.glob("lora_plan_*.json"):
        t, chain = plan_table._resolve(f)
        assert chain[-1] in plan_table.plan_gpus() and t.ops
    reg = gpus.registry()
    assert set(configs.rules()) == {"moe_block_m", "lora_block_m", "rule_gemm", "lora_tile", "lora_down_tile",
                                    "decode_tile"}
    assert tiles.recorded_gpus() | plan_table.plan_gpus() <= set(reg["gpus"])
    for gpu in reg["base_gemm"]:
        assert gpus.base_gemm_follows(gpu, tiles.recorded_gpus())[0] in tiles.recorded_gpus() | {gpus.RULE}


def test_no_committed_table_names_a_machines_path():
    """A table names files by their names (a tuner on another machine once wrote its checkout's absolute path)."""
    root = str(Path(plan_table.TABLE_DIR).resolve().parents[2])
    for f in plan_table.TABLE_DIR.glob("*.json"):
        text = f.read_text()
        assert root not in text and not re.search(r'"(/|[^"]*\(/)(work|root|tmp|home|opt)/', text), f.name


def test_the_bounds_name_the_codes_options():
    """The options a table may set are the launchers' own keywords: none the code lacks, none missed."""
    fields = {f.name for f in dataclasses.fields(configs.GemmConfig)} - {"even"}  # `even`: a measurement's switch
    assert set(table_checks.TILE) == fields == set(tiles.GEMM_KEYS + tiles.OPTIONAL_KEYS)
    kw = inspect.signature(fused_moe_lora_packed.lora_shrink_packed).parameters
    assert set(table_checks.SHRINK) <= {k for k, p in kw.items() if p.kind == p.KEYWORD_ONLY}
    assert set(table_checks.EXPAND) == fused_moe_lora_packed.EXPAND_OPTIONS


def _tile(**kw):
    return {"block_m": 16, "gate_up": dict(dict(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=2), **kw),
            "down": dict(block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=2)}


@pytest.mark.parametrize("tile,match", [
    (_tile(block_n=2 ** 62), "bucket 4 gate_up: tile block_n must be a power of two from 16 to 256, got 4611"),
    (_tile(block_k=48), "block_k must be a power of two"),
    (_tile(num_warps=64), "num_warps must be a power of two from 1 to 16"),
    (_tile(num_stages=0), "num_stages must be an int from 1 to 8"),
    (_tile(max_regs=4), "max_regs must be 0 \\(off\\) or an int from 24 to 255"),
    (_tile(swizzle=True), "tile: no option \\['swizzle'\\]"),
])
def test_tile_values_out_of_bounds_are_named(tile, match):
    raw = dict(gpu="G", num_experts=8, hidden=64, intermediate=32, buckets={"4": tile})
    with pytest.raises(TableError, match=match) as e:
        tiles.check_table(raw, "t.json")
    assert e.value.file == "t.json" and e.value.entry == "bucket 4 gate_up"


@pytest.mark.parametrize("change,entry,match", [
    (lambda r: r["ops"]["down"]["4096"].update(expand={"depth": 2 ** 62}), "down bucket 4096",
     "expand depth must be a power of two from 16 to 1024"),
    (lambda r: r["ops"]["down"]["8192"].update(shrink={"slot_windows": 1}), "down bucket 8192",
     "shrink: no option \\['slot_windows'\\]"),
    # the expand builds the studies tried (studies/kernels/tried/packed_switches.py): no plan takes them
    (lambda r: r["ops"]["down"]["4096"].update(expand={"early": True}), "down bucket 4096",
     "expand: no option \\['early'\\]"),
    (lambda r: r["options"]["W1S"]["options"].update(sub_m=24), "option set 'W1S'", "sub_m must be 0 \\(off\\)"),
    (lambda r: r["options"]["W1S"]["options"].update(x_keep=True), "option set 'W1S'", "are neither the shrink's"),
    (lambda r: r["ops"]["gate_up"]["128"].update(path="fused"), "gate_up bucket 128", "path must be one of"),
    (lambda r: r["shapes"]["H2048_I192"]["down"]["1024"]["expand"]["tile"].update(block_n=2 ** 62),
     "H2048_I192 down bucket 1024", "expand tile block_n must be a power of two"),
    (lambda r: r["decode"].update(max_pairs=2 ** 62), "decode", "decode.max_pairs must be an int from 0"),
    (lambda r: r.update(gpu="NVIDIA H100 80GB HBM3"), "gpu", "is not the one its name says"),
])
def test_plan_entries_the_code_lacks_are_named(tables, change, entry, match):
    f = _edit(tables, plan_table.file_name("NVIDIA H200"), change)
    with pytest.raises(TableError, match=match) as e:
        plan_table.load("NVIDIA H200")
    assert (e.value.file, e.value.entry) == (str(f), entry)


@pytest.mark.parametrize("change,entry,match", [
    (lambda r: r["lora_block_m"].update(steps=[[24, 16], [8, 32], [None, 64]]), "lora_block_m", "bounds must be ints"),
    (lambda r: r["moe_block_m"].update(steps=[[16, 48], [None, 128]]), "moe_block_m", "BLOCK_M must be 16, 32"),
    (lambda r: r["rule_gemm"]["tiles"][0].update(block_k=2 ** 62), "rule_gemm tile 0", "tile block_k must be"),
    (lambda r: r["rule_gemm"]["tiles"][-1].update(max_block_m=128), "rule_gemm", "the last one null"),
    (lambda r: r["lora_tile"]["rules"][0]["when"].update(min_blocks=3), "lora_tile rule 0", "when may test"),
    (lambda r: r["decode_tile"]["rules"][-1]["when"].update(min_K=1), "decode_tile rule 2", "must be empty"),
    (lambda r: r["lora_down_tile"]["rules"][1]["tile"].update(block_n=2 ** 62), "lora_down_tile rule 1",
     "tile block_n must be one of"),
    (lambda r: r["lora_tile"]["rules"][0]["tile"].update(prefetch=1, expand_stages=2), "lora_tile rule 0",
     "set one of them to 0"),
    (lambda r: r["lora_tile"]["rules"][2].pop("why"), "lora_tile rule 2", "when, tile and a why"),
    (lambda r: r["decode_tile"]["rules"][0]["tile"].update(split_n=4), "decode_tile rule 0", "tile takes"),
])
def test_rules_out_of_bounds_are_named(tables, change, entry, match):
    f = _edit(tables, "rules.json", change)
    with pytest.raises(TableError, match=match) as e:
        configs.rule_gemm_config(16)
    assert (e.value.file, e.value.entry) == (str(f), entry)


def test_a_tile_table_holding_another_shape_is_named(tables):
    """A file of the H200's qwen3 name holding its TP=4 shard's table would hide qwen3's tiles: refused by name."""
    tp4 = tables / "NVIDIA_H200_E128_H2048_I192.json"
    shutil.copy(tp4, tables / "NVIDIA_H200_E128_H2048_I768.json")
    with pytest.raises(TableError, match="holds the table of 'NVIDIA H200' E128 H2048 I192") as e:
        tiles.lookup(128, 2048, 768, 16, gpu="NVIDIA H200")
    assert e.value.file.endswith("NVIDIA_H200_E128_H2048_I768.json")
    _edit(tables, tp4.name, lambda r: r.update(gpu="NVIDIA H100 80GB HBM3"))  # a file whose gpu is not its name's
    with pytest.raises(TableError, match="not the one its name says"):
        tiles.recorded_gpus()


def test_follows_to_a_gpu_without_a_plan_and_cycles_are_named(tables):
    """Once a RecursionError: now the file and its `follows`."""
    f = _edit(tables, plan_table.DEFAULT_FILE, lambda r: r.update(follows="NVIDIA B200"))
    with pytest.raises(TableError, match="follows 'NVIDIA B200', which has no plan file") as e:
        plan_table.load(None)
    assert (e.value.file, e.value.entry) == (str(f), "follows")
    _edit(tables, plan_table.DEFAULT_FILE, lambda r: r.update(follows=H100))
    (tables / plan_table.file_name(H100)).write_text(json.dumps({"gpu": H100, "follows": "default"}))
    plan_table.load.cache_clear()
    with pytest.raises(TableError, match=f"a cycle of follows: default -> {H100} -> default"):
        plan_table.load(None)
    with pytest.raises(TableError, match=f"a cycle of follows: {H100} -> default -> {H100}"):
        plan_table.load(H100)


def test_base_gemm_follows_are_checked(tables):
    def base(entries):
        return lambda r: r.update(base_gemm={k: {"follows": v, "why": "t"} for k, v in entries.items()})

    g = HOPPER.name  # a GPU without tables of its own
    _edit(tables, "gpus.json", base({g: "NVIDIA B200"}))
    with pytest.raises(TableError, match="follows 'NVIDIA B200', which has no tile table") as e:
        tiles.source(g)
    assert e.value.entry == f"base_gemm {g!r}"
    _clear()
    _edit(tables, "gpus.json", base({g: "G1", "G1": g}))
    with pytest.raises(TableError, match=f"a cycle of follows: {g} -> G1 -> {g}"):
        tiles.source(g)
    _clear()
    _edit(tables, "gpus.json", lambda r: r["gpus"]["NVIDIA H200"].update(sms="many"))
    with pytest.raises(TableError, match="gpus 'NVIDIA H200'"):
        tiles.source(g)


def test_a_gpu_without_tables_follows_the_closest_and_says_so_once(tables, monkeypatch):
    """By architecture first (the base GEMM only within it), then minor, family, SMs and memory."""
    assert gpus.closest(HOPPER, {"NVIDIA H200"}, same_arch=True)[0] == "NVIDIA H200"
    assert gpus.closest(HOPPER, {"NVIDIA H200", H100}, same_arch=True)[0] == H100  # 80 GiB, as the PCIe card
    assert gpus.closest(AMPERE, {"NVIDIA H200"}, same_arch=True)[0] is None
    assert gpus.closest(AMPERE, {"NVIDIA H200"}, same_arch=False)[0] == "NVIDIA H200"
    assert configs.base_gemm_source("NVIDIA H200") == ("NVIDIA H200", "its own tile tables")
    with pytest.warns(gpus.TableFollowed, match="NVIDIA H100 PCIe has no tile table of its own: it takes the tile "
                                                f"table of {H100} \\(closest recorded GPU: same architecture"):
        assert configs.base_gemm_source(HOPPER.name, HOPPER)[0] == H100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        configs.base_gemm_source(HOPPER.name, HOPPER)
    with pytest.warns(gpus.TableFollowed, match="takes the rule tiles \\(no recorded GPU has its architecture"):
        assert configs.base_gemm_source(AMPERE.name, AMPERE)[0] == gpus.RULE
    with pytest.warns(gpus.TableFollowed, match=f"{AMPERE.name} has no LoRA plan of its own: it takes the LoRA "
                                                f"plan of {H100}"):  # another architecture: the closest by memory
        assert plan_table.load(AMPERE.name, AMPERE).ops == plan_table.load(H100).ops
    with pytest.warns(gpus.TableFollowed, match="Some GPU has no LoRA plan .* the default plan"):
        assert plan_table.load("Some GPU").ops == plan_table.load("NVIDIA H200").ops
    assert configs.base_gemm_source(None)[0] == gpus.RULE


def test_the_h100_reads_its_own_tables_and_an_entry_speaks_only_for_a_gpu_without_them(tables, monkeypatch):
    """The H100 has the tuner's tables: its base GEMM, its LoRA rules and its plan are its own, and a gpus.json
    base_gemm entry cannot move it (an entry speaks for a GPU without tables: with its tables gone, it follows the
    entry to the rule tiles)."""
    monkeypatch.setattr(configs.runtime, "interpreter", lambda: False)
    monkeypatch.setattr(tiles, "gpu_name", lambda: H100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own: nothing to say
        assert configs.base_gemm_source(H100) == (H100, "its own tile tables")
        bm = configs.moe_block_m(8192, 8, 128, 2048, 768)
        own = tiles.lookup(128, 2048, 768, 8192, gpu=H100)["gate_up"]
        assert tiles.gemm_tile(128, 1536, 2048, 8192, bm) == own
        assert plan_table.load(H100).gpu == H100
    _edit(tables, "gpus.json", lambda r: r["base_gemm"].update({H100: {"follows": "rule", "why": "t"}}))
    _clear()
    assert configs.base_gemm_source(H100)[0] == H100
    for f in tables.glob(H100.replace(" ", "_") + "_E*.json"):
        f.unlink()
    _clear()
    with pytest.warns(gpus.TableFollowed, match="takes the rule tiles \\(gpus.json base_gemm entry"):
        assert configs.base_gemm_source(H100)[0] == gpus.RULE
        assert configs.gemm_config(8192, 128, 1536, 2048, 128) == configs.rule_gemm_config(128)


def test_the_lora_tiles_follow_the_rules_read_again(tables, monkeypatch):
    """The LoRA tiles are worked out once per arguments (configs._memo), and again once rules.json is read again: a
    rule changed on disk is the tile the next launch takes, never the one kept from before."""
    monkeypatch.setattr(configs.runtime, "interpreter", lambda: False)
    args = (1024, 8, 128, 4, 16, 1536, 2048)  # BLOCK_M 16 at 16 pairs per group: lora_tile's rule 4
    assert configs.lora_config(*args).expand_stages == 4
    assert configs.lora_config(*args) is configs.lora_config(*args)  # kept
    _edit(tables, "rules.json", lambda r: r["lora_tile"]["rules"][4]["tile"].update(expand_stages=2))
    _clear()
    assert configs.lora_config(*args).expand_stages == 2
