"""The simulator study's blocks (scripts/readme_tables.py collects `BLOCKS`): the fitted queue model
(`simulator`) and its check against the decoder measured at TP=2 (`simulator-check`)."""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import schemas

from lora_moe_lab.provenance import DATA


def simulator_block() -> str | None:
    d = DATA / "simulator"
    if not (d / "simulator_fit.json").exists():
        return None
    from lora_moe_lab import sim

    text = sim.readme_block(d)
    # the per-guard table is notebook 05's; the one TP=4 figure is the tp4 block's prediction
    paras = [p for p in text.split("\n\n") if not p.startswith(("Extrapolated to production", "| guard"))]
    paras[0] = paras[0].split(" Host: ")[0].rstrip(".") + "; its fitted costs: notebook 05."
    return "\n\n".join(paras)


def simulator_check_block() -> str | None:
    """The queue model against the decoder measured at TP=2 with one guard sync per layer."""
    from lora_moe_lab import sim
    from lora_moe_lab.sim import PRODUCTION
    from lora_moe_lab.sim.tp import rank_shape

    f = DATA / "production" / "tp2_C16384_gs1.summary.csv"
    if not f.exists() or not (DATA / "simulator" / "simulator_fit.json").exists():
        return None
    m = schemas.read_csv(f, "prefill_summary").set_index("guard").loc["sync"]
    params = sim.load_calibration().params
    x = sim.extrapolate(params, preset=rank_shape(2), tp=2, chunks=(int(m.chunk),), active=0.0,
                        guards=("sync", "cpu_flag"))
    c = sim.compare_production(x).set_index("metric")["predicted"]
    return (f"Against the measurement: at TP=2 with one guard sync per layer ({m.syncs_per_forward:.0f} per forward, "
            f"chunks of {int(m.chunk)}, no adapter in use) the queue model predicts "
            f"{c['input_throughput_gain_pct']:+.1f} % input throughput and {c['ttft_change_pct']:+.1f} % TTFT; the "
            f"decoder measured {m.fix_throughput_gain_pct:+.1f} % [{m.fix_throughput_gain_pct_lo:+.1f}, "
            f"{m.fix_throughput_gain_pct_hi:+.1f}] and {m.fix_ttft_change_pct:+.1f} % "
            f"[{m.fix_ttft_change_pct_lo:+.1f}, {m.fix_ttft_change_pct_hi:+.1f}] (2.5–97.5 percentiles of 5 "
            f"repetitions; `data/production/tp2_C16384_gs1.summary.csv`). The model holds the MoE blocks only, with no "
            f"attention to dilute the stall: its own TP=4 extrapolation is no check of production's "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} % (notebook 05).")


BLOCKS = {"simulator": simulator_block, "simulator-check": simulator_check_block}
