"""The TP emulation's recordings, read: the files are the catalog's (data/catalog.json), the method the
library's (`lora_moe_lab.sim.tp_emulation`).

    sessions()                   # label -> Session (catalog "tp_emulation.sessions")
    validation(), prediction()   # what studies/tp_emulation/record.py --summarize wrote
"""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.instruments.analysers.production_runs import Session
from lora_moe_lab.provenance import catalog
from lora_moe_lab.sim import tp_emulation as E


def sessions() -> dict[str, Session]:
    return E.load_sessions(catalog("tp_emulation.sessions"))


def validation() -> pd.DataFrame:
    """TP=2 emulated vs measured, as summarized (recompute: E.tp2_validation(sessions()))."""
    return schemas.read_csv(catalog("tp_emulation.folder") / "validation.csv", "tp_validation")


def prediction() -> pd.DataFrame:
    """The fix at TP=4, as summarized (recompute: E.tp4_prediction(sessions()))."""
    return schemas.read_csv(catalog("tp_emulation.folder") / "prediction.csv", "tp_prediction")
