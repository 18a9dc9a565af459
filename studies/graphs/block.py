"""The graphs study's block (scripts/readme_tables.py collects `BLOCKS`): the CUDA-graph strategies' capture
cost, memory and step time against `one_graph`, from data/graphs/."""
from __future__ import annotations


def _graphs_regression(rec) -> str:
    """The cells where a strategy is slower than one_graph, on both models: never hidden."""
    worst = []
    for model in ("moe", "decoder"):
        t = rec.table(model).set_index("strategy")
        for v, r in t.drop(index="one_graph", errors="ignore").iterrows():
            for c in (c for c in t.columns if c.startswith("M=")):
                if r[c] > 1.02:
                    worst.append(f"`{v}` {c} on the {'MoE model' if model == 'moe' else 'decoder'}: "
                                 f"{(r[c] - 1) * 100:+.1f} %")
    if not worst:
        return "- No strategy is more than 2 % slower than `one_graph` anywhere."
    return ("- Slower than `one_graph` by more than 2 %: " + "; ".join(worst) + ": one adapter compacted onto one "
            "LoRA row changes the aligned kernel's tiles; the cause is not found (`data/kernels/expand_run10`, "
            "notebook 03).")


def graphs_block() -> str | None:
    from lora_moe_lab.instruments.analysers.recordings import load_graph_strategies

    try:
        rec = load_graph_strategies()
    except FileNotFoundError:
        return None
    t = rec.table("moe").set_index("strategy")
    cols = [c for c in t.columns if c.startswith("M=")]
    head = "| strategy | graphs | capture (s) | graph pool (MiB) | " + " | ".join(cols) + " |"
    lines = [head, "|---|---:|---:|---:|" + "---:|" * len(cols)]
    for v, r in t.iterrows():
        cells = ["—" if v == "one_graph" else f"{(r[c] - 1) * 100:+.1f} %" for c in cols]
        lines.append(f"| `{v}` | {int(r['graphs'])} | {r['capture_s']:.2f} | {r['pool_mib']:.0f} | "
                     + " | ".join(cells) + " |")
    sw = rec.switches
    return (f"Three ways to put LoRA under CUDA graphs (`model/graph_strategies.py`; `studies/graphs/record.py`, "
            f"{rec.label}): the 48-layer qwen3-30b-a3b MoE model, bf16, 4 adapter slots of rank 32, decode (1 to 64 "
            f"requests) and prefill (512, 2048 tokens) graphs. Capture time, graph pool, and one whole step (pick, "
            f"upload, replay) against `one_graph` (LoRA kernels always inside, exiting early): paired medians of "
            f"{int(rec.summary().n.min())} interleaved repetitions (the decoder and the intervals: notebook 03).\n\n"
            + "\n".join(lines) + "\n\n"
            f"- Every replay after adapter switches equals the eager run of its graph bit for bit "
            f"({int(sw.bit_exact_vs_same_graph_eager.sum())} of {len(sw)}); a batch larger than every graph gets "
            f"`NoGraphFits` (or runs eagerly with `fallback=\"eager\"`).\n"
            f"- The no-LoRA graphs save a few percent with no adapter active, for 2x (`lora_split`) and 4x "
            f"(`per_active_count`) the graphs.\n"
            + _graphs_regression(rec))


BLOCKS = {"graphs": graphs_block}
