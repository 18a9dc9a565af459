"""Recording: the sync audit on transformers' eager MoE forwards on a GPU, and a rewrite priced before
it is measured (data/audit_corpus/, README there).

For each model (random init, bf16, `--tokens` tokens, transformers' eager per-expert loop):
  1. audit: the audit's count against torch's sync debug mode, its kinds (0 `other`), every row's
     site in transformers (section "audit", one row per line and kind in section "sites");
  2. measure: eager against the rewrite (lora_moe_lab/instruments/recorders/expert_loop.py), unprofiled,
     interleaved and paired, `--warmup` pairs checked for drift then `--reps` pairs; the saving is the
     median paired difference with its percentile bootstrap 95 % interval; the outputs bit-equal;
  3. predict, from the original alone: ONE plain profiled forward (no audit modes), its blocking runtime
     calls matched in order to the audit's syncs; the replay engine deletes the ops the rewrite deletes
     (`predicted_saving`) on the graph with its host time calibrated (`calibrate_host`: the profiler
     inflates the very host work a sync rewrite removes) to the original's unprofiled median in the
     paired run. The host's speed drifts by tens of per cent within a minute on a shared host, so the
     target is timed in the same window as the measurement; a target timed in a short burst before it
     (`early`), and the syncs-only and uncalibrated predictions, are recorded beside it. No time of the
     rewrite enters the price.

    python studies/audit_corpus/record.py --out data/audit_corpus --session s3   # rows into priced.csv, sites.csv
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import numpy as np
import torch

from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.instruments.recorders import expert_loop, tables
from lora_moe_lab.audit import audit
from lora_moe_lab.instruments.recorders.profiling import profile_forwards
from lora_moe_lab.instruments.recorders.timing import rotated, time_once
from lora_moe_lab.provenance import metadata
from lora_moe_lab.sim import replay_transforms as RT
from lora_moe_lab.instruments.analysers.trace.analysis import ranges_index
from lora_moe_lab.instruments.analysers.trace.parse import top_level
from lora_moe_lab.sim.replay import SYNC, build_graph, replay
from lora_moe_lab.sim.sync_savings import host_call_starts

MODELS = {
    # the shape: Qwen3-30B-A3B's layer (hidden 2048, 128 experts, top-8, moe intermediate 768), 4 layers
    "qwen3_moe": dict(layers=4, experts=128, top_k=8, hidden=2048, inter=768),
    "olmoe": dict(layers=4, experts=64, top_k=8, hidden=2048, inter=1024),
}


def build(name: str, tokens: int, seed: int = 0):
    import transformers as tf

    p = MODELS[name]
    common = dict(vocab_size=4096, hidden_size=p["hidden"], num_hidden_layers=p["layers"], num_attention_heads=32,
                  num_key_value_heads=4, max_position_embeddings=max(4096, tokens), num_experts_per_tok=p["top_k"])
    if name == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, head_dim=128, intermediate_size=6144, moe_intermediate_size=p["inter"],
                                num_experts=p["experts"], decoder_sparse_step=1)
        model_cls, experts_cls = tf.Qwen3MoeForCausalLM, tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts
    else:
        cfg = tf.OlmoeConfig(**common, intermediate_size=p["inter"], num_experts=p["experts"])
        model_cls, experts_cls = tf.OlmoeForCausalLM, tf.models.olmoe.modeling_olmoe.OlmoeExperts
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed)).cuda()

    @torch.no_grad()
    def fwd():
        return model(ids, use_cache=False).logits

    return model, fwd, experts_cls


def _top_ops(tables, g):
    """(starts, ends, names) of the host thread's top-level aten ops in the forward's window: the ops the
    model's Python called (their nested ops and runtime calls lie inside them)."""
    ops = tables.cpu_ops
    w0, w1 = g.meta["window_ns"]
    ops = ops[(ops["tid"] == g.meta["host_tid"]) & (ops["start_ns"] >= w0) & (ops["start_ns"] < w1)]
    top = sorted(top_level(ops.to_dict("records")), key=lambda r: r["start_ns"])
    return (np.array([r["start_ns"] for r in top], np.int64), np.array([r["end_ns"] for r in top], np.int64),
            np.array([r["name"] for r in top], object))


