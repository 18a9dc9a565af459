"""The replay study as recorded: the what-if bench reads the same validation, and the simulator's comparison
says `agrees` exactly where the two are within the bench's tolerance."""
from lora_moe_lab.sim import whatif as W
from studies.replay import read


def test_the_bench_reads_the_recorded_validation():
    assert W.validation().equals(read.validation())


def test_recorded_simulator_vs_replay():
    d = read.simulator_vs_replay()
    cmp_ = d[d["simulator_ms"].notna()]
    assert len(cmp_) and (cmp_["agrees"] == (cmp_["sim_vs_replay_pct"].abs() <= 100 * W.TOL)).all()
    assert not d.loc[d["simulator_ms"].isna(), "agrees"].any()
