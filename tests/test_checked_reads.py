"""One checked read path: every read of a recording in the package, the studies and the scripts goes through its
kind's reader (lora_moe_lab/instruments/analysers/schemas.py: read_csv, read_json, read_trace; the catalog through
provenance.catalog), which checks the seal, the schema and the plausible range of each column.

An AST walk finds every raw read (`pd.read_csv`, `json.load`, `json.loads` of a file's text, `gzip.open`) outside
those readers; each must be in ALLOWED, with the reason it is not a read of a recording. A new raw read of data
fails here, naming its file, function and line."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("lora_moe_lab", "studies", "scripts")
FILE_READS = {"read_text", "read", "read_bytes"}

# (file, function) -> why its raw read is not a recording read through the checked path
ALLOWED = {
    ("lora_moe_lab/instruments/analysers/schemas.py", "read_csv"): "the checked reader itself (after seal and tail)",
    ("lora_moe_lab/instruments/analysers/schemas.py", "files"): "data/recording_kinds.json: the kinds' own index",
    ("lora_moe_lab/provenance.py", "_check_catalog_seal"): "the catalog's seal (metadata), read by the catalog's "
                                                           "checked reader",
    ("lora_moe_lab/instruments/recorders/tables.py", "read_meta"): "a writer's metadata, errors named (TableError)",
    ("lora_moe_lab/instruments/recorders/bench.py", "_run_sweep"): "the sweep it just wrote (its own output)",
    ("lora_moe_lab/instruments/recorders/bench.py", "load_sweep"): "a sweep a user hands (never data/); older "
                                                                   "column names renamed before use",
    ("lora_moe_lab/instruments/recorders/bench.py", "lost_table"): "the header only (nrows=0) of a user's sweep",
    ("lora_moe_lab/instruments/recorders/bench.py", "main"): "the CPU note of the sweep it just wrote",
    ("lora_moe_lab/instruments/recorders/prefill.py", "main"): "its own --out on --resume, after "
                                                               "tables.check_resumable",
    ("lora_moe_lab/kernels/*", "*"): "the tile tables, rules and GPU registry: config, not recordings, checked by "
                                      "the kernels' own readers (plan_table.check_table)",
    ("lora_moe_lab/nb/runner.py", "server_info"): "jupyter_server's runtime file (jpserver-<pid>.json)",
    ("studies/audit_corpus/record.py", "replace_session"): "the recorder's own table, rewritten whole",
    ("studies/kernels/record_base.py", "add_tma_choice"): "a tile table the recorder writes (config)",
    ("studies/kernels/record_base.py", "add_persist_choice"): "a tile table the recorder writes (config)",
    ("studies/kernels/record_base.py", "adopt_persist"): "the GPU name of the session files it adopts",
    ("studies/kernels/record_base.py", "ncu_parse"): "the targets.json it wrote beside the raw ncu export",
    ("studies/kernels/tidy.py", "_append_rows"): "the tidy writer merging into its own table (text, as written)",
    ("studies/kernels/tidy.py", "append"): "the tidy writer merging a session's build output into its table",
    ("studies/kernels/read.py", "packed_source_view"): "pending: ncu's source/SASS export, not a table of a kind",
    ("scripts/gpu_check.py", "lesson_lines"): "an executed notebook (nbformat JSON), not a recording",
    ("scripts/gpu_check.py", "main"): "its own previous report, merged",
    ("scripts/tidy_meta_paths.py", "main"): "metadata files it rewrites (a maintenance tool)",
    ("scripts/mutate.py", "_statuses"): "mutmut's own results (build/mutate/<module>/mutants/<file>.meta), not data/",
}


def _raw_read(call: ast.Call) -> str | None:
    fn = call.func
    if not isinstance(fn, ast.Attribute) or not isinstance(fn.value, ast.Name):
        return None
    mod, attr = fn.value.id, fn.attr
    arg = call.args[0] if call.args else None
    in_memory = isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "StringIO"
    if attr == "read_csv" and mod in ("pd", "pandas") and not in_memory:
        return "pd.read_csv"
    if (mod, attr) in (("json", "load"), ("gzip", "open")):
        return f"{mod}.{attr}"
    if (mod, attr) == ("json", "loads") and isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) \
            and arg.func.attr in FILE_READS:
        return "json.loads(<a file's text>)"
    return None


@lru_cache(maxsize=1)
def raw_reads() -> tuple[tuple[str, str, int, str], ...]:
    """(file, enclosing function, line, what) of every raw read in the scanned trees (tests excluded)."""
    out = []
    for base in SCANNED:
        for f in sorted((ROOT / base).rglob("*.py")):
            if f.name.startswith("test_"):
                continue
            rel = f.relative_to(ROOT).as_posix()

            def walk(node, fn):
                for ch in ast.iter_child_nodes(node):
                    name = ch.name if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
                    if isinstance(ch, ast.Call) and (what := _raw_read(ch)):
                        out.append((rel, name, ch.lineno, what))
                    walk(ch, name)

            walk(ast.parse(f.read_text()), "<module>")
    return tuple(out)


def _allowed(f: str, fn: str) -> bool:
    return (f, fn) in ALLOWED or (f"{f.rsplit('/', 1)[0]}/*", "*") in ALLOWED


def test_every_read_of_data_goes_through_the_checked_reader():
    bad = [f"{f}:{line} in {fn}: {what}" for f, fn, line, what in raw_reads() if not _allowed(f, fn)]
    assert not bad, ("raw reads that bypass the checked reader (schemas.read_csv / read_json / read_trace):\n  "
                     + "\n  ".join(bad))


def test_the_allowlist_names_only_reads_that_exist():
    found = {(f, fn) for f, fn, _, _ in raw_reads()} | {(f"{f.rsplit('/', 1)[0]}/*", "*") for f, *_ in raw_reads()}
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allowlist entries with no raw read left (remove them): {stale}"


def test_the_walk_finds_a_raw_read(tmp_path):
    tree = ast.parse("import pandas as pd\ndef f(p):\n    return pd.read_csv(p)\n")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [_raw_read(c) for c in calls] == ["pd.read_csv"]
