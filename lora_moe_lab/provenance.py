"""Where and with what a figure was measured: ONE metadata schema for every recording in data/.

    metadata(params={...})  -> {gpu, torch, triton, cuda, python, commit, date, dirty, driver,
                                gpu_state: {clocks_sm, clocks_mem, power_draw, ...}, params}
    DATA                    -> the repository's data/ folder (the one place recordings live)
    normalize_meta(d)       -> a recorded dict in this schema (older files used git_commit/date_utc)
    label(meta)             -> "H200 · commit 1c65309 · 2026-11-29" for a figure's caption
    catalog(name)           -> the file(s) a logical name stands for (data/catalog.json): the one way the
                               package finds a recording it is not handed

No hostname is recorded. The commit is read from .git directly (no git binary needed); the
GIT_COMMIT environment variable wins, for a copied tree on a GPU machine that has no .git.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from . import runtime

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
CATALOG = DATA / "catalog.json"
META_KEYS = ("gpu", "torch", "triton", "cuda", "python", "commit", "date")
_LEGACY = {"git_commit": "commit", "date_utc": "date"}


def _git_dir(start: Path) -> Path | None:
    for p in [start, *start.parents]:
        g = p / ".git"
        if g.is_dir():
            return g
        if g.is_file():  # worktree / submodule: "gitdir: <path>"
            txt = g.read_text().strip()
            if txt.startswith("gitdir:"):
                d = Path(txt.split(":", 1)[1].strip())
                return d if d.is_absolute() else (p / d).resolve()
    return None


def git_commit(start: Path | None = None) -> str:
    """HEAD's commit; '' when neither GIT_COMMIT nor a .git is there."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    g = _git_dir(start or ROOT)
    if g is None:
        return ""
    try:
        head = (g / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(":", 1)[1].strip()
        common = g
        if (g / "commondir").is_file():  # linked worktree: refs live in the common dir
            common = (g / (g / "commondir").read_text().strip()).resolve()
        for base in (g, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip()
        for base in (g, common):
            packed = base / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
    except OSError:
        pass
    return ""


def git_dirty(start: Path | None = None) -> bool | None:
    """Uncommitted changes to tracked files? None when the git binary is missing."""
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=str(start or ROOT), timeout=10)
        return bool(r.stdout.strip()) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def metadata(params: dict | None = None) -> dict:
    """The metadata every recording carries (no hostname)."""
    import torch

    try:
        import triton
        tv = triton.__version__
    except Exception:  # pragma: no cover - triton missing
        tv = ""
    cuda = runtime.has_cuda()
    out = {
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "triton": tv,
        "cuda": (torch.version.cuda or "") if cuda else "",
        "python": platform.python_version(),
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    out["dirty"] = git_dirty_flag()
    if os.environ.get("GIT_DIRTY_FILES"):  # which tracked files differed from the commit
        out["dirty_files"] = os.environ["GIT_DIRTY_FILES"].split()
    state = gpu_state() if cuda else {}
    out["driver"] = state.pop("driver_version", "")
    out["gpu_state"] = state
    out["host"] = host_state()
    if params:
        out["params"] = repo_relative(params)
    return out


def repo_relative(value, root: Path = ROOT, out: str | None = None):
    """`value` with every absolute path string made repo-relative ("build/production/traces"). A path
    in the device machine's output folder ($OUT, or `out`) becomes "$OUT/..."; any other path outside
    the checkout keeps its last component only. Recorded metadata names no machine's folders."""
    out = out if out is not None else os.environ.get("OUT")
    if isinstance(value, dict):
        return {k: repo_relative(v, root, out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(repo_relative(v, root, out) for v in value)
    if isinstance(value, Path):
        value = str(value)
    if not (isinstance(value, str) and os.path.isabs(value) and " " not in value):
        return value
    p = Path(value)
    for base, prefix in ((Path(root), ""), (Path(out) if out else None, "$OUT/")):
        if base is not None and (p == base or base in p.parents):
            rel = p.relative_to(base).as_posix()
            return (prefix + rel if rel != "." else prefix.rstrip("/")) or "."
    return p.name


def git_dirty_flag() -> bool | None:
    """Uncommitted changes to tracked files when the recording was made. GIT_DIRTY (0/1) wins:
    a tree copied to a GPU machine carries no .git, so the caller passes what git said here."""
    v = os.environ.get("GIT_DIRTY")
    if v is not None and v.strip() in ("0", "1"):
        return v.strip() == "1"
    return git_dirty()


def host_state() -> dict:
    """The host as it was found: CPU model, cores (online and usable by this process), clock now and
    at most, load, and the Python build. The fix's gain depends on how far the host runs ahead of the
    GPU (docs/results.md#probe), so a recording names the host that issued its kernels. No hostname."""
    out: dict = {"cpu_model": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        out["cores_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass
    try:
        info = Path("/proc/cpuinfo").read_text()
        models = re.findall(r"^model name\s*:\s*(.+)$", info, re.M)
        mhz = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)$", info, re.M)]
        if models:
            out["cpu_model"] = models[0].strip()
        fms = [re.search(rf"^{k}\s*:\s*(\S+)$", info, re.M) for k in ("cpu family", "model", "stepping")]
        if all(fms):  # the generation, where a VM names only "Intel(R) Xeon(R) Processor"
            out["cpu_family_model_stepping"] = "/".join(m.group(1) for m in fms)
        if mhz:
            out["cpu_mhz_median"] = float(sorted(mhz)[len(mhz) // 2])
    except OSError:  # pragma: no cover - not Linux
        pass
    try:
        out["cpu_mhz_max"] = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e3
    except (OSError, ValueError):
        pass
    try:
        out["load_1_5_15"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover
        pass
    out["python_build"] = f"{platform.python_implementation()} {platform.python_version()} " \
                          f"{' '.join(platform.python_build())} {platform.python_compiler()}"
    return out


_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw",
               "power.limit", "temperature.gpu", "pstate")


def gpu_state() -> dict:
    """The card as it was found (read only; nothing here changes a setting): driver, SM and memory
    clocks now and at most, power draw and limit, temperature, performance state. A GPU's clocks
    move with load and temperature, so two sessions' timings are comparable only beside these."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        r = subprocess.run([exe, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits",
                            "-i", str(_current_index())], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if r.returncode != 0 or not r.stdout.strip():
        return {}
    vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
    out = {}
    for k, v in zip(_SMI_FIELDS, vals):
        try:
            out[k.replace(".", "_")] = v if k in ("driver_version", "pstate") else float(v)
        except ValueError:
            out[k.replace(".", "_")] = v
    return out


def _current_index() -> int:
    try:
        import torch

        return torch.cuda.current_device()
    except Exception:  # pragma: no cover
        return 0


def normalize_meta(meta: dict | None) -> dict:
    """A recorded metadata dict in this schema: older recordings used git_commit / date_utc."""
    return {_LEGACY.get(k, k): v for k, v in (meta or {}).items()}


def label(meta: dict | None) -> str:
    """One line naming a recording: GPU, short commit, date."""
    m = normalize_meta(meta)
    gpu = str(m.get("gpu", "?")).replace("NVIDIA ", "")
    return f"{gpu} · commit {str(m.get('commit', ''))[:7] or '?'} · {str(m.get('date', ''))[:10] or '?'}"


# ----------------------------------------------------------------------------------------------
# The catalog: logical name -> the recording's file(s), relative to the catalog's own folder.
class CatalogKeyError(KeyError):
    """A name the catalog does not hold (its message names the catalog file and the key)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


_ENTRY_KINDS = ("path", "paths", "glob")


class CatalogError(ValueError):
    """A catalog that cannot be trusted: not JSON, an entry without its fields, or a seal that disagrees (the
    message names the file)."""


def _check_catalog_seal(f: Path, data: bytes) -> None:
    """The catalog's bytes against its seal in <name>.meta.json (scripts/seal_recordings.py writes it; one rule with
    the recordings', instruments/analysers/schemas.py). The repository's catalog must be sealed; another catalog is
    held to its seal where it has metadata."""
    import hashlib

    mp = f.with_name(f.name.removesuffix(".json") + ".meta.json")
    if not mp.is_file():
        if f.resolve() == CATALOG.resolve():
            raise CatalogError(f"{f}: unsealed: no {mp.name} holds its seal; run scripts/seal_recordings.py")
        return
    try:
        s = json.loads(mp.read_text())["files"][f.name]
        n, sha = int(s["bytes"]), str(s["sha256"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise CatalogError(f"{f}: {mp.name} holds no complete seal for it (files.{f.name}: bytes, sha256)") from None
    if n != len(data) or sha != hashlib.sha256(data).hexdigest():
        raise CatalogError(f"{f}: changed since it was sealed ({len(data)} bytes, its seal in {mp.name} says {n}, "
                           "or the hash differs): an edit not resealed (scripts/seal_recordings.py)")


def catalog_entries(catalog_path: str | Path | None = None) -> dict[str, dict]:
    """Every entry of the catalog (data/catalog.json unless `catalog_path`): name -> {path | paths | glob, what}.
    Keys starting with "_" are notes, not entries."""
    f = Path(catalog_path) if catalog_path is not None else CATALOG
    if not f.is_file():
        raise FileNotFoundError(f"no catalog at {f}")
    data = f.read_bytes()
    _check_catalog_seal(f, data)
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CatalogError(f"{f}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CatalogError(f"{f}: a {type(doc).__name__}, not an object of entries")
    out = {}
    for k, v in doc.items():
        if k.startswith("_"):
            continue
        kinds = [x for x in _ENTRY_KINDS if x in v] if isinstance(v, dict) else []
        if len(kinds) != 1 or not isinstance(v.get("what"), str) or not v["what"].strip():
            raise CatalogError(f"{f}: entry {k!r} needs exactly one of {', '.join(_ENTRY_KINDS)} and a `what` line")
        out[k] = v
    return out


def catalog(name: str, catalog_path: str | Path | None = None) -> Path | list[Path]:
    """The file(s) the catalog names `name`: a `path` entry -> that Path (a file or a folder), a `paths`
    entry -> those Paths in order, a `glob` entry -> its sorted matches. Relative to the catalog's folder
    (data/). KeyError (CatalogKeyError) naming the catalog file and the key when the name is not there;
    FileNotFoundError naming the entry when a file is missing or a glob matches nothing."""
    f = Path(catalog_path) if catalog_path is not None else CATALOG
    entries = catalog_entries(f)
    if name not in entries:
        raise CatalogKeyError(f"{f} has no entry {name!r}; it has: {', '.join(sorted(entries))}")
    e, base = entries[name], f.parent
    if "glob" in e:
        found = sorted(base.glob(e["glob"]))
        if not found:
            raise FileNotFoundError(f"{f}: entry {name!r} ({e['glob']}) matches no file under {base}")
        return found
    rels = [e["path"]] if "path" in e else list(e["paths"])
    paths = [base / r for r in rels]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{f}: entry {name!r} names a missing file: {', '.join(missing)}")
    return paths[0] if "path" in e else paths