def calibrate_host(g, plain_us: float, ret: bool = True):
    """The graph with its host work (gaps and runtime calls) scaled so that its replay takes the original
    forward's unprofiled time: the profiler's own host cost (CUPTI on every runtime call, the op records)
    inflates exactly the host time that a sync rewrite removes. One factor, found by bisection. ret=False:
    a sync's return latency after the drain stays as traced (the driver waking the host, not host work)."""
    lo, hi = 0.05, 1.5
    for _ in range(30):
        f = (lo + hi) / 2
        t = float(replay(RT.scale_host(g, f, calls=True, ret=ret)).step_ns[0]) / 1e3
        lo, hi = (f, hi) if t < plain_us else (lo, f)
    f = (lo + hi) / 2
    return RT.scale_host(g, f, calls=True, ret=ret), f


def predicted_saving(rep, fwd, experts_file: str, keep_line: int, compare_line: int | None,
                     targets: dict[str, tuple[float, bool]] | None = None):
    """The replay's saving of the rewrite, from ONE plain profiled forward of the eager loop, two ways:
    `syncs`: every removed sync and the device-to-host copy before it go (remove_syncs);
    `ops`: the ops the rewrite deletes go whole (drop_calls): each top-level aten op that holds a removed
    sync (torch.where's nonzero with its scan launches and copy, the 0-d index's item, bool()) with every
    runtime call in it and the host time before each; the host-only select of the expert mask
    (`expert_mask[expert_idx]`, no runtime call: shorten_gaps takes its time off the next call's gap); and per
    expert the rewrite's own two index kernels (`seg % T`, `seg // T`) stand in as the eager loop's compare
    launch (`expert_idx == num_experts`, one elementwise kernel over a few int64) kept and repeated once
    (repeat_calls). The rewrite's slice of the sorted order per expert stands in as the loop's `expert_idx[0]`
    select (kept). The per-layer routing ops of both (one_hot, sum, nonzero against sort, scatter_add, tolist)
    are left as traced. `targets`: {name: (the original's unprofiled time in us, whether the syncs' return
    latency scales with the host)}: the `ops` edit again on the graph with its host calibrated to each
    (`calibrate_host`)."""
    tables = profile_forwards(fwd, n_warmup=1, n_active=1)
    g = build_graph(tables, forward=0)
    sync_idx = np.nonzero(g.host["kind"] == SYNC)[0]
    events = sorted((e for e in rep.events if e.rep == 0), key=lambda e: e.t_ns)
    note = f"{len(sync_idx)} blocking runtime calls in the trace, {len(events)} syncs in the audit"
    base = float(replay(g).step_ns[0])
    if len(sync_idx) != len(events):
        nan = float("nan")
        return dict(syncs=nan, ops=nan, base=base / 1e3, calibrated={k: nan for k in targets or {}},
                    factors={k: nan for k in targets or {}}, note=note + ": cannot match them in order")
    keep = f"{experts_file}:{keep_line}"
    removed = [i for i, e in enumerate(events) if e.site.startswith(experts_file + ":") and e.site != keep]
    syncs = base - float(replay(RT.remove_syncs(g, which="all", calls=sync_idx[removed])).step_ns[0])
    starts = host_call_starts(g)
    o_s, o_e, o_n = _top_ops(tables, g)
    op_of = ranges_index(starts, o_s, o_e)
    drop_ops = {int(op_of[sync_idx[i]]) for i in removed} - {-1}
    drop = np.nonzero(np.isin(op_of, sorted(drop_ops)))[0]
    # the mask's select: the host-only op between a dropped item and the torch.where it feeds
    sel = [j + 1 for j in sorted(drop_ops) if j + 2 < len(o_n) and o_n[j] == "aten::item"
           and o_n[j + 1] == "aten::select" and o_n[j + 2] == "aten::where" and not (op_of == j + 1).any()]
    sel_ns = (o_e[sel] - o_s[sel]).astype(np.int64)
    sel_next = np.searchsorted(starts, o_e[sel], side="left")  # the first call the host reaches after it
    ok = sel_next < g.n_host
    sel_ns, sel_next = sel_ns[ok], sel_next[ok]
    repeat = []
    if compare_line is not None:  # the launch right before each removed bool() of the compare line
        cmp_site = f"{experts_file}:{compare_line}"
        for i in removed:
            if events[i].site == cmp_site:
                first = np.nonzero(op_of == op_of[sync_idx[i]])[0][0]
                if first > 0 and o_n[op_of[first - 1]] == "aten::eq":
                    repeat.append(int(first - 1))

    def rewrite(graph, f=1.0):  # the gaps first (call indices as traced), then the copies, each dropped call
        # moved by the copies before it
        graph = RT.shorten_gaps(graph, sel_next, np.round(sel_ns * f).astype(np.int64))
        return RT.drop_calls(RT.repeat_calls(graph, repeat), drop + np.searchsorted(repeat, drop, side="right"))

    g2 = rewrite(g)
    ops = base - float(replay(g2).step_ns[0])
    cal, factors = {}, {}
    for name, (plain_us, ret) in (targets or {}).items():  # the same edit on the host-calibrated graph
        gc, f = calibrate_host(g, plain_us, ret=ret)  # (the call indices are unchanged by scaling)
        cal[name] = (float(replay(gc).step_ns[0]) - float(replay(rewrite(gc, f)).step_ns[0])) / 1e3
        factors[name] = f
        note += f"; host x{f:.3f} to the {name} {plain_us / 1e3:.1f} ms"
    names = ", ".join(f"{n} {c}" for n, c in Counter(o_n[sorted(drop_ops)]).most_common(4))
    note += (f"; {len(removed)} syncs removed; ops: {len(drop_ops)} ops dropped ({names}), {len(drop)} runtime "
             f"calls, {g.n_kernels - g2.n_kernels} kernels net, {len(repeat)} compare launches repeated, "
             f"{len(sel_ns)} host-only mask selects ({np.median(sel_ns) / 1e3 if len(sel_ns) else 0:.1f} us "
             f"profiled, median) taken off")
    return dict(syncs=syncs / 1e3, ops=ops / 1e3, calibrated=cal, factors=factors, base=base / 1e3, note=note)


