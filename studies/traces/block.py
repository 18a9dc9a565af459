"""The traces study's block (scripts/readme_tables.py collects `BLOCKS`): syncs, idle time and utilisation per
forward, from the profiler traces' summary in data/traces/."""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA, label, normalize_meta


def traces_block() -> str:
    d = schemas.read_csv(DATA / "traces" / "traces_summary.csv", "traces_summary")
    meta = normalize_meta(schemas.read_json(DATA / "traces" / "traces_summary.meta.json"))
    e = d[d["mode"] == "eager"].set_index(["guard", "M"])  # the columns are per forward already
    g = d[d["mode"] == "graph"].set_index(["guard", "M"])
    per = e["n_syncs"]
    tmeta = DATA / "traces" / "qwen3-30b-a3b_sync_eager_M16.meta.json"
    layers = schemas.read_json(tmeta)["params"]["num_layers"]
    others = [k for k in e.index.get_level_values("guard").unique() if k != "sync"]
    after_others = e.loc[others, "idle_after_sync_ns"].max()
    lines = [f"Per forward, from the profiler traces in `data/traces/` ({label(meta)}): {layers} layers of "
             "qwen3-30b-a3b, two forwards per trace.", "",
             f"- `sync` makes {per[('sync', 16)]:.0f} syncs per forward over {layers} layers; "
             + " and ".join(f"`{k}`" for k in others) + f" make {e.loc[others, 'n_syncs'].max():.0f}.",
             "- GPU idle right after the syncs: "
             + ", ".join(f"{e.loc[('sync', m), 'idle_after_sync_ns'] / 1e6:.2f} ms "
                         f"per forward at M = {m}" for m in sorted(e.loc["sync"].index))
             + ("; none with the other guards." if after_others == 0 else
                f"; at most {after_others / 1e6:.2f} ms with the other guards."),
             "- GPU utilisation inside the forward at M = 4096: "
             + ", ".join(f"{e.loc[(k, 4096), 'gpu_util']:.2f} with `{k}`" for k in ("sync", "cpu_flag"))
             + (f", {g['gpu_util'].xs(4096, level='M').max():.2f} under graph replay." if len(g) else ".")]
    return "\n".join(lines)


BLOCKS = {"traces": traces_block}
