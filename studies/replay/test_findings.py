"""The replay study as recorded: the what-if bench reads the same validation, and the simulator's comparison
says `agrees` exactly where the two are within the bench's tolerance."""
import csv

import pandas as pd

from lora_moe_lab.provenance import DATA
from lora_moe_lab.sim import whatif as W
from studies.replay import read
from helpers import catalog_naming


def test_the_bench_reads_the_recorded_validation(monkeypatch, tmp_path):
    v = W.validation()
    with open(DATA / "replay" / "validation.csv") as f:
        assert len(v) == sum(1 for _ in csv.reader(f)) - 1  # every data row of the recorded file
    part = tmp_path / "validation.csv"
    v.iloc[::2].to_csv(part, index=False)  # another file: the bench follows the catalog to it
    catalog_naming(monkeypatch, tmp_path, replay__validation=part)
    w = W.validation.__wrapped__()  # the read itself (the bench keeps the recorded one cached)
    assert len(w) == len(v.iloc[::2]) < len(v)
    pd.testing.assert_frame_equal(w, v.iloc[::2].reset_index(drop=True), check_dtype=False)


def test_recorded_simulator_vs_replay():
    d = read.simulator_vs_replay()
    cmp_ = d[d["simulator_ms"].notna()]
    assert len(cmp_) and (cmp_["agrees"] == (cmp_["sim_vs_replay_pct"].abs() <= 100 * W.TOL)).all()
    assert not d.loc[d["simulator_ms"].isna(), "agrees"].any()
