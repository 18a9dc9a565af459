"""The launch-cost study's block (scripts/readme_tables.py collects `BLOCKS`): for each GPU's file in
data/launch_cost/, where an eager LoRA launch's host time goes, part by part, and the floor Triton's own launch sets on
that machine (studies/launch_cost/read.py)."""
from __future__ import annotations

BLOCK_DATA = {"launch-cost": "launch_cost"}


def _cell(v, failed: bool) -> str:
    return "failed" if failed else "" if v != v else f"{v:.1f}"


def gpu_table(gpu: str, path, df) -> str:
    """One GPU's table (a row per path and step: the full call at each M, Triton's binder and the C launcher alone
    at the largest M) and its floor line; every part at every M: `python3 -m studies.launch_cost.read`."""
    from studies.launch_cost import read

    t, bad, m = read.table(df), read.failed(df), df.iloc[0]
    Ms = sorted(set(t.index.get_level_values("M")) - {0})
    top = Ms[-1] if Ms else 0
    lines = [f"#### {gpu}", "",
             f"`{path.name}` (commit {str(m['commit'])[:7]}, Triton {m['triton']}, driver {m['driver']}): host µs "
             "per call, medians.", "",
             "| path | step | " + " | ".join(f"full, M={M}" for M in Ms) + f" | binder, M={top} | launcher, M={top} |",
             "| --- | --- |" + " ---: |" * (len(Ms) + 2)]
    for p, step in dict.fromkeys((p, st) for p, st, _ in t.index):
        at = {M: t.loc[(p, step, M)] for M in set(Ms + [0]) if (p, step, M) in t.index}
        last = at.get(top, at.get(0))
        cells = [_cell(at[M]["full"], False) if M in at else "" for M in Ms]
        if 0 in at:  # an empty kernel (no tokens): its one full launch in the first column
            cells[0] = _cell(at[0]["full"], False)
        failed = any((p, step, M) in bad for M in at)  # a direct call that failed at any M is never hidden
        cells += [_cell(last["binder"], False), _cell(last["launcher"], failed)]
        lines.append(f"| {p} | {step} | " + " | ".join(cells) + " |")
    f = read.floor(df)
    lines.append("")
    if f is None:
        lines.append("No empty kernel's full launch in this file: no floor (a GPU's recording has one).")
    else:
        p, step, M = f["lowest"]
        lines.append(f"The floor: an empty one-pointer launch takes **{f['one_us']:.1f} µs**; the empty kernel with "
                     f"{f['most_args']} arguments {f['most_us']:.1f} µs, **{f['most_ratio']:.2f}×** that. The "
                     f"cheapest LoRA step, {p} {step} at M = {M}, takes {f['lowest_us']:.1f} µs: "
                     f"**{f['lowest_ratio']:.2f}×**.")
    return "\n".join(lines)


def launch_cost_block() -> str | None:
    from studies.launch_cost import read

    tables = [gpu_table(gpu, p, df) for gpu, (p, df) in read.by_gpu().items()]
    return "\n\n".join(tables) or None


BLOCKS = {"launch-cost": launch_cost_block}
