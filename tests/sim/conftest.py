"""A synthetic guards recording in the canonical schema (instruments/analysers/recordings.py), made by the
simulator itself from known parameters: what the fit must recover and the validation must pass."""
import json

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab import sim
from lora_moe_lab.instruments.analysers.recordings import SAMPLE_COLUMNS, load_guards

PRESETS = ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4")
TOKENS = (16, 128, 1024, 4096, 16384)
# variant -> (guard, mode), as studies/guards/record.py records them
VARIANTS = {"sync": ("sync", "eager"), "cpu_flag": ("cpu_flag", "eager"),
            "launch_always": ("launch_always", "eager"), "graph": ("cpu_flag", "graph")}


def write_recording(folder, params, *, reps=9, noise=0.0, layers=48, tokens=TOKENS, seed=0, distort=None):
    """Write h200_guards.csv + .meta.json under `folder` and load it. Each repetition's time is the
    simulated forward times exp(noise * N(0, 1)); `distort(row) -> factor` bends chosen points."""
    rng = np.random.default_rng(seed)
    rows = []
    for preset in PRESETS:
        for M in tokens:
            for act in (0.0, 0.5):
                for rep in range(reps):
                    for v, (g, mode) in VARIANTS.items():
                        t = sim.forward_us(preset, M, g, layers=layers, mode=mode, params=params, active=act)
                        row = dict(preset=preset, layers=layers, tokens=M, active=act, variant=v, guard=g, mode=mode,
                                   rep=rep, syncs_per_forward=layers if (g == "sync" and mode == "eager") else 0)
                        f = distort(row) if distort else 1.0
                        rows.append(dict(row, us=t * f * float(np.exp(noise * rng.standard_normal()))))
    path = folder / "h200_guards.csv"
    pd.DataFrame(rows, columns=SAMPLE_COLUMNS).to_csv(path, index=False)
    (folder / "h200_guards.meta.json").write_text(json.dumps(
        {"gpu": "synthetic", "git_commit": "5e7e7e7abc", "date_utc": "2026-11-30", "params": {"rank": 16}}))
    return load_guards(path)


@pytest.fixture
def make_recording(tmp_path):
    """make_recording(params, **kw) -> a Recording written under tmp_path (see write_recording)."""
    return lambda params, **kw: write_recording(tmp_path, params, **kw)
