"""Synthetic guards sessions in the schema studies/guards/record.py writes (warm-up check
applied by recordings.mark_warmup), for the reader's and the README block's tests."""
import numpy as np
import pandas as pd

from lora_moe_lab.instruments.analysers.recordings import mark_warmup


def session_rows(session, *, reps=16, lost_per_sync=40.0, drift=None, seed=0, tokens=(16, 4096)):
    """Synthetic rows of one session as record_guards writes them (before the check):
    drift = {(tokens, variant): leading repetitions that run 30 % slow}."""
    rng = np.random.default_rng(seed)
    rows = []
    for M in tokens:
        for act in (0.0, 0.5):
            for rep in range(reps):
                noise = rng.normal(0, 5.0)
                for v, t, syncs in (("sync", 1000.0 + 48 * lost_per_sync, 48), ("cpu_flag", 1000.0, 0),
                                    ("launch_always", 1100.0, 0), ("graph", 800.0, 0)):
                    us = t + noise + rng.normal(0, 1.0)
                    if drift and rep < drift.get((M, v), 0):
                        us *= 1.3
                    rows.append(dict(preset="tiny", layers=48, tokens=M, active=act, variant=v,
                                     guard="cpu_flag" if v == "graph" else v, mode="graph" if v == "graph" else "eager",
                                     rep=rep, us=us, syncs_per_forward=syncs, session=session))
    return pd.DataFrame(rows)


def write_session(folder, session, **kw):
    df = mark_warmup(session_rows(session, **kw))
    f = folder / f"h200_guards_{session}.csv"
    df.to_csv(f, index=False)
    f.with_name(f.stem + ".meta.json").write_text(
        f'{{"gpu": "NVIDIA H200", "commit": "abc{session}0000", "date": "2026-12-0{session[-1]}", '
        f'"session": "{session}",'
        ' "params": {"reps": 16, "warmup": 3, "warmup_s": 1.5, "max_reps": 24, "requests": 8}}')
    return f
