"""The hidden-sync study's recordings, read: the files are the catalog's (data/catalog.json), the pooling over
sessions the library's (`lora_moe_lab.instruments.analysers.hidden_sync_runs`).

    recorded()   # one row per pattern over every recorded session (catalog "hidden_syncs")
"""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import hidden_sync_runs
from lora_moe_lab.provenance import catalog


def recorded():
    return hidden_sync_runs.recorded(catalog("hidden_syncs"))
