# %% [markdown]
# # 03 · CUDA-graph capture
#
# **Goal.** Understand why the `sync` guard cannot live inside a CUDA graph, what the
# capture-mode rule does about it, and that one captured forward serves every adapter mix.
#
# A CUDA graph records a sequence of kernel launches once and replays it with a single host call:
# the per-kernel launch cost (a few microseconds of Python + driver each) disappears. Two rules
# follow from "record once, replay many":
#
# 1. Everything the graph reads lives at **fixed addresses** (static buffers written in place).
# 2. Nothing may **ask the host a question** during capture. A capturing stream does not execute
#    work, so `.item()` — which needs the result *now* — is refused by CUDA with
#    `operation not permitted when stream is capturing`.
#
# The host also cannot know which adapters *future* batches will use. So under capture mode every
# guard records the LoRA kernels unconditionally, and the kernel's early exit decides on the GPU
# at replay time.

# %% tags=["parameters"]
preset = "tiny"          # tiny, qwen3-30b-a3b or qwen3-30b-a3b-tp4
num_layers = 4
num_requests = 4
tokens_per_request = 4
device = "auto"          # auto, cpu or cuda
dtype = "auto"           # auto: bfloat16 on GPU, float32 on CPU

# %%
import json

import pandas as pd
import plotly.graph_objects as go
import torch

from lora_moe_lab.model import graphs
from lora_moe_lab.model.guards import count_guard_syncs
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.nb import params as nbk
from lora_moe_lab.runtime import capture_mode

nbk.reject_unknown_parameters()
nbk.check_preset(preset)
for _n in ("num_layers", "num_requests", "tokens_per_request"):
    nbk.check_positive_int(_n, globals()[_n])
dev = nbk.check_device(device)
dtype = nbk.pick_dtype(dtype, dev)
nbk.setup_plotly()
LIVE = dev.type == "cuda"
print("live GPU run" if LIVE else "no GPU: the capture steps below show data recorded on an H200")

# %% [markdown]
# ## The capture-mode rule, on any machine
# Under `capture_mode()` the `sync` guard does not call `.item()`: it launches unconditionally.
# This part needs no GPU — the guard's decision is host logic.

# %%
lab = build_lab(preset, num_layers=num_layers, dtype=dtype, device=str(dev))
lab.pool.load("a", rank=8)
lab.pool.load("b", rank=4)
counts = [tokens_per_request] * num_requests
batch, tensors = lab.make_batch([None] * num_requests, counts)
x = lab.random_input(batch.num_tokens)
rows = []
for mode in (False, True):
    with capture_mode(mode), count_guard_syncs() as c:
        lab.model(x, batch, tensors, guard="sync")
    rows.append({"capture_mode": mode, "sync guard .item() calls": c.count})
rule = pd.DataFrame(rows)
assert rule.iloc[1, 1] == 0 and rule.iloc[0, 1] == num_layers, rule
rule

# %% [markdown]
# ## Capture without the rule fails — and the real cause is hidden
# `torch.cuda.graph(...)` reports `operation failed due to a previous error during capture` when
# it ends the capture; the first error — the one that names the cause — is buried in the
# exception chain. `graphs.inner_cause` digs it out.

# %%
checks_path = nbk.DATA / "graphs" / "checks.json"
recorded = json.loads(checks_path.read_text()) if checks_path.exists() else None
if LIVE:
    fail = graphs.try_capture(lab, counts, "sync", use_capture_mode=False)
    outer, inner = fail.outer.splitlines()[0], fail.inner.splitlines()[0]
    print("recorded live on", torch.cuda.get_device_name(0))
else:
    if recorded is None:
        raise FileNotFoundError(f"no GPU and no recorded data at {checks_path}")
    row = next(r for r in recorded["checks"] if r["check"] == "sync_guard_fails_in_capture_without_rule")
    outer, inner = [l.split(": ", 1)[1] for l in row["detail"].splitlines()]
    print(f"recorded on {recorded['meta']['gpu']} ({recorded['meta']['date']}, commit {recorded['meta']['commit']})")
print("outer error :", outer)
print("inner cause :", inner)
assert "capturing" in inner, inner

# %% [markdown]
# ## One graph, every adapter mix
# Capture once (with adapters absent), then switch the batch between none → some → all → none
# by writing the static metadata buffers in place, replay, and compare with eager execution.
# (On a live GPU the failing capture above left state in the process; we rebuild the lab first.)

# %%
if LIVE:
    lab = build_lab(preset, num_layers=num_layers, dtype=dtype, device=str(dev))
    lab.pool.load("a", rank=8)
    lab.pool.load("b", rank=4)
    cap = graphs.CapturedForward(lab, counts, guard="cpu_flag")
    mixes = {"none": [None] * num_requests, "some": ["a"] + [None] * (num_requests - 1),
             "all": [["a", "b"][i % 2] for i in range(num_requests)], "none again": [None] * num_requests}
    rows = []
    for label, adapters in mixes.items():
        xi = lab.random_input(batch.num_tokens, seed=len(label))
        y = cap.replay(xi, adapters).clone()
        b, t = lab.make_batch(adapters, counts)
        ye = lab.model(xi, b, t, guard="cpu_flag")
        rows.append({"adapters": label, "rel_err_vs_eager": ((y - ye).float().norm() / ye.float().norm()).item()})
    replay = pd.DataFrame(rows)
else:
    replay = pd.DataFrame([{"guard": r["guard"], "adapters": r["adapters"], "rel_err_vs_eager": r["rel_err"]}
                           for r in recorded["checks"] if r["check"] == "graph_replay_equals_eager"])
assert (replay.rel_err_vs_eager < 1e-6).all(), replay
replay

# %% [markdown]
# ## What replay buys
# Eager forward per guard vs a graph replay of the same forward, 48 layers, from the canonical
# guards recording (`data/guards/`, the same one the README and notebooks 01 and 04 read):
# device-event timing, the median over interleaved repetitions with its 95 % interval. At small
# batches the eager forward is launch-bound and replay removes the host from the critical path;
# at large batches the kernels dominate and the gain shrinks.

# %%
from lora_moe_lab.instruments.recordings import load_guards

rec = load_guards()
tim = rec.summary()
tim = tim[(tim.active == 0.0) & (tim.preset == "qwen3-30b-a3b")]
fig = go.Figure()
for v, g in tim.groupby("variant", sort=False):
    fig.add_bar(x=[f"M={m}" for m in g.tokens], y=g.median_us / 1e3, name=("graph replay" if v == "graph" else f"eager: {v}"),
                error_y=dict(type="data", symmetric=False, array=(g.hi95_us - g.median_us) / 1e3,
                             arrayminus=(g.median_us - g.lo95_us) / 1e3))
fig.update_layout(barmode="group", xaxis_title="tokens per forward", yaxis_title="forward time (ms)", yaxis_type="log",
                  height=380, title=f"48-layer forward, no adapter active: eager per guard vs graph replay ({rec.label})")
fig.show()
print(f"recorded: {rec.label}")
display(tim.pivot_table(index="tokens", columns="variant", values="median_us").div(1e3).round(2)
        .rename(columns=lambda c: f"{c} (ms)"))
