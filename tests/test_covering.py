"""The CI subset of the interpreter-heavy kernel tests (helpers.covering): every value of every list runs in `make
test`, the whole product is still collected (the GPU check and `make test-all` run it)."""
import itertools

from helpers import covering


def test_covering_runs_every_value_and_keeps_the_whole_product():
    dims = [["a", "b", "c"], [1, 2], [(0, "x"), (1, "y"), (2, "z"), (3, "w")]]
    params = covering(*dims, splice=(2,))
    assert len(params) == 3 * 2 * 4
    assert sorted(tuple(p.values) for p in params) == sorted((a, b, *c) for a, b, c in itertools.product(*dims))
    fast = [p.values for p in params if not p.marks]
    assert len(fast) == 4  # the longest list's length
    for j, d in enumerate([["a", "b", "c"], [1, 2], [0, 1, 2, 3]]):
        assert {v[j] for v in fast} == set(d)
    assert all(m.name == "slow" for p in params for m in p.marks)
