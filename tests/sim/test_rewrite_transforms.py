"""drop_calls / repeat_calls (sim/replay_transforms.py): a rewrite's ops deleted or added in a replay graph,
checked against remove_syncs and against themselves on the synthetic model traces (known answers)."""
import sys
from pathlib import Path

import numpy as np
import pytest

from lora_moe_lab.sim import replay as R
from lora_moe_lab.sim import replay_transforms as X

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from synth_traces import model_trace  # noqa: E402


@pytest.fixture(scope="module")
def plain():
    s, _ = model_trace("sync", n_forwards=2)
    return R.build_graph(s, forward=1)


def test_dropping_each_sync_and_its_copy_is_remove_syncs(plain):
    h = plain.host
    sync = np.nonzero(h["kind"] == R.SYNC)[0]
    d2h = {int(plain.kern["host"][i]) for i, n in enumerate(plain.kern["name"]) if "DtoH" in str(n)}
    calls = [c for s in sync for c in (s - 1, s) if c == s or c in d2h]
    a, b = X.drop_calls(plain, calls), X.remove_syncs(plain, which="all")
    assert a.n_host == b.n_host and a.n_syncs == 0
    assert R.replay(a).step_ns[0] == R.replay(b).step_ns[0]


def test_a_repeated_call_adds_its_launch_and_dropping_it_restores_the_step(plain):
    k = plain.kern
    c = int(k["host"][np.argmax(k["dur"])])  # a call that launches a kernel
    n_k = int((k["host"] == c).sum())
    g = X.repeat_calls(plain, [c])
    assert g.n_host == plain.n_host + 1 and g.n_kernels == plain.n_kernels + n_k and g.n_syncs == plain.n_syncs
    assert R.replay(g).step_ns[0] > R.replay(plain).step_ns[0]  # one more kernel of the longest kind
    back = X.drop_calls(g, [c + 1])
    assert R.replay(back).step_ns[0] == R.replay(plain).step_ns[0]


def test_a_repeated_sync_is_issued_as_a_plain_call(plain):
    s = int(np.nonzero(plain.host["kind"] == R.SYNC)[0][0])
    g = X.repeat_calls(plain, [s])
    assert g.n_syncs == plain.n_syncs and g.n_host == plain.n_host + 1


def test_calls_out_of_range_are_named(plain):
    with pytest.raises(R.GraphError, match="drop_calls: calls must be host-call indices"):
        X.drop_calls(plain, [plain.n_host])
    with pytest.raises(R.GraphError, match="repeat_calls"):
        X.repeat_calls(plain, [-1])
    assert X.apply(plain, "drop_calls", calls=[]).n_host == plain.n_host


def test_shortening_a_gap_moves_the_host_by_exactly_that_much(plain):
    """A host-only op deleted: with the host the bottleneck (no sync, no queue wait in between), its time
    comes off the step one for one; a gap never goes negative; bad input is named."""
    c = int(np.argmax(plain.host["gap"]))
    gap = int(plain.host["gap"][c])
    g = X.shorten_gaps(plain, [c], gap // 2)
    assert int(g.host["gap"][c]) == gap - gap // 2 and g.n_host == plain.n_host
    assert int(X.shorten_gaps(plain, [c], 10 * gap).host["gap"][c]) == 0
    # the host's own span (gaps + calls, syncs' waits aside) shrinks by the removed time
    span = lambda x: int(x.host["gap"].sum() + x.host["dur"].sum())  # noqa: E731
    assert span(plain) - span(g) == gap // 2
    assert R.replay(g).step_ns[0] <= R.replay(plain).step_ns[0]
    with pytest.raises(R.GraphError, match="shorten_gaps"):
        X.shorten_gaps(plain, [c], -1)
    with pytest.raises(R.GraphError, match="shorten_gaps"):
        X.shorten_gaps(plain, [plain.n_host], 1)
