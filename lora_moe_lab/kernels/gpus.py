"""Which recorded GPU's tables a device reads. The tuned tables (kernels/tile_tables/) were recorded on a few GPUs:
`tile_tables/gpus.json` holds those GPUs' properties, and the base GEMM's choice made by hand for a GPU without tables
of its own (`base_gemm`: the GPU it follows, or "rule" for the rule tiles of kernels/configs.py), each with its `why`.
The LoRA plan's are the lora_plan files' own `follows` (kernels/plan_table.py).

A GPU without its own table and without such a choice follows the closest recorded GPU, from the properties
`torch.cuda.get_device_properties` gives (`DeviceProps`), compared in this order:

    1. the architecture, the compute capability's major (Hopper 9, Ampere 8). The base GEMM follows only a GPU of
       its own architecture (its tiles are sized to that architecture's shared memory, registers and TMA copies),
       else it takes the rule tiles; the LoRA plan follows the closest GPU of any architecture;
    2. the compute capability's minor;
    3. the name's family, the letters before the model number ("H" of the H100 and the H200);
    4. the SM count, then the memory size, by their ratio;
    5. the name, so that a tie always resolves the same way.

e.g. an "NVIDIA H100 80GB HBM3" (sm_90, 132 SMs, 80 GB) is closest to the "NVIDIA H200" (sm_90, 132 SMs, 141 GB).
A GPU whose properties are unknown (neither this machine's nor in gpus.json) is close to none. Each follow is said
once per process, as a `TableFollowed` warning naming both GPUs and why."""
from __future__ import annotations

import functools
import json
import math
import re
import warnings
from pathlib import Path
from typing import NamedTuple

from .table_checks import TableError

GPUS_FILE = Path(__file__).with_name("tile_tables") / "gpus.json"
RULE = "rule"  # the base GEMM's rule tiles (configs.rule_block_m, configs.rule_gemm_config)


class TableFollowed(UserWarning):
    """A GPU reads another GPU's tuned table (or the base GEMM's rule tiles): said once per process and table."""


class DeviceProps(NamedTuple):
    """What the closeness reads of a GPU (torch.cuda.get_device_properties: name, major, minor,
    multi_processor_count, total_memory)."""

    name: str
    major: int
    minor: int
    sms: int
    memory_gib: float

    @property
    def family(self) -> str:
        """The letters before the model number: "H" of "NVIDIA H100 80GB HBM3", "GH" of "NVIDIA GH200 480GB"."""
        m = re.search(r"\b([A-Za-z]+)\d", self.name.removeprefix("NVIDIA "))
        return m.group(1).upper() if m else ""

    @classmethod
    def of_torch(cls, p) -> "DeviceProps":
        return cls(p.name, p.major, p.minor, p.multi_processor_count, p.total_memory / 2 ** 30)


@functools.lru_cache(maxsize=1)
def registry() -> dict:
    """gpus.json, read and checked once per process: {"gpus": {name: DeviceProps}, "base_gemm": {name: (follows,
    why)}}."""
    f = GPUS_FILE
    raw = json.loads(f.read_text())
    if not isinstance(raw, dict) or set(raw) - {"about", "gpus", "base_gemm"}:
        raise TableError(f, "", f"holds only 'about', 'gpus' and 'base_gemm', got {sorted(raw)}")
    gpus = {}
    for name, p in raw.get("gpus", {}).items():
        keys = {"capability", "sms", "memory_gib", "why"}
        cap = p.get("capability") if isinstance(p, dict) else None
        if (not isinstance(p, dict) or set(p) != keys or not isinstance(cap, list) or len(cap) != 2
                or not all(isinstance(c, int) and 0 <= c < 100 for c in cap)
                or not isinstance(p["sms"], int) or not 0 < p["sms"] < 10_000
                or not isinstance(p["memory_gib"], (int, float)) or not 0 < p["memory_gib"] < 100_000):
            raise TableError(f, f"gpus {name!r}", f"must hold exactly {sorted(keys)}: capability [major, minor], "
                                                  f"sms > 0, memory_gib > 0, why; got {p!r}")
        gpus[name] = DeviceProps(name, cap[0], cap[1], p["sms"], float(p["memory_gib"]))
    base = {}
    for name, e in raw.get("base_gemm", {}).items():
        if not (isinstance(e, dict) and set(e) == {"follows", "why"} and isinstance(e["follows"], str)
                and isinstance(e["why"], str)):
            raise TableError(f, f"base_gemm {name!r}", f"must hold exactly 'follows' (a GPU's name, or {RULE!r}) "
                                                       f"and 'why', got {e!r}")
        base[name] = (e["follows"], e["why"])
    return {"gpus": gpus, "base_gemm": base}


