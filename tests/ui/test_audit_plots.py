"""The audit's figures from a CPU audit: a timeline with every sync marked, a table sorted by cost."""

from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from lora_moe_lab.instruments.recorders.audit import audit
from lora_moe_lab.ui import audit_plots as AP


def test_figures_from_a_cpu_audit():
    rep = audit(HS.build("mamba_mask", HS.Size.smoke(), "cpu").original, warmup=0, profile=False, device="cpu")
    tl = AP.timeline_figure(rep)
    assert sum(len(t.x) for t in tl.data) == 6 and tl.layout.xaxis.title.text and tl.layout.yaxis.title.text
    tab = AP.cost_table_figure(rep)
    assert list(tab.data[0].cells.values[2]) == list(rep.table()["kind"])
