"""Metadata stamped on every recorded figure: GPU, torch, triton, git commit, date."""
from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> str:
    """The checkout's commit; GIT_COMMIT in the environment wins (a copied tree may lack .git)."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=5).stdout.strip() or _commit_from_files()
    except (OSError, subprocess.SubprocessError):
        return _commit_from_files()


def _commit_from_files() -> str:
    head = ROOT / ".git" / "HEAD"
    if not head.exists():
        return "unknown"
    ref = head.read_text().strip()
    if ref.startswith("ref: "):
        p = ROOT / ".git" / ref[5:]
        return p.read_text().strip()[:12] if p.exists() else "unknown"
    return ref[:12]


def metadata(params: dict | None = None) -> dict:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "none"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    m = dict(gpu=gpu, torch=torch.__version__, triton=tv, commit=git_commit(),
             date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    if params:
        m["params"] = params
    return m
