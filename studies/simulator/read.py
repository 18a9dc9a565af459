"""The simulator study's calibration, read: the folder is the catalog's (data/catalog.json), the loader the
library's (`lora_moe_lab.sim.load_calibration`).

    calibration()   # the fit, its held-out validation and the production extrapolation (catalog "simulator")
"""
from __future__ import annotations

from lora_moe_lab import sim
from lora_moe_lab.provenance import catalog


def calibration() -> sim.Calibration:
    return sim.load_calibration(catalog("simulator"))
