"""A corpus of damaged and foreign recordings: each is refused with a RecordingError naming the file, the row (or
"header" / "meta") and what is wrong (lora_moe_lab/instruments/analysers/schemas.py). The damaged files are copies of
the real ones in data/ (with their metadata and seals), made in tmp_path; the renderer and a second checkout run in a
copy of the tree."""
from __future__ import annotations

import gzip
import json
import shutil
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import hidden_sync_runs, production_runs, recordings
from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.analysers.schemas import RecordingError

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "data"

# kind -> (a real file of it under data/, a numeric column that must be > 0 (or >= 0), a column the schema requires)
CORPUS = {
    "guards": ("guards/h200_guards_s1.csv", "us", "us"),
    "graph_capture": ("graphs/strategies_capture.csv", "capture_s", "capture_s"),
    "graph_replay": ("graphs/strategies_replay.csv", "us", "us"),
    "graph_switches": ("graphs/strategies_switches.csv", "rel_err_vs_eager", "rel_err_vs_eager"),
    "kernel_run": ("kernels/expand_run7_kernels_expand.csv", "time_us", "section"),
    "kernel_tidy": ("kernels/shrink_order.csv", "M", "session"),
    "prefill": ("production/tp2_C16384_gs1.csv", "prefill_ms", "prefill_ms"),
    "prefill_summary": ("production/tp2_C16384_gs1.summary.csv", "prefill_ms", "prefill_ms"),
    "production_task": ("production/signature_s1/default_C8192.csv", "prefill_ms", "task"),
    "production_summary": ("production/signature_s1/default_C8192.summary.csv", "prefill_ms", "prefill_ms"),
    "production_signature": ("production/signature_s1/default_C8192.signature.csv", "host_blocked_ms", "forward"),
    "production_syncs": ("production/signature_s1/default_C8192.syncs.csv", "host_blocked_us", "sync_index"),
    "bench_sweep": (None, "median_us", "rank"),  # no sweep in data/: a small one is written (bench.py COLUMNS)
    "audit_priced": ("audit_corpus/priced.csv", "eager_us", "model"),
    "audit_sites": ("audit_corpus/sites.csv", "count", "site"),
    "hidden_syncs": ("hidden_syncs/hidden_syncs_s1.csv", "occurrences", "pattern"),  # its times are NaN where unstable
    "kernel_resources": ("kernels/kernel_resources.csv", "regs", "tile"),
    "kernel_recording": ("kernels/kernels.csv", "time_us", "section"),
    "kernel_peers": ("kernels/peers_carried.csv", "time_us", "engine"),
    "backends": ("backends/backends.csv", "rel_err", "rel_err"),
    "clocks": ("production/signature_s2/clocks.csv", "t_unix", "t_unix"),
    "replay_reproduction": ("replay/reproduction.csv", "traced_ms", "trace"),
    "replay_vs_simulator": ("replay/simulator_vs_replay.csv", "layers", "quantity"),
    "replay_validation": ("replay/validation.csv", "measured_ms", "target"),
    "simulator_validation": ("simulator/simulator_validation.csv", "median_us", "guard"),
    "simulator_vs_production": ("simulator/simulator_vs_production.csv", "tokens", "metric"),
    "probe": ("probe/probe_p2.csv", "host_us_per_layer", "host_us_per_layer"),
    "probe_points": ("probe/points.csv", "host_us_per_layer", "session"),
    "probe_validation": ("probe/validation.csv", "lead_us", "host"),
    "tp_prediction": ("tp_emulation/prediction.csv", "sessions", "metric"),
    "tp_validation": ("tp_emulation/validation.csv", "measured", "point"),
    "traces_summary": ("traces/traces_summary.csv", "n_forwards", "file"),
    "lora_tax": ("lora_tax/lora_tax.csv", "t_lora_floor_ms", "regime"),
    "lora_tax_reps": ("lora_tax/lora_tax_reps.csv", "ms", "arm"),
    "lora_tax_base_floor": ("lora_tax/base_floor.csv", "floor_us", "op"),
    "lora_tax_base_layer": ("lora_tax/base_layer.csv", "us", "part"),
    "lora_tax_host": ("lora_tax/lora_tax_host.csv", "off_us_per_layer", "device"),
    "lora_tax_ncu": ("lora_tax/lora_tax_ncu.csv", "duration_us", "kernel"),
    "own_rank": ("lora_tax/own_rank.csv", "own_ms", "session"),
}
FOREIGN = {"guards": "hidden_syncs/hidden_syncs_s1.csv", "kernel_tidy": "hidden_syncs/hidden_syncs_s1.csv"}
# tables with no unique key (samples that may repeat; a trace name in two sessions' folders): the seal catches it
NO_KEY = {"clocks", "replay_reproduction"}
SPARSE = {"kernel_run", "kernel_tidy", "kernel_recording", "bench_sweep"}  # wide tables: a number may be empty
TEXT = {"kernel_tidy": dict(dtype=str, keep_default_na=False)}  # how its reader (studies/kernels/tidy.py) reads it


