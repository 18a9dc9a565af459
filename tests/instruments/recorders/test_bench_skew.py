"""The router skew in sweeps: a key column and a --skew option; CSVs written before the column
load as skew 0, and resuming one asks for a new file."""
import json

import pandas as pd
import pytest

from lora_moe_lab.instruments.recorders import bench
from lora_moe_lab.instruments.recorders.bench import COLUMNS, SweepSpec, run_sweep

TINY = dict(presets=["tiny"], tokens=[8], guards=["cpu_flag"], active=[0.5], warmup=0, reps=1, device="cpu",
            requests=2)


def test_skew_is_a_key_column_and_in_the_meta(tmp_path):
    out = tmp_path / "s.csv"
    df = run_sweep(SweepSpec(**TINY, skews=[0.0, 1.0]), out, progress=False)
    assert list(df.columns) == COLUMNS and sorted(df["skew"]) == [0.0, 1.0] and df["error"].isna().all()
    assert json.loads(bench._meta_path(out).read_text())["sessions"][0]["spec"]["skews"] == [0.0, 1.0]
    assert len(bench.summary_table(df)) == 2
    # resume knows both rows
    assert len(run_sweep(SweepSpec(**TINY, skews=[0.0, 1.0]), out, resume=True, progress=False)) == 2


def test_old_csv_without_skew_loads_as_skew_zero_and_is_not_resumed(tmp_path):
    out = tmp_path / "old.csv"
    run_sweep(SweepSpec(**TINY), out, progress=False)
    pd.read_csv(out).drop(columns="skew").to_csv(out, index=False)  # the schema before skew
    assert (bench.load_sweep(out)["skew"] == 0.0).all()
    with pytest.raises(ValueError, match="write to a new file"):
        run_sweep(SweepSpec(**TINY), out, resume=True, progress=False)


def test_skew_cli_option(capsys):
    a = bench.build_parser().parse_args(["sweep", "--skew", "0", "1.5", "--out", "x.csv"])
    assert a.skew == [0.0, 1.5]
    for bad in ("-1", "nan", "many"):
        with pytest.raises(SystemExit):
            bench.build_parser().parse_args(["sweep", "--skew", bad, "--out", "x.csv"])
        assert "skew must be" in capsys.readouterr().err
    with pytest.raises(ValueError, match="skew must be"):
        SweepSpec(**TINY, skews=[-1.0]).resolved()