def measure(model, fwd, warmup: int, reps: int):
    impls = {"eager": "eager", "hoisted": expert_loop.register()}

    def arm(impl):
        def run():
            model.config._experts_implementation = impl
            return fwd()
        return run

    fns = {k: arm(v) for k, v in impls.items()}
    got = {k: [] for k in fns}
    for r in range(warmup + reps):
        for k in rotated(list(fns), r):
            got[k].append(time_once(fns[k], True)[0])
    check = stats.warmup_check({k: v[warmup:] for k, v in got.items()}) if reps else None
    a = np.array(got["eager"][warmup + check.dropped:])
    b = np.array(got["hoisted"][warmup + check.dropped:])
    est, lo, hi = stats.bootstrap_paired(a, b, "median_diff")
    model.config._experts_implementation = "eager"
    return dict(eager_us=float(np.median(a)), hoisted_us=float(np.median(b)), saving_us=est, lo_us=lo, hi_us=hi,
                n=len(a), warmup_note=check.note, warmup_ok=check.stable)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("record_audit_corpus needs a CUDA GPU (it times transformers' forwards on it)")
    import inspect

    import transformers

    os.makedirs(a.out, exist_ok=True)
    meta = metadata(dict(vars(a), transformers=transformers.__version__))
    root = os.path.dirname(os.path.dirname(transformers.__file__))
    rows, sites = [], []
    for name in a.models.split(","):
        t0 = time.time()
        model, fwd, ecls = build(name, a.tokens)
        y0 = fwd()
        rep = audit(fwd, warmup=1, reps=1, profile=False, focus="transformers")
        experts_file = os.path.relpath(inspect.getsourcefile(ecls), root).replace(os.sep, "/")
        lines, first = inspect.getsourcelines(ecls.forward)
        nonzero_line = next(i for i, l in enumerate(lines, first) if ".nonzero()" in l)
        compare_line = next((i for i, l in enumerate(lines, first) if "== self.num_experts" in l), None)
        t = rep.table()
        for r in t.itertuples():
            sites.append(dict(session=a.session, model=name, site=r.site, function=r.function, kind=r.kind,
                              count=r.count_per_call, torch_count=r.torch_count, code=r.code))
        # the original, unprofiled, before anything of the rewrite runs (a short burst: the early target)
        plain = [time_once(fwd, True)[0] for _ in range(8)][3:]
        model.config._experts_implementation = expert_loop.register()
        y1 = fwd()
        after = audit(fwd, warmup=0, reps=1, profile=False)
        model.config._experts_implementation = "eager"
        m = measure(model, fwd, a.warmup, a.reps)
        # The price is computed from the original alone: its profiled graph with the host calibrated to the
        # original's own unprofiled median in the paired run (`window`: the host's speed drifts by tens of
        # per cent within a minute on a shared host, so a target timed a minute earlier describes another
        # machine state); the early burst's target is recorded beside it. No time of the rewrite enters.
        p = predicted_saving(rep, fwd, experts_file, nonzero_line, compare_line,
                             dict(window=(m["eager_us"], True), early=(float(np.median(plain)), True),
                                  window_ret=(m["eager_us"], False)))
        pred = p["calibrated"]["window"]
        rows.append(dict(
            session=a.session, model=name, tokens=a.tokens, layers=MODELS[name]["layers"],
            experts=MODELS[name]["experts"], rewrite="hoisted expert loop (one .tolist() per layer)",
            syncs_before=rep.count, torch_count_before=rep.torch_count, other=rep.kinds.get("other", 0),
            sites_in_transformers=bool(all(s.startswith("transformers/") for s in rep.sites)),
            syncs_after=after.count, outputs_equal=bool(torch.equal(y0, y1)),
            predicted_saving_us=pred, predicted_early_us=p["calibrated"]["early"],
            predicted_uncalibrated_us=p["ops"], predicted_syncs_only_us=p["syncs"],
            replay_base_us=p["base"], host_factor=p["factors"]["window"], host_factor_early=p["factors"]["early"],
            early_us=float(np.median(plain)),
            # exploratory, beside the price: the same calibration with the syncs' return latency as traced
            predicted_ret_traced_us=p["calibrated"]["window_ret"], host_factor_ret_traced=p["factors"]["window_ret"],
            predict_method="ops, host calibrated in the window: the rewrite's deleted ops dropped whole (and the "
                           "mask's host-only select), its index kernels as the compare's, on the profiled graph with "
                           "its host scaled to the original's unprofiled median in the paired run",
            predict_note=p["note"],
            measured_saving_us=m["saving_us"], measured_lo_us=m["lo_us"], measured_hi_us=m["hi_us"],
            eager_us=m["eager_us"], hoisted_us=m["hoisted_us"], reps=m["n"], warmup_ok=m["warmup_ok"],
            warmup_note=m["warmup_note"], interval="percentile bootstrap 95 % of the paired median difference",
            pred_error_pct=100 * (pred / m["saving_us"] - 1) if m["saving_us"] else float("nan"),
            pred_early_error_pct=(100 * (p["calibrated"]["early"] / m["saving_us"] - 1) if m["saving_us"]
                                  else float("nan")),
            measured_fraction=m["saving_us"] / m["eager_us"], predicted_fraction=pred / m["eager_us"],
            halfwidth_pct=100 * (m["hi_us"] - m["lo_us"]) / 2 / m["saving_us"] if m["saving_us"] else float("nan"),
            gpu=meta["gpu"], driver=meta["driver"], commit=meta["commit"], dirty=meta["dirty"],
            date=meta["date"], transformers=transformers.__version__,
            seconds=round(time.time() - t0, 1)))
        print(json.dumps(rows[-1], default=str), flush=True)
        del model
        torch.cuda.empty_cache()
    write_session(a.out, a.session, rows, sites, meta)


def write_session(out: str, session: str, rows: list[dict], sites: list[dict], meta: dict) -> None:
    """The session's rows into priced.csv and sites.csv, its metadata into priced.meta.json, then both
    tables' seals (they hash the tables as now written)."""
    meta_path = os.path.join(out, "priced.meta.json")
    metas = tables.read_meta(meta_path)
    for fname, rs in (("priced.csv", rows), ("sites.csv", sites)):
        replace_session(os.path.join(out, fname), rs, session)
    metas[session] = meta
    tables.write_json_atomic(meta_path, metas, default=str)
    for fname in ("priced.csv", "sites.csv"):
        tables.seal(os.path.join(out, fname), meta_path)


def replace_session(path: str, rows: list[dict], session: str) -> None:
    """The session's rows into the study's long table (its earlier rows of the same session replaced; a column
    new in this session is empty on the older rows), the whole table written to a temporary file and moved
    into place (recorders/tables.py): a run that dies leaves the table as it was."""
    import pandas as pd

    new = pd.DataFrame(rows)
    if os.path.exists(path):
        old = pd.read_csv(path)
        new = pd.concat([old[old["session"] != session], new], ignore_index=True)
    tables.write_csv_atomic(path, new)


if __name__ == "__main__":
    main()
