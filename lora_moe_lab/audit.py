"""The sync audit, priced: the face a user imports, and its command line.

    from lora_moe_lab.audit import audit
    rep = audit(model, x)          # every sync counted, classified, sited; on a GPU each site priced
    print(rep.summary())

    python -m lora_moe_lab.audit mypkg.models:forward --inputs mypkg.models:make_inputs [--focus transformers]
                                 [--timeout 60] [--csv audit.csv]

    %load_ext lora_moe_lab.audit   # in IPython: %sync_audit EXPR and a %%sync_audit cell

The audit itself (instruments/recorders/audit.py) detects and times; the price of removing a site's
syncs comes from the replay engine (sim/sync_savings.py), a layer above it. This module sits above
both and hands the one to the other, and every import points down.
"""
from __future__ import annotations

from .instruments.recorders.audit import (AuditError, AuditInternalError, AuditReport, AuditTimeout, FocusError,
                                          NotCallableError, SpecError)
from .instruments.recorders.audit import audit as _audit
from .instruments.recorders.audit import main as _cli_main
from .sim.sync_savings import estimate

__all__ = ["audit", "estimate", "main", "AuditReport", "AuditError", "FocusError", "AuditTimeout",
           "AuditInternalError", "NotCallableError", "SpecError"]


def audit(fn=None, *args, estimator=estimate, **kw):
    """instruments.recorders.audit.audit with the replay engine's saving estimate (estimator=None: no price)."""
    return _audit(fn, *args, estimator=estimator, **kw)


def load_ipython_extension(ip):  # `%load_ext lora_moe_lab.audit`
    from .nb import audit_magic
    audit_magic.load_ipython_extension(ip)


def main(argv=None) -> int:
    """The audit's command line (instruments/recorders/audit.py), priced by the replay engine on a GPU."""
    return _cli_main(argv, estimator=estimate, prog="python -m lora_moe_lab.audit")


if __name__ == "__main__":
    raise SystemExit(main())