def _bench_sweep(d: Path) -> Path:
    from lora_moe_lab.instruments.recorders.bench import COLUMNS

    rows = []
    for i, tokens in enumerate((16, 64, 256, 1024)):
        r = dict(gpu="NVIDIA H200", torch="2.11.0", triton="3.6.0", cuda="13.0", python="3.12.3", commit="abc1234",
                 date="2026-12-01T00:00:00Z", preset="tiny", layers=2, tokens=tokens, guard="sync", active=0.5,
                 rank=16, mode="eager", dtype="bfloat16", backend="triton", requests=8, skew=0.0, warmup=2, reps=10,
                 median_us=100.0 + i, p10_us=99.0 + i, p90_us=101.0 + i, mean_us=100.0 + i, wall_median_us=110.0 + i,
                 timer="cuda_events", syncs_per_forward=2, error="", seed=0, device="cuda")
        rows.append([r.get(c, "") for c in COLUMNS])
    f = d / "sweep.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(f, index=False)
    S.write_seal(f, kind="bench_sweep")  # -> sweep.meta.json
    return f


def _copy(kind: str, tmp: Path) -> Path:
    """The kind's real file and its metadata (with the seal) copied into tmp, in the layout its kind expects."""
    rel = CORPUS[kind][0]
    if rel is None:
        return _bench_sweep(tmp)
    src = DATA / rel
    dst = tmp / src.name
    shutil.copy(src, dst)
    mp = S.meta_path(src, kind)
    assert mp.is_file() and S._seal_in(S.read_json(mp), src.name), f"{src} is not sealed (scripts/seal_recordings.py)"
    shutil.copy(mp, tmp / mp.name)
    return dst


def _table(f: Path) -> pd.DataFrame:
    return pd.read_csv(f, dtype=str, keep_default_na=False)  # every cell as its text: only the damage changes


def _write(f: Path, df: pd.DataFrame, kind: str, reseal: bool = True) -> None:
    df.to_csv(f, index=False)
    if reseal:  # a writer that wrote bad rows and sealed them: the schema must catch it, not the seal
        S.write_seal(f, kind=kind)


