"""The audit corpus's block (scripts/readme_tables.py collects `BLOCKS`): the sync audit on transformers' eager MoE
forwards, priced then measured, from data/audit_corpus/priced.csv (read through its kind's checked reader). The
canonical sessions are those priced by the newest method (the last session's `predict_method`); the earlier
methods are summarised by their errors."""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA

PRICED = DATA / "audit_corpus" / "priced.csv"
NAMES = {"qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE"}


def _pct(x: float) -> str:
    return f"{x:+.0f} %".replace("-", "−")


def _span(xs, fmt=_pct) -> str:
    lo, hi = min(xs), max(xs)
    return fmt(lo) if round(lo) == round(hi) else f"{fmt(lo)} to {fmt(hi)}"


def audit_corpus_block() -> str | None:
    if not PRICED.exists():
        return None
    d = schemas.read_csv(PRICED, "audit_priced")
    name = lambda m: NAMES.get(m, m)  # noqa: E731
    method = d.predict_method.iloc[-1]
    can = d[d.predict_method == method]
    sessions = ", ".join(dict.fromkeys(can.session))
    same = (d.syncs_before == d.torch_count_before).all() and (d.other == 0).all() and d.sites_in_transformers.all()
    counts = ", ".join(f"{name(m)} {int(g.syncs_before.iloc[0])}" for m, g in d.groupby("model", sort=False))
    after = sorted({int(x) for x in d.syncs_after})
    lines = [f"Setting: transformers {d.transformers.iloc[-1]}, {int(d.tokens.iloc[0])} tokens, "
             f"{int(d.layers.iloc[0])} layers each, " + ", ".join(f"{name(m)} {int(g.experts.iloc[0])} experts"
                                                              for m, g in d.groupby("model", sort=False))
             + f"; the canonical sessions ({sessions}) paired "
             + _span(can.reps, lambda x: f"{x:.0f}").replace(" to ", "–") + " repetitions per model.", "",
             ("Every session: the audit equals torch's debug mode" if same else
              "**Not every session's audit equals torch's debug mode**")
             + f" ({counts} syncs per forward, 0 `other`, every site in transformers); the rewrite leaves "
             + "/".join(map(str, after)) + ", logits " + ("bit-equal." if d.outputs_equal.all() else
                                                          "**not bit-equal in every session**."), "",
             "| session | model | predicted ms | measured ms [95 %] | error | half-width |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in can.itertuples():
        lines.append(f"| {r.session} | {name(r.model)} | {r.predicted_saving_us / 1e3:.1f} | "
                     f"{r.measured_saving_us / 1e3:.1f} [{r.measured_lo_us / 1e3:.1f}, {r.measured_hi_us / 1e3:.1f}] | "
                     f"{r.pred_error_pct:+.1f} % | {r.halfwidth_pct:.1f} % |".replace("| -", "| −"))
    lines += ["", f"- Errors {_span(can.pred_error_pct)}, every half-width at most {can.halfwidth_pct.max():.1f} %."]
    earlier = []
    for m, g in d[d.predict_method != method].groupby("predict_method", sort=False):
        earlier.append(f"{m.split(':')[0]} {_span(g.pred_error_pct)} ({', '.join(dict.fromkeys(g.session))})")
    if earlier:
        lines.append("- Earlier methods: " + "; ".join(earlier) + ".")
    if can.early_us.notna().all():
        w = can.loc[(can.early_us / can.eager_us).idxmax()]
        lines.append(f"- The original timed a minute before the paired run took {w.early_us / 1e3:.1f} ms against "
                     f"{w.eager_us / 1e3:.1f} ms in it ({w.session} {name(w.model)}); priced to that early time "
                     f"the errors would be {_span(can.pred_early_error_pct)}.")
    if can.measured_fraction.notna().all():
        ret = can.predicted_ret_traced_us / can.measured_saving_us * 100 - 100
        lines.append(f"- The rewrite removes {_span(can.measured_fraction * 100, lambda x: f'{x:.0f} %')} of the "
                     f"original forward's time, the replay predicts "
                     f"{_span(can.predicted_fraction * 100, lambda x: f'{x:.0f} %')}; the exploratory variant "
                     f"errs {_span(ret)}.")
    return "\n".join(lines)


BLOCKS = {"audit-corpus": audit_corpus_block}
BLOCK_DATA = {"audit-corpus": "audit_corpus"}
