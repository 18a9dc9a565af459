"""The replay study's recordings, read (the files are the catalog's, data/catalog.json).

    validation()           # the held-out points and host factors (catalog "replay.validation")
    simulator_vs_replay()  # the queue simulator beside the replay (catalog "replay.simulator_vs_replay")
"""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.provenance import catalog


def validation() -> pd.DataFrame:
    return pd.read_csv(catalog("replay.validation"), dtype={"config": str})


def simulator_vs_replay() -> pd.DataFrame:
    return pd.read_csv(catalog("replay.simulator_vs_replay"), dtype={"config": str})