def _row(df: pd.DataFrame, col: str) -> int:
    """A data row (0-based) in the file's second half with a value in `col`."""
    ok = [i for i in range(len(df) // 2, len(df)) if df[col].iloc[i] != ""]
    return ok[0]


def _read(f: Path, kind: str):
    return S.read_csv(f, kind, **TEXT.get(kind, {}))


DAMAGES = ["half", "mid_row", "duplicated", "column_missing", "wrong_type", "out_of_range", "nan", "foreign",
           "empty", "meta_bad_json", "meta_wrong_sha", "meta_wrong_rows"]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", list(CORPUS))
def test_damaged_recording_is_refused_by_name(kind, damage, tmp_path):
    f = _copy(kind, tmp_path)
    _, num, req = CORPUS[kind]
    data = f.read_bytes()
    lines = data.splitlines(keepends=True)
    n = len(lines) - 1
    expect: list[str]
    if damage == "half":
        f.write_bytes(data[: len(data) // 2])
        expect = ["row "]
    elif damage == "mid_row":
        f.write_bytes(data[:-7])  # the last row cut inside its last cells
        expect = ["row ", "no newline"]
    elif damage == "duplicated":
        k = min(40, n)
        f.write_bytes(data + b"".join(lines[-k:]))
        if kind in NO_KEY:  # no key: the seal says rows were appended
            expect = [f"row {n + 1}", "appended"]
        else:
            S.write_seal(f, kind=kind)
            expect = [f"row {n + 1}", "duplicate key"]
    elif damage == "column_missing":
        _write(f, _table(f).drop(columns=[req]), kind)
        expect = ["header", req]
    elif damage in ("wrong_type", "out_of_range", "nan"):
        df = _table(f)
        i = _row(df, num)
        orig = df.loc[i, num]
        df.loc[i, num] = {"wrong_type": "fast", "out_of_range": "-5", "nan": ""}[damage]
        if damage == "nan" and kind in SPARSE:  # its numbers may be empty
            df.loc[i, num], df.loc[i, req] = orig, ""  # (a section without it, a failed point)
        _write(f, df, kind)
        expect = [f"row {i + 1}"] + ({"wrong_type": [num, "not a number"], "out_of_range": [num, "-5"],
                                      "nan": ["NaN"]}[damage])
    elif damage == "foreign":
        src = DATA / FOREIGN.get(kind, "guards/h200_guards_s1.csv")
        (tmp_path / "foreign").mkdir()
        f = tmp_path / "foreign" / src.name
        shutil.copy(src, f)
        expect = ["header", "missing column"]
    elif damage == "empty":
        f.write_bytes(b"")
        expect = ["header", "empty file"]
    else:
        mp = S.meta_path(f, kind)
        if damage == "meta_bad_json":
            mp.write_text(mp.read_text()[:-40])
            with pytest.raises(RecordingError) as e:
                _read(f, kind)
            assert mp.name in str(e.value) and "meta" in str(e.value) and "invalid JSON" in str(e.value)
            return
        m = json.loads(mp.read_text())
        s = m["files"][f.name]
        if damage == "meta_wrong_sha":
            s["sha256"] = "0" * 64
            expect = ["meta", "content hash differs", mp.name]
        else:
            s["rows"] += 3
            expect = [f"row {n + 1}", "data rows", mp.name]
        mp.write_text(json.dumps(m))
    with pytest.raises(RecordingError) as e:
        _read(f, kind)
    msg = str(e.value)
    assert str(f) in msg, msg
    for x in expect:
        assert x in msg, (x, msg)


@pytest.mark.parametrize("kind", list(CORPUS))
def test_the_real_recording_reads(kind, tmp_path):
    f = _copy(kind, tmp_path)
    assert len(_read(f, kind))


def test_every_canonical_csv_in_data_is_valid_and_sealed():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import seal_recordings
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert seal_recordings.main(["--check", "--data", str(DATA)]) == 0


# -- the loaders -----------------------------------------------------------------------------------
def _guards_copy(tmp_path) -> Path:
    for f in (DATA / "guards").glob("h200_guards_s*"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "h200_guards_s1.csv"


def test_load_guards_half_cut_at_a_line_is_refused(tmp_path):
    f = _guards_copy(tmp_path)
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[: len(lines) // 2]))  # whole rows: only the seal tells
    with pytest.raises(RecordingError, match=r"h200_guards_s1\.csv: row \d+: .* cut"):
        recordings.load_guards(tmp_path)


def test_load_guards_last_40_rows_twice_is_refused_even_resealed(tmp_path):
    f = _guards_copy(tmp_path)
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines + lines[-40:]))
    S.write_seal(f, kind="guards")
    with pytest.raises(RecordingError, match=rf"h200_guards_s1\.csv: row {len(lines)}: duplicate key"):
        recordings.load_guards(tmp_path)


def test_a_number_cut_in_the_last_row_is_refused(tmp_path):
    f = _guards_copy(tmp_path)
    text = f.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    us = last.split(",")[8]
    f.write_text(text[: len(text) - len(last) - 1] + last.replace(us, us[:3], 1) + "\n")  # 63258.03 -> 632
    with pytest.raises(RecordingError, match=r"h200_guards_s1\.csv: .*(seal|content hash)"):
        recordings.load_guards(tmp_path)


def test_broken_guards_meta_names_the_meta(tmp_path):
    _guards_copy(tmp_path)
    (tmp_path / "h200_guards_s2.meta.json").write_text("{\"gpu\": ")
    with pytest.raises(RecordingError, match=r"h200_guards_s2\.meta\.json: meta: invalid JSON"):
        recordings.load_guards(tmp_path)


def test_production_session_broken_meta_names_it(tmp_path):
    d = tmp_path / "signature_s1"
    shutil.copytree(DATA / "production" / "signature_s1", d, ignore=shutil.ignore_patterns("traces"))
    (d / "meta.json").write_text("{")
    with pytest.raises(RecordingError, match=r"signature_s1/meta\.json: meta"):
        production_runs.load_sessions([d])


def test_graphs_and_kernel_runs_and_hidden_syncs_loaders_check(tmp_path):
    g = tmp_path / "graphs"
    shutil.copytree(DATA / "graphs", g)
    (g / "strategies_replay.csv").write_bytes((g / "strategies_replay.csv").read_bytes()[:-3])
    with pytest.raises(RecordingError, match="strategies_replay.csv: row"):
        recordings.load_graph_strategies(g)
    k = tmp_path / "expand_run7_kernels_expand.csv"
    shutil.copy(DATA / "kernels" / k.name, k)
    shutil.copy(DATA / "kernels" / "expand_run7_kernels_expand.meta.json", tmp_path)
    k.write_text(k.read_text().replace(",", ";", 1))  # a header that is no longer this kind's
    with pytest.raises(RecordingError, match="expand_run7_kernels_expand.csv"):
        recordings.load_kernel_run(path=k)
    h = tmp_path / "hidden_syncs_s1.csv"
    shutil.copy(DATA / "hidden_syncs" / h.name, h)
    h.write_text(h.read_text() + h.read_text().splitlines(keepends=True)[-1])
    with pytest.raises(RecordingError, match="hidden_syncs_s1.csv: row"):
        hidden_sync_runs.recorded([h])


def test_read_trace_and_read_json_name_the_file(tmp_path):
    src = sorted((DATA / "production" / "traces").glob("*.json.gz"))[0]
    t = tmp_path / src.name
    t.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(RecordingError, match=f"{src.name}: trace: damaged"):
        S.read_trace(t)
    g = tmp_path / "x.json.gz"
    g.write_bytes(gzip.compress(b"{\"traceEvents\": ["))
    with pytest.raises(RecordingError, match="x.json.gz: trace: invalid JSON"):
        S.read_trace(g)
    j = tmp_path / "y.meta.json"
    j.write_text("{'single': 'quotes'}")
    with pytest.raises(RecordingError, match="y.meta.json: meta: invalid JSON at line 1"):
        S.read_json(j)


def test_write_seal_is_atomic_and_keeps_the_metadata(tmp_path):
    f = _copy("hidden_syncs", tmp_path)
    mp = S.meta_path(f, "hidden_syncs")
    before = json.loads(mp.read_text())
    f.write_text(f.read_text() + f.read_text().splitlines(keepends=True)[1].replace("lora_guard", "new_one"))
    s = S.write_seal(f, kind="hidden_syncs")
    after = json.loads(mp.read_text())
    assert s == S.seal(f) and after["files"][f.name] == s and s["rows"] == before["files"][f.name]["rows"] + 1
    assert {k: v for k, v in after.items() if k != "files"} == {k: v for k, v in before.items() if k != "files"}
    assert not list(tmp_path.glob(".*.tmp"))
    S.read_csv(f, "hidden_syncs")


# -- the renderer, in a second checkout run through this checkout's venv ------------------------------
@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the tree (package, scripts, studies, data, docs): a second checkout whose package is not the
    one the venv installed."""
    co = tmp_path_factory.mktemp("checkout")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("lora_moe_lab", "scripts", "studies", "data", "docs"):
        shutil.copytree(ROOT / d, co / d, ignore=skip)
    for f in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / f, co / f)
    return co


def test_a_second_checkout_through_another_venv_is_refused_not_mixed(checkout):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the first checkout's package, as its venv's editable install has it
    r = subprocess.run([sys.executable, str(checkout / "scripts" / "readme_tables.py"), "--check"],
                       capture_output=True, text=True, timeout=120, cwd=checkout, env=env)
    assert r.returncode != 0 and f"PYTHONPATH={checkout}" in r.stderr, r.stderr


def _docs(co: Path) -> dict:
    return {p: p.read_bytes() for p in [co / "README.md", *sorted((co / "docs").glob("*.md")),
                                        *sorted(co.glob("studies/*/README.md")), *sorted(co.glob("data/*/README.md"))]}


@pytest.mark.parametrize("damage,check", [pytest.param("half", False, marks=pytest.mark.slow),
                                          ("appended_twice", True)])
def test_renderer_refuses_and_writes_nothing(checkout, damage, check):
    f = checkout / "data" / "guards" / "h200_guards_s1.csv"
    orig = f.read_bytes()
    lines = orig.splitlines(keepends=True)
    f.write_bytes(orig[: len(orig) // 2] if damage == "half" else orig + b"".join(lines[-40:]))
    before = _docs(checkout)
    try:
        r = subprocess.run([sys.executable, str(checkout / "scripts" / "readme_tables.py")] + (["--check"] * check),
                           capture_output=True, text=True, timeout=120, cwd=checkout,
                           env={**os.environ, "PYTHONPATH": str(checkout)})
    finally:
        f.write_bytes(orig)
    assert r.returncode not in (0, 1), r.stdout + r.stderr
    assert str(f) in r.stderr and "row " in r.stderr, r.stderr  # this checkout's file, not the venv's
    assert "nothing was rewritten" in r.stderr
    assert _docs(checkout) == before  # byte-identical
