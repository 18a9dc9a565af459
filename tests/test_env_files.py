"""pyproject.toml and environment.yml pin the same versions; a drift fails here."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(reqs) -> dict:
    pins = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", r)
        if m:
            pins[m[1].lower()] = m[2]
    return pins


def _pyproject_pins():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return _pins(r for reqs in data["project"]["optional-dependencies"].values() for r in reqs)


def _env_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return _pins(next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d))


def test_pins_agree():
    py, env = _pyproject_pins(), _env_pins()
    assert py, "no pins found in pyproject.toml"
    assert py == env, (f"only in pyproject: {set(py.items()) - set(env.items())}; "
                       f"only in environment.yml: {set(env.items()) - set(py.items())}")


def test_torch_pins_are_the_cpu_wheel_and_matching_triton():
    py = _pyproject_pins()
    assert py["torch"] == "2.13.0" and py["triton"] == "3.7.1"
