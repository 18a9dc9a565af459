"""The replay study's recordings, read (the files are the catalog's, data/catalog.json).

    validation()           # the held-out points and host factors (catalog "replay.validation")
    simulator_vs_replay()  # the queue simulator beside the replay (catalog "replay.simulator_vs_replay")
"""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import catalog


def validation() -> pd.DataFrame:
    return schemas.read_csv(catalog("replay.validation"), "replay_validation", dtype={"config": str})


def simulator_vs_replay() -> pd.DataFrame:
    return schemas.read_csv(catalog("replay.simulator_vs_replay"), "replay_vs_simulator", dtype={"config": str})
