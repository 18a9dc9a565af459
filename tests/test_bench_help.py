"""`bench --help` gives a worked example that works: every example command of its epilog parses with the real
parser, and the CPU example (the tiny preset, the torch backend) runs as printed, then `lost` reads its CSV."""
import shlex

import pandas as pd
import pytest

from lora_moe_lab.instruments.recorders import bench

PROG = "python -m lora_moe_lab.instruments.recorders.bench"


def _examples() -> list[list[str]]:
    """The epilog's commands, continuation lines joined and trailing comments dropped, without the program."""
    joined = bench.EXAMPLES.replace("\\\n", " ")
    cmds = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(PROG):
            cmds.append(shlex.split(line[len(PROG):]))
    return cmds


def test_the_epilog_has_the_cpu_example_first():
    cmds = _examples()
    assert len(cmds) >= 4, cmds
    assert cmds[0][0] == "sweep" and "tiny" in cmds[0] and cmds[0][cmds[0].index("--backend") + 1] == "torch"
    assert cmds[1] == ["lost", cmds[0][cmds[0].index("--out") + 1]], "the second example reads the first one's CSV"
    assert bench.build_parser().epilog == bench.EXAMPLES


@pytest.mark.parametrize("i", range(len(_examples())))
def test_every_example_parses(i):
    args = bench.build_parser().parse_args(_examples()[i])
    assert args.cmd in ("sweep", "lost", "meta")


def test_the_cpu_example_runs_as_printed(tmp_path, monkeypatch, capsys):
    sweep, lost = _examples()[:2]
    monkeypatch.chdir(tmp_path)  # its --out (build/tiny.csv) is relative: written under tmp_path
    assert bench.main(sweep + ["--no-progress"]) == 0
    out = tmp_path / sweep[sweep.index("--out") + 1]
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df.guard) == {"sync", "cpu_flag"}  # 2 token counts x 2 guards, as the epilog says
    syncs = df.groupby("guard").syncs_per_forward.unique()
    assert list(syncs["sync"]) == [2] and list(syncs["cpu_flag"]) == [0]  # one per layer; none
    assert (df.backend == "torch").all()
    capsys.readouterr()
    assert bench.main(lost) == 0
    assert "us_per_sync" in capsys.readouterr().out
