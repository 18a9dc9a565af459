"""Every declared bound of every recording kind, probed just inside and just outside (schemas.KINDS).

The probes are generated from the declarations, so a column added to a kind is probed with no edit here:
    gt(v)           v itself is refused; the next float above v (an integer column: v + 1) passes
    ge(v)           v passes; the next float below v (an integer column: v - 1) is refused
    lt(v)           v itself is refused; the next float below v (an integer column: v - 1) passes
    le(v)           v passes; the next float above v (an integer column: v + 1) is refused
    in_range(a, b)  a and b pass; the next float below a and above b (1 + eps for a fraction) are refused
    isin(values)    each value passes; a value outside the set is refused
    an integer      2 passes, 1.5 is refused
    nullable        NaN passes only where the column is nullable
A valid row is built per kind; each probe changes one cell of it. The inside probes of every column must all pass
the schema; each outside probe must fail it on its own row and column, and the first one is read through `validate`,
which must name the row and the column. Columns share their declarations (`POS`, `FRACTION`, ...): the outside probes
of one declaration run once, in the first kind and column that carry it (a failing schema is slow to report), and the
pin below holds every column to its declaration.

Probes drawn from the declarations cannot see a declaration that changed (a positive column made non-negative is
then probed as non-negative), so the bounds are also pinned: tests/fixtures/schema_bounds.json holds each declared
column's bounds as they were reviewed. A changed bound fails until the pin is rewritten on purpose
(`python tests/instruments/analysers/test_schema_bounds.py`); a column or kind added later is probed, not pinned.
"""
import json
import math
import os
import sys

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.analysers.schemas import RecordingError

OUTSIDE_SET = "not-a-member"
PIN = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "schema_bounds.json")


def _is_integer(col) -> bool:
    return any(c.name == "<lambda>" and c.error == "an integer" for c in col.checks)


def _valid(col):
    """A value every check of the column accepts."""
    for c in col.checks:
        if c.name == "isin":
            return c.statistics["allowed_values"][0]
    return "x" if col.dtype is None else 1.0


def _probes(col) -> tuple[list, list]:
    """(inside, outside) values of one column, from its declared checks."""
    inside, outside = [], []
    integer = _is_integer(col)
    for c in col.checks:
        st = c.statistics
        if c.name == "greater_than":
            v = st["min_value"]
            inside.append(v + 1 if integer else math.nextafter(v, math.inf))
            outside.append(v)
        elif c.name == "greater_than_or_equal_to":
            v = st["min_value"]
            inside.append(v)
            outside.append(v - 1 if integer else math.nextafter(v, -math.inf))
        elif c.name == "less_than":
            v = st["max_value"]
            inside.append(v - 1 if integer else math.nextafter(v, -math.inf))
            outside.append(v)
        elif c.name == "less_than_or_equal_to":
            v = st["max_value"]
            inside.append(v)
            outside.append(v + 1 if integer else math.nextafter(v, math.inf))
        elif c.name == "in_range":
            lo, hi = st["min_value"], st["max_value"]
            assert st["include_min"] and st["include_max"], "an open range: add its probes here"
            inside += [lo, hi]
            outside += [math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)]
        elif c.name == "isin":
            inside += list(st["allowed_values"])
            outside.append(OUTSIDE_SET)
        elif c.name == "<lambda>" and c.error == "an integer":
            inside.append(2.0)
            outside.append(1.5)
        else:
            raise AssertionError(f"a check this test does not know how to probe: {c.name} {st}")
    (inside if col.nullable else outside).append(np.nan if col.dtype is not None else None)
    return inside, outside


def _frame(kind, cells) -> pd.DataFrame:
    """One row per (column, value): the kind's valid row with that one cell changed."""
    base = {n: _valid(col) for n, col in kind.schema.columns.items()}
    return pd.DataFrame([{**base, name: v} for name, v in cells] or [base], dtype=object)


