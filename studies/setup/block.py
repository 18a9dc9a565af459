"""The setup study's block (scripts/readme_tables.py collects `BLOCKS`): the new user's set-up time, from
data/setup/setup_time.json."""
from __future__ import annotations

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA


def setup_block() -> str | None:
    f = DATA / "setup" / "setup_time.json"
    if not f.exists():
        return None
    d = schemas.read_json(f)
    return (f"Set-up time, measured by `python3 studies/setup/record.py` (a fresh clone and `make venv` with the "
            f"installers' caches off, {d['runs']} runs on a {d['cores']}-core CI-sized machine, commit {d['commit']}, "
            f"{d['date'][:10]}; a later checkout's dependencies may take longer): "
            f"median {d['median_s']:.0f} s (min {d['min_s']:.0f}, max {d['max_s']:.0f}). uv installs torch, "
            "triton, the notebook tools and the browser test's driver in one go; the first `make run` or `make test` "
            "pays it once.")


BLOCKS = {"setup": setup_block}
