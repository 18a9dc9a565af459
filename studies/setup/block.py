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
    return (f"Set-up time (`python3 studies/setup/record.py`: a fresh clone and `make venv`, installers' caches off, "
            f"{d['runs']} runs on a {d['cores']}-core CI-sized machine, commit {d['commit']}, {d['date'][:10]}): "
            f"median {d['median_s']:.0f} s (min {d['min_s']:.0f}, max {d['max_s']:.0f}). uv installs torch, triton, "
            "the notebook tools and the browser test's driver; the first `make run` or `make test` pays it once.")


BLOCKS = {"setup": setup_block}
