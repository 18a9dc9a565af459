"""One entry for every recording: list them, or run one.

    python scripts/record.py                 # the table: section, script, data folder, device, rough device time
    python scripts/record.py SECTION [ARGS]  # run the section's study script with --out $OUT/<SECTION> (or ARGS)

Naming rule: studies/<study>/record.py writes data/<study>/ (record_<part>.py: one part of that folder).
On a GPU machine (the device tool) run from the checkout with the package importable
(`pip install -e .`, the venv, or PYTHONPATH=$PWD), then copy what $OUT holds into data/<folder>/
with its README updated. The exception: scripts/gpu_check.py (the GPU check, `make gpu-check`) writes
data/gpu_tests/. Device times are each script's own budget or its docstring's estimate, not a
measurement of this entry.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# section -> (data folder, device kind, rough device time, default arguments after --out)
RECORDINGS = {
    "guards": ("guards", "nvidia-h200", "~8 min a session (run twice: --session s1, s2)", ["--session", "s1"]),
    "traces": ("traces", "nvidia-h200", "a few minutes", []),
    "backends": ("backends", "nvidia-h200", "a few minutes", []),
    "graphs": ("graphs", "nvidia-h200", "a few minutes (--reps 11)", []),
    "graphs_checks": ("graphs", "nvidia-h200", "a few minutes", []),
    "kernels": ("kernels", "nvidia-h200", "<= 330 s (--budget-s)", ["--sweep"]),
    "kernels_base": ("kernels", "nvidia-h200", "~6 min: sweep + compare, then the ncu pass (docstring)",
                     ["--sections", "sweep,compare"]),
    "kernels_decode": ("kernels", "nvidia-h200", "<= 420 s (--budget-s)", []),
    "kernels_expand": ("kernels", "nvidia-h200", "<= 400 s (--budget-s)", []),
    "kernels_order": ("kernels", "nvidia-h200", "~10 s (gate_up's shrink in slot order); --ncu-run under ncu", []),
    "kernels_parts": ("kernels", "nvidia-h200", "~1-2 min (the layer's kernels under the profiler)", []),
    "kernels_fused": ("kernels", "nvidia-h200", "<= 360 s (--budget-s)", []),
    "kernels_fold": ("kernels", "nvidia-h200", "~5 min: check, kernels, layer; then the ncu pass (docstring)", []),
    "production": ("production", "nvidia-h200", "< 10 min a session (--session s1, s2)", ["--session", "s1"]),
    "production_tp": ("production", "nvidia-h200-x2", "~8.5 min (--stage full)", ["--stage", "full"]),
    "tp_emulation": ("tp_emulation", "nvidia-h200", "~5-6 min a session (--session s1, s2), then --summarize on a CPU",
                     ["--session", "s1"]),
    "hidden_syncs": ("hidden_syncs", "nvidia-h200", "~20 s on an H200 (--session s1, s2)", ["--session", "s1"]),
    "audit_corpus": ("audit_corpus", "nvidia-h200", "~80 s a session (--session s1, s2)", ["--session", "s1"]),
    "replay": ("replay", "none (CPU)", "about a minute", None),
    "simulator": ("simulator", "none (CPU)", "~10 s", None),
    "setup": ("setup", "none (CPU)", "3 fresh set-ups, a few minutes", None),
}


def script(section: str) -> str:
    """The study script of a section: kernels_base -> studies/kernels/record_base.py."""
    folder = RECORDINGS[section][0]
    part = section[len(folder) + 1:] if section.startswith(folder + "_") else ""
    return f"studies/{folder}/record{'_' + part if part else ''}.py"


def table() -> str:
    head = f"{'section':<15}{'script':<36}{'writes':<20}{'device':<16}rough device time"
    lines = [head]
    for sec, (folder, kind, t, _) in RECORDINGS.items():
        path = script(sec)
        missing = "" if (ROOT / path).exists() else "  (not in this checkout)"
        lines.append(f"{sec:<15}{path:<36}{'data/' + folder + '/':<20}{kind:<16}{t}{missing}")
    lines.append(f"{'gpu-check':<15}{'scripts/gpu_check.py':<36}{'data/gpu_tests/':<20}{'nvidia-h200':<16}"
                 "< 10 min a part (make gpu-check)")
    return "\n".join(lines)


def command(section: str, args: list[str]) -> list[str]:
    if section not in RECORDINGS:
        raise SystemExit(f"unknown recording {section!r}; one of: {', '.join(RECORDINGS)}")
    folder, _, _, default = RECORDINGS[section]
    if not args and default is not None:
        out = os.environ.get("OUT", str(ROOT / "build" / "record"))
        args = ["--out", os.path.join(out, section), *default]
    return [sys.executable, str(ROOT / script(section)), *args]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip().split("\n\n")[0] + "\n")
        print(table())
        return 0
    cmd = command(argv[0], argv[1:])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