@functools.lru_cache(maxsize=16)
def _machine_props(name: str) -> DeviceProps | None:
    import torch

    if not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        if p.name == name:
            return DeviceProps.of_torch(p)
    return None


def props_of(name: str) -> DeviceProps | None:
    """A GPU's properties: this machine's (the driver's), else gpus.json's, else None (unknown)."""
    return _machine_props(name) or registry()["gpus"].get(name)


def closeness(a: DeviceProps, b: DeviceProps) -> tuple:
    """The order of the module doc: smaller is closer."""
    return (a.major != b.major, a.minor != b.minor, a.family != b.family, abs(math.log(a.sms / b.sms)),
            abs(math.log(a.memory_gib / b.memory_gib)), b.name)


def closest(props: DeviceProps, recorded, same_arch: bool) -> tuple[str | None, str]:
    """(the recorded GPU closest to `props`, why), or (None, why) where none qualifies. recorded: GPU names, each
    with its properties in gpus.json (a recorded GPU without them is a TableError)."""
    known = registry()["gpus"]
    missing = sorted(set(recorded) - set(known))
    if missing:
        raise TableError(GPUS_FILE, "gpus", f"the recorded GPUs {missing} have tables but no properties here "
                                            f"(capability, sms, memory_gib): add them")
    cands = [known[r] for r in recorded if not same_arch or known[r].major == props.major]
    if not cands:
        return None, (f"no recorded GPU has its architecture (sm_{props.major}{props.minor}; recorded: "
                      f"{sorted(recorded)})")
    best = min(cands, key=lambda c: closeness(props, c))
    same = ("same architecture" if best.major == props.major else "another architecture, the closest recorded")
    return best.name, (f"closest recorded GPU: {same} (sm_{best.major}{best.minor}), {best.sms} SMs against "
                       f"{props.sms}, {best.memory_gib:.0f} GiB against {props.memory_gib:.0f}")


def base_gemm_follows(gpu: str, recorded, props: DeviceProps | None = None) -> tuple[str, str]:
    """(source, why) of the base GEMM's tiles on `gpu`: source is the GPU whose tile tables it reads (itself where
    it has some), or RULE. recorded: the GPUs with tile tables; props: the GPU's properties (None: `props_of`)."""
    if gpu in recorded:
        return gpu, "its own tile tables"
    chosen = registry()["base_gemm"]
    seen, at = [gpu], gpu
    while at in chosen:
        target, why = chosen[at]
        if target == RULE or target in recorded:
            via = f" (through {' -> '.join(seen)})" if len(seen) > 1 else ""
            return target, f"gpus.json base_gemm entry{via}: {why}"
        if target in seen:
            raise TableError(GPUS_FILE, f"base_gemm {at!r}", f"a cycle of follows: {' -> '.join(seen + [target])}")
        if target not in chosen:
            raise TableError(GPUS_FILE, f"base_gemm {at!r}",
                             f"follows {target!r}, which has no tile table (the GPUs with one: {sorted(recorded)})")
        seen.append(target)
        at = target
    props = props or props_of(gpu)
    if props is None:
        return RULE, "its properties are unknown (not this machine's GPU, not in gpus.json)"
    src, why = closest(props, recorded, same_arch=True)
    return (src, why) if src else (RULE, why)


_SAID: set = set()


def say_once(table: str, gpu: str, source: str, why: str) -> None:
    """The one line a process gives when `gpu` reads another's table (`table`: "tile table", "LoRA plan")."""
    if (table, gpu) in _SAID:
        return
    _SAID.add((table, gpu))
    what = "the rule tiles" if source == RULE else f"the {table} of {source}"
    warnings.warn(f"{gpu} has no {table} of its own: it takes {what} ({why})", TableFollowed, stacklevel=3)
