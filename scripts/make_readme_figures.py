"""Render the README's pictures from recorded H200 data (no GPU needed).

    python scripts/make_readme_figures.py        -> docs/guard_ratio.png, docs/timeline_sync.png

Builds plotly figures from data/ with the library's own plot builders, writes them as standalone
HTML and screenshots them with headless Chromium (Debian's `chromium`).
"""
import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import plotly.graph_objects as go

from lora_moe_lab.instruments.analysers import trace
from lora_moe_lab.instruments.analysers.recordings import load_guards
from lora_moe_lab.provenance import DATA
from lora_moe_lab.ui import plots

ROOT = Path(__file__).resolve().parents[1]


def shoot(fig: go.Figure, out: Path, w: int, h: int) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("needs a headless Chromium (apt-get install chromium)")
    fig.update_layout(width=w, height=h)
    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "fig.html"
        fig.write_html(page, include_plotlyjs=True, full_html=True, config={"staticPlot": True})
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={w},{h}", f"--screenshot={out}", "--virtual-time-budget=4000",
                        page.as_uri()], check=True, capture_output=True, timeout=120)
    print("wrote", out)


def ratio_figure() -> go.Figure:
    """The paired slowdown (docs/glossary.md#paired-slowdown) per preset and M with no adapter active, from
    the canonical guards recording: 1 + (median paired difference sync - cpu_flag) / cpu_flag's median, each
    the two sessions' mean (`stats.between_sessions`), whiskers from the union of the sessions' 95 % intervals
    of that median difference (bar and whiskers from the same statistic). Not the ratio of medians of
    docs/results.md's guards table: another statistic of the same repetitions."""
    rec = load_guards()
    p = rec.paired("sync", "cpu_flag")
    p = p[p.active == 0]
    fig = go.Figure()
    for preset, g in p.groupby("preset"):
        r, lo, hi = (1 + g[c] / g.t_baseline_us for c in ("lost_us", "lost_lo95_us", "lost_hi95_us"))
        fig.add_bar(x=[str(m) for m in g.tokens], y=r, name=f"paired slowdown, {preset}",
                    error_y=dict(type="data", symmetric=False, array=hi - r, arrayminus=r - lo))
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title=f"48-layer forward, no adapter active: old sync guard vs CPU flag<br><sup>{rec.label}; "
                            "whiskers: the union of the sessions' paired-bootstrap 95 % intervals</sup>",
                      xaxis_title="tokens per forward (M)", yaxis_title="paired slowdown of sync (baseline: cpu_flag)",
                      barmode="group", yaxis_range=[0.8, 1.7], legend=dict(orientation="h", y=-0.25), margin=dict(t=90))
    return fig


def timeline_figure() -> go.Figure:
    t = trace.load_trace(DATA / "traces/qwen3-30b-a3b_sync_eager_M4096.json.gz")
    f = int(t.forwards.forward.iloc[-1])
    return plots.timeline(t, forward=f, title="guard=sync, 8 layers, M=4096 on an H200: one bubble after each .item()")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the two PNGs (default docs/)")
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    shoot(ratio_figure(), out / "guard_ratio.png", 1000, 480)
    shoot(timeline_figure(), out / "timeline_sync.png", 1400, 520)


if __name__ == "__main__":
    main()
