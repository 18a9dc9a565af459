"""The sync audit, priced: the face a user imports, and its command line.

    from lora_moe_lab.audit import audit
    rep = audit(model, x)          # every sync counted, classified, sited; on a GPU each site priced
    print(rep.summary())

    python -m lora_moe_lab.audit mypkg.models:forward --inputs mypkg.models:make_inputs [--focus transformers]

    %load_ext lora_moe_lab.audit   # in IPython: %sync_audit EXPR and a %%sync_audit cell

The audit itself (instruments/recorders/audit.py) detects and times; the price of removing a site's
syncs comes from the replay engine (sim/sync_savings.py), a layer above it. This module sits above
both and hands the one to the other, and every import points down.
"""
from __future__ import annotations

import argparse
import sys

from .instruments.recorders.audit import AuditError, AuditReport, FocusError, SpecError, call_args, resolve
from .instruments.recorders.audit import audit as _audit
from .sim.sync_savings import estimate

__all__ = ["audit", "estimate", "main", "AuditReport", "AuditError", "FocusError"]


def audit(fn=None, *args, estimator=estimate, **kw):
    """instruments.recorders.audit.audit with the replay engine's saving estimate (estimator=None: no price)."""
    return _audit(fn, *args, estimator=estimator, **kw)


def load_ipython_extension(ip):  # `%load_ext lora_moe_lab.audit`
    from .nb import audit_magic
    audit_magic.load_ipython_extension(ip)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lora_moe_lab.audit",
        description=(
            "Audit the host-device syncs of a forward: each sync's line, kind, count per call, host time "
            "blocked, GPU idle after it and (on a GPU) the replay's estimate of the saving."
        ),
    )
    ap.add_argument("callable", help="module:callable to audit, e.g. mypkg.models:forward")
    ap.add_argument("--inputs", help="module:factory returning its arguments (tuple, dict or one value)")
    ap.add_argument("--warmup", type=int, default=1, help="plain calls first (default 1)")
    ap.add_argument("--reps", type=int, default=1, help="audited calls (default 1)")
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--focus", help="site each sync at its innermost frame in this package (e.g. transformers), "
                    "or 'user' for the caller's own lines (default: the innermost frame outside torch)")
    a = ap.parse_args(argv)
    try:
        fn = resolve(a.callable)
        factory = resolve(a.inputs, "inputs") if a.inputs else None
        args, kw = call_args(factory)
    except SpecError as e:
        print(f"audit: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    try:
        rep = audit(fn, *args, warmup=a.warmup, reps=a.reps, focus=a.focus, **kw)
    except (FocusError, AuditError) as e:
        print(f"audit: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(rep.summary())
    if a.csv:
        rep.table().to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
