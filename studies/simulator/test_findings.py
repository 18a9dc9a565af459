"""The simulator's calibration as recorded: fitted on a guards recording still in data/ (the archived one, its
record.py's default), and sim/tp.py reads the same fit."""
import pytest

from lora_moe_lab import sim
from lora_moe_lab.provenance import DATA, catalog
from lora_moe_lab.sim.tp import fitted_params
from studies.simulator import read


def test_the_calibration_names_the_recording_it_was_fitted_on():
    cal = read.calibration()
    assert DATA / cal.recording["file"] == catalog("guards.archived") and "H200" in cal.label
    assert cal.params == sim.load_calibration().params == fitted_params()
    assert cal.headline()["syncs_per_forward"] == pytest.approx(48)
