"""The LoRA kernels' tiles as a GPU gets them (kernels/configs.py, from tile_tables/rules.json), held to the choices
recorded at the commit before their rules moved into data (tests/fixtures/lora_tiles_golden.py): 11040 inputs,
every field equal."""
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import lora_tiles_golden as G  # noqa: E402


def test_every_tile_is_the_one_recorded():
    with gzip.open(G.FILE, "rt") as f:
        want = json.load(f)
    got = G.compute()
    assert set(got) == set(want)
    diff = [k for k in want if got[k] != want[k]]
    assert not diff, f"{len(diff)} tiles differ, e.g. {diff[0]}: {got[diff[0]]} != {want[diff[0]]}"
