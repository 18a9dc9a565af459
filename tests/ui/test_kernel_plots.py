"""The kernel figures of notebook 02 draw what the recordings hold, with titles and axis titles."""
from lora_moe_lab.instruments.analysers import base_gemm
from lora_moe_lab.ui.kernel_plots import fold_figure


def test_fold_figure_draws_both_builds_where_the_run_has_them():
    t = base_gemm.fold_table()
    fig = fold_figure(t)
    names = [tr.name for tr in fig.data]
    assert len(names) == 2 * t.groupby(["preset", "op"]).ngroups
    assert any(n.endswith("rows_ptr") for n in names) and any(n.endswith(" folded") for n in names)
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    old = fold_figure(base_gemm.fold_table(base_gemm.load_fold_run("fold_s2")))  # no layer build timed then
    assert all(tr.name.endswith(" folded") for tr in old.data)
