"""Helpers the tests share (imported as `from helpers import ...`: tests/ is on the path)."""
import os

import pytest
import torch

from lora_moe_lab.ops.reference import rel, tolerance

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))  # the checkout


def rel_err(a, b):
    """ops.reference.rel on the CPU (the one relative-error measure)."""
    return rel(a.double().cpu(), b.double().cpu())


def fp32_tol(device):
    """The fp32 tolerance (ops/reference.py: fp32 exact paths < 1e-5; fp32 on GPU with tf32 dots < 5e-3)."""
    return tolerance(torch.float32, device)


def load_script(name: str):
    """A study's script as a module ("studies.kernels.record_base"), or scripts/<name>.py (the tools, not a
    package): tests call its functions."""
    import importlib
    import importlib.util

    if "." in name:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_cli_refused(main, argv, msg: str, capsys, absent=()) -> None:
    """main(argv) stops with argparse's exit code 2 before any work: `msg` is on stderr and none of the
    `absent` paths (the run's --out) was created (the bad-argument cases of the recorders' CLIs)."""
    import pytest

    with pytest.raises(SystemExit) as e:
        main(list(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err, err
    for p in absent:
        assert not os.path.exists(p), p


SYNC_MSG = "called a synchronizing CUDA operation"  # what torch's sync debug mode says


def fake_sync_op(state: dict, dispatch: bool = False, raise_on_error: bool = True, file: str = "_fake_sync.py"):
    """What torch does at a sync under its debug mode, seen from Python: a warning ("warn") or an
    error ("error", with `raise_on_error`) raised inside a torch frame. Compiled under a file name
    inside torch's package, so the sync tools count its frames as library code. `dispatch`: the
    op goes through the active TorchFunctionMode first (as a torch function does), so it is
    raised with the mode's own frame on the stack."""
    import warnings

    src = ["def sync_op(x=None):"]
    if dispatch:
        src += ["    if x is not None and torch.overrides.has_torch_function((x,)):",
                "        return torch.overrides.handle_torch_function(sync_op, (x,), x)"]
    src += ["    if state['mode'] == 'warn':", "        warnings.warn(MSG, UserWarning)"]
    if raise_on_error:
        src += ["    elif state['mode'] == 'error':", "        raise RuntimeError(MSG)"]
    ns = {"warnings": warnings, "state": state, "MSG": SYNC_MSG, "torch": torch}
    exec(compile("\n".join(src) + "\n", os.path.join(os.path.dirname(torch.__file__), file), "exec"), ns)
    return ns["sync_op"]


def fake_cuda_debug_mode(monkeypatch) -> dict:
    """A CPU machine that says it has CUDA, with torch's sync debug mode faked: returns the state
    ({"mode": the mode set now, "modes": every mode set, in order}). The library's guard counter
    is switched off, so only the (fake) debug mode reports syncs."""
    from lora_moe_lab import runtime
    from lora_moe_lab.instruments.recorders import syncs

    state = {"mode": 0, "modes": []}

    def set_mode(m):
        state["mode"] = m
        state["modes"].append(m)

    monkeypatch.setattr(runtime, "has_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: state["mode"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(syncs, "_guard_sync_events", None)
    return state


def write_kernel_run(tmp_path, name="run_x"):
    """A small kernel run (layer_paired and sweep rows) written as <name>_kernels_expand.csv + .meta.json, loaded."""
    import json

    import pandas as pd

    from lora_moe_lab.instruments.analysers.recordings import load_kernel_run

    rows = [dict(section="layer_paired", preset="p", M=512, base=400.0, lora_all_active=500.0, lora_share=0.25,
                 lora_share_p10=0.24, lora_share_p90=0.26),
            dict(section="sweep", preset="p", M=512, op="gate_up", table=True, bytes=2e8, bw_frac=0.8, regs=128,
                 grid=528, prefetch=0, time_us=60.0, config="a"),
            dict(section="sweep", preset="p", M=512, op="down", table=True, bytes=1e8, bw_frac=0.7, regs=139,
                 grid=396, prefetch=2, time_us=40.0, config="b"),
            dict(section="sweep", preset="p", M=512, op="down", table=False, bytes=1e8, bw_frac=0.5, regs=150,
                 grid=264, prefetch=1, time_us=55.0, config="c")]
    pd.DataFrame(rows).to_csv(tmp_path / f"{name}_kernels_expand.csv", index=False)
    (tmp_path / f"{name}_kernels_expand.meta.json").write_text(json.dumps(dict(gpu="NVIDIA H200", commit="abc1234",
                                                                               date="2026-11-30", copy_gbps=4000.0)))
    return load_kernel_run(name, tmp_path)


# --- sync-freedom by the audit's count (instruments/recorders/audit.py) ------------------------------
GUARD_SYNC_SITE = "lora_moe_lab/model/guards.py"  # where the `sync` guard's designed `.item()` lives


def audit_forwards(monkeypatch, model) -> list:
    """Every later call of `model` audited on its own (`with audit()` around its forward: the CPU count on a CPU,
    torch's sync debug mode with it on a GPU); returns the list the reports are appended to. The batch building
    around the forward is not audited (the checked regions cover it)."""
    from lora_moe_lab.instruments.recorders.audit import audit

    reports, forward = [], model.forward

    def audited(*a, **k):
        with audit() as rep:
            out = forward(*a, **k)
        reports.append(rep)
        return out

    monkeypatch.setattr(model, "forward", audited)
    return reports


def syncs_beyond_guards(reports: list, guard_syncs: int) -> list:
    """The audited syncs that are not the designed guard syncs ("site kind" strings, empty when sync-free), after
    checking that the guard syncs are exactly `guard_syncs` per forward (the `sync` guard: one per guard site)."""
    assert reports, "no forward was audited"
    extra = []
    for rep in reports:
        guard = [e for e in rep.events if e.site.startswith(GUARD_SYNC_SITE + ":") and e.kind == "item"]
        assert len(guard) == guard_syncs, f"{len(guard)} guard syncs in a forward, expected {guard_syncs}"
        extra += [f"{e.site} {e.kind} ({e.op})" for e in rep.events if e not in guard]
    return extra


def catalog_naming(monkeypatch, tmp_path, **entries) -> None:
    """The data catalog replaced by one that names only `entries` (key -> an absolute path, or a list of them; a key
    with dots passed as `replay__validation`): a loader's default read must then follow it."""
    import json

    from lora_moe_lab import provenance
    from lora_moe_lab.instruments.analysers import schemas

    doc = {k.replace("__", "."): ({"paths": [str(p) for p in v]} if isinstance(v, list) else {"path": str(v)})
           | {"what": "a test's catalog"} for k, v in entries.items()}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(doc))
    # It stands in for data/catalog.json, which must be sealed: sealed as scripts/seal_recordings.py seals that one.
    schemas.write_seal(path, schemas.file_meta_path(path))
    monkeypatch.setattr(provenance, "CATALOG", path)


def covering(*dims, splice=()):
    """Parameter sets for `pytest.mark.parametrize("a,b,...", covering(A, B, ...))` over the product of A, B, ...:
    `make test` runs a covering set, the k-th case taking each list's k-th value (wrapping), so that every value of
    every list runs at least once; the rest of the product is marked slow (the GPU check runs it natively, `make
    test-all` here). For the kernels' tests under the interpreter, where one case costs seconds of CPU. The values
    of the lists at the positions in `splice` are tuples of several arguments, spliced in place."""
    import itertools

    import pytest

    dims = [list(d) for d in dims]
    cover = {tuple(k % len(d) for d in dims) for k in range(max(len(d) for d in dims))}
    def values(idx):
        out = []
        for j, (d, i) in enumerate(zip(dims, idx)):
            out += list(d[i]) if j in splice else [d[i]]
        return out
    return [pytest.param(*values(idx), marks=() if idx in cover else pytest.mark.slow)
            for idx in itertools.product(*(range(len(d)) for d in dims))]


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests (the transformers corpora: a model built per case, where thread
    start-up costs more than the work), restored after. Import it and use it autouse: `pytestmark =
    pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
