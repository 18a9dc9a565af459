"""The audit against every MoE family of the installed transformers, found without a hand list
(tests/third_party/families.py: each package of transformers.models whose configuration names an expert
count, built tiny from its own config class), held to an independent count (tests/third_party/oracle.py:
a TorchDispatchMode of its own, sharing no code with the audit): per (site, kind) equal, so 0 false
positives, 0 missed, 0 crashes, and the CPU-only checks listed apart exactly where the oracle finds them.

CI runs a rotating subset (ROTATION families, chosen by the UTC date, so a day's runs agree); the whole
set runs with SYNC_AUDIT_CORPUS=all (about a minute on a CPU; also each CANNOT_BUILD entry is checked to
still fail), or name families: SYNC_AUDIT_CORPUS=qwen3_moe,mixtral."""

from __future__ import annotations

import datetime
import os
from collections import Counter

import pytest
import torch

from lora_moe_lab.instruments.recorders.audit import audit

transformers = pytest.importorskip("transformers")
from tests.third_party import corpus as C  # noqa: E402
from tests.third_party import families as F  # noqa: E402
from tests.third_party.oracle import Oracle  # noqa: E402
from helpers import one_thread  # noqa: E402,F401  (the fixture, used below)

pytestmark = pytest.mark.usefixtures("one_thread")

ROTATION = 2
FAMILIES = F.families()
BUILDABLE = [f for f in FAMILIES if f not in F.CANNOT_BUILD]
_ENV = os.environ.get("SYNC_AUDIT_CORPUS", "")


def _selected() -> list[str]:
    if _ENV == "all":
        return BUILDABLE
    if _ENV:
        return _ENV.split(",")
    start = datetime.datetime.now(datetime.timezone.utc).date().toordinal() * ROTATION % max(len(BUILDABLE), 1)
    return [BUILDABLE[(start + i) % len(BUILDABLE)] for i in range(min(ROTATION, len(BUILDABLE)))]



def test_every_family_is_run_or_named_with_its_reason():
    assert set(C.BUILDERS) <= set(FAMILIES), "the automatic enumeration misses a family of the hand list"
    # a family the list names but this transformers lacks is stale only at the version the project pins (CI's); an
    # older transformers (a GPU machine's own) lacks the families added since
    import re
    from pathlib import Path

    import transformers
    pinned = re.search(r'"transformers==([^"]+)"', (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    if pinned and transformers.__version__ == pinned.group(1):
        stale = set(F.CANNOT_BUILD) - set(FAMILIES)
        assert not stale, f"stale CANNOT_BUILD entries: {stale}"
    assert all(F.CANNOT_BUILD.values()) and set(F.OVERRIDES) <= set(BUILDABLE)
    assert set(_selected()) <= set(BUILDABLE), f"not a buildable family: {set(_selected()) - set(BUILDABLE)}"


def measure(fam: str, impl: str = "eager") -> tuple[Counter, Counter, Counter, Counter]:
    """(expected {(site, kind)}, audit's, expected CPU-only {site}, audit's) of one forward of the tiny model."""
    model, ids, _ = F.build(fam, impl)
    with Oracle(model, ids) as o:
        y = F.forward(model, ids)
    rep = audit(lambda: F.forward(model, ids), warmup=0, profile=False, focus="transformers", device="cpu")
    got = Counter((e.site, "item" if e.kind == "index0d" else e.kind) for e in rep.events)
    assert torch.equal(F.forward(model, ids), y)  # the audit changes no result
    return o.syncs, got, o.cpu_only, Counter(e.site for e in rep.cpu_only)


@pytest.mark.parametrize("fam", _selected())
def test_family_counts_equal_the_independent_count(fam):
    exp, got, exp_cpu, got_cpu = measure(fam)
    false_pos, missed = got - exp, exp - got
    assert not false_pos and not missed, f"{fam}: false positives {dict(false_pos)}, missed {dict(missed)}"
    assert got_cpu == exp_cpu, (fam, dict(got_cpu), dict(exp_cpu))
    assert all(s.startswith("transformers/") for s, _ in got), f"{fam}: a site outside transformers: {got}"


@pytest.mark.parametrize("fam", sorted(F.CANNOT_BUILD) if _ENV == "all" else [])  # the whole corpus only
def test_cannot_build_entries_still_fail(fam):
    with pytest.raises(Exception):
        model, ids, _ = F.build(fam)
        F.forward(model, ids)


@pytest.mark.parametrize("fam", BUILDABLE if _ENV == "all" else [])  # the whole corpus only
def test_family_default_experts_equal_the_independent_count(fam):
    try:
        exp, got, exp_cpu, got_cpu = measure(fam, "grouped_mm")  # float32: ATen's fallback reads its offsets
    except ValueError as e:
        if "does not support setting experts implementation" not in str(e):
            raise
        pytest.skip(f"{fam} has one experts implementation (its eager run is the test above): {e}")
    assert got == exp and got_cpu == exp_cpu, (fam, dict(got - exp), dict(exp - got))
