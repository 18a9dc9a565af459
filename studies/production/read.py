"""The production study's recordings, read: the files are the catalog's (data/catalog.json), the loader and
its combination rule the library's (`lora_moe_lab.instruments.analysers.production_runs`).

    sessions()        # label -> Session: every signature session (catalog "production.sessions")
    tp2_summaries()   # guard sites -> the TP=2 summary measured on two GPUs (catalog "production.tp2_summaries")
"""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.analysers import production_runs as PR
from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import catalog
from lora_moe_lab.sim import tp_emulation as E


def sessions() -> dict[str, PR.Session]:
    """The recorded signature sessions of studies/production/record.py, oldest first."""
    return PR.load_sessions(catalog("production.sessions"))


def tp2_summaries() -> dict[str, pd.DataFrame]:
    """The TP=2 measurements of studies/production/record_tp.py, per guard-site count (as the emulation's check)."""
    return {gs: schemas.read_csv(p, "prefill_summary")
            for gs, p in E.tp2_measured(catalog("production.tp2_summaries")).items()}
