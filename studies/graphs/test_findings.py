"""The recorded graph-strategies comparison: its paired ratios, the table and the figure."""
from lora_moe_lab.model.graph_strategies import STRATEGIES
from lora_moe_lab.ui.graph_plots import strategies_figure
from studies.graphs import read


def test_recording_summary_table_and_figure():
    rec = read.strategies()
    assert rec.meta["commit"] and "H200" in rec.label
    s = rec.summary()
    assert set(s.variant) == set(STRATEGIES) | {"eager"}
    la = s[s.variant == "one_graph"]
    assert (la.vs_one_graph == 1).all() and (s.n >= 5).all()  # paired against itself; >= 5 reps
    assert (s.lo95_us <= s.median_us).all() and (s.median_us <= s.hi95_us).all()
    for model in ("moe", "decoder"):
        t = rec.table(model)
        assert list(t.strategy) == list(STRATEGIES)
        assert t.set_index("strategy").loc["per_active_count", "graphs"] == 4 * t.set_index("strategy").loc[
            "one_graph", "graphs"]  # buckets 0, 1, 2, 4 for 4 slots
    assert rec.switches.bit_exact_vs_same_graph_eager.all()
    fig = strategies_figure(rec, "moe")
    layout = fig.to_plotly_json()["layout"]
    titles = [layout[k]["title"]["text"] for k in layout if k.startswith(("xaxis", "yaxis"))]
    assert len(titles) == 4 and all(titles)
