"""The guards study's recordings, read: the files are the catalog's (data/catalog.json), the loader and its
statistics the library's (`lora_moe_lab.instruments.analysers.recordings`).

    sessions()    # the canonical recording: every device session's file, pooled (catalog "guards")
    archived()    # the recording of 2026-11-30, made before the warm-up check (catalog "guards.archived")
"""
from __future__ import annotations

from lora_moe_lab.instruments.analysers.recordings import Recording, load_guards
from lora_moe_lab.provenance import catalog


def sessions(check_warmup: bool = False) -> Recording:
    """Every recorded session of studies/guards/record.py, pooled (two sessions: the wider interval)."""
    return load_guards(catalog("guards"), check_warmup=check_warmup)


def archived(check_warmup: bool = False) -> Recording:
    """The archived recording (15 repetitions, no warm-up check: read as recorded unless check_warmup)."""
    return load_guards(catalog("guards.archived"), check_warmup=check_warmup)
