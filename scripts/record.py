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

import json
import os
import re
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
    "probe": ("probe", "nvidia-h200", "~3 min a session, each on a freshly started H200 (--session p1, p2, ...)",
              ["--session", "p1"]),
    "lora_tax": ("lora_tax", "nvidia-h200", "~2 min a session (--session s1, s2, each on a fresh H200)",
                 ["--session", "s1"]),
    "launch_cost": ("launch_cost", "nvidia-h100-x1", "~1 min (where an eager LoRA launch's host time goes)", []),
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


# arguments that make a GPU section's script run tiny shapes on any machine (its own docstring says so)
CPU_FLAGS = ("--dry", "--smoke", "-h", "--help", "--summarize")


def gpus_needed(section: str) -> int:
    """CUDA GPUs a section's recording needs: 0 for a CPU section, 2 for nvidia-h200-x2, else 1."""
    kind = RECORDINGS[section][1]
    if not kind.startswith("nvidia-"):
        return 0
    m = re.search(r"-x(\d+)$", kind)
    return int(m.group(1)) if m else 1


def cuda_devices() -> tuple[int, list[str]]:
    """(CUDA devices visible, their names), asked of torch in a child process: this process builds
    nothing and holds no CUDA context. (0, []) without torch or without a GPU."""
    code = ("import json, torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
            "print(json.dumps([torch.cuda.get_device_name(i) for i in range(n)]))")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        names = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        names = []
    return len(names), names


def check_device(section: str, args: list[str], probe=cuda_devices) -> str | None:
    """Why this machine cannot run the section (None: it can), decided before anything is built or any
    file is created: a GPU section on a machine with too few CUDA GPUs would build its 48-layer model in
    host memory instead (the OOM killer ends it, exit 247, with an empty CSV left behind)."""
    need = gpus_needed(section)
    if need == 0 or any(a in CPU_FLAGS for a in args):
        return None
    n, names = probe()
    kind = RECORDINGS[section][1]
    if n < need:
        return (f"record.py {section}: needs {need} CUDA GPU{'s' if need > 1 else ''} ({kind}); this machine has "
                f"{n or 'none'}. Run it on the device machine (the device tool, kind {kind}), or pass --dry / "
                "--smoke where the script has it for a tiny run on any machine. Nothing was built or written.")
    if not all("H200" in x for x in names[:need]):
        print(f"record.py {section}: warning: recorded on {', '.join(names[:need])}, not an H200: the data "
              "folders' figures and file names are an H200's", file=sys.stderr)
    return None


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
    why = check_device(argv[0], argv[1:])
    if why:
        print(why, file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