def _first_carriers() -> set:
    """(kind, column) of the first column carrying each distinct declaration (its bounds, and whether numeric)."""
    seen, first = set(), set()
    for k, kind in S.KINDS.items():
        for n, col in kind.schema.columns.items():
            sig = (_bounds(col), col.dtype is None)
            if sig not in seen:
                seen.add(sig)
                first.add((k, n))
    return first


def _cells(kind, side: int, only=None):
    return [(n, v) for n, col in kind.schema.columns.items() if only is None or (kind.name, n) in only
            for v in _probes(col)[side]]


@pytest.mark.parametrize("name", list(S.KINDS))
def test_every_bound_just_inside_and_just_outside(name):
    kind = S.KINDS[name]
    first = _first_carriers()
    inside, outside = _cells(kind, 0), _cells(kind, 1, first)
    kind.schema.validate(_frame(kind, inside), lazy=True)  # every inside probe passes
    if outside:
        with pytest.raises(S.SchemaErrors) as ei:
            kind.schema.validate(_frame(kind, outside), lazy=True)
        fc = ei.value.failure_cases
        failed = {(c, int(i)) for i, c in zip(fc["index"], fc["column"]) if not pd.isna(i)}
        missed = [(i, cell) for i, cell in enumerate(outside) if (cell[0], i) not in failed]
        assert not missed, f"{name}: outside probes the schema accepted: {missed}"
    # the public reader names the row and the column of an outside probe
    col, value = (outside or _cells(kind, 1))[0]
    df = _frame(kind, [(col, value)])
    with pytest.raises(RecordingError) as ei:
        S.validate(df, kind, "probe.csv")
    assert ei.value.row == 1 and repr(col) in str(ei.value), str(ei.value)


def test_the_probes_cover_the_declared_bounds():
    """The declarations hold positive columns, non-negative ones, fractions and sets: each kind of probe runs."""
    names = {c.name for k in S.KINDS.values() for col in k.schema.columns.values() for c in col.checks}
    assert {"greater_than", "greater_than_or_equal_to", "in_range", "isin"} <= names
    _, out = _probes(S.KINDS["guards"].schema.columns["active"])  # a fraction: 1 + eps is refused
    assert out[1] == math.nextafter(1.0, 2.0) and out[0] < 0


def _bounds(col) -> str:
    """A column's declared bounds as short words: "gt 0", "ge 0", "lt 1", "le 1", "in [0, 1]", "isin [...]",
    "integer", "nullable"."""
    words = []
    for c in col.checks:
        st = c.statistics
        if c.name == "greater_than":
            words.append(f"gt {st['min_value']}")
        elif c.name == "greater_than_or_equal_to":
            words.append(f"ge {st['min_value']}")
        elif c.name == "less_than":
            words.append(f"lt {st['max_value']}")
        elif c.name == "less_than_or_equal_to":
            words.append(f"le {st['max_value']}")
        elif c.name == "in_range":
            words.append(f"in [{st['min_value']}, {st['max_value']}]")
        elif c.name == "isin":
            words.append(f"isin {st['allowed_values']}")
        elif c.error == "an integer":
            words.append("integer")
    return ", ".join(sorted(words + ["nullable"] * bool(col.nullable) + ["required"] * bool(col.required)))


def _declared() -> dict:
    return {k: {n: _bounds(col) for n, col in kind.schema.columns.items()} for k, kind in S.KINDS.items()}


def test_the_declared_bounds_are_the_pinned_ones():
    with open(PIN) as f:
        pinned = json.load(f)
    declared = _declared()
    changed = [f"{k}.{c}: pinned {b}, declared {declared.get(k, {}).get(c, 'nothing')}"
               for k, cols in pinned.items() for c, b in cols.items() if declared.get(k, {}).get(c) != b]
    assert not changed, "declared bounds differ from tests/fixtures/schema_bounds.json:\n" + "\n".join(changed)


if __name__ == "__main__":  # rewrite the pin from the declarations (after a reviewed change of a bound)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    with open(PIN, "w") as f:
        json.dump(_declared(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.normpath(PIN)}")
