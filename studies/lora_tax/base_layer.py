"""The MoE layer's base path, part by part, against each part's floor: the torch parts the layer ran before
(an fp32 router: an upcast copy, an fp32 GEMM, softmax, top-k, renormalise; SiLU and mul as two kernels; the top-k
sum) and the one-kernel parts it runs now (kernels/router.py, activation.py, moe_sum.py).

    python -m studies.lora_tax.base_layer      # writes data/lora_tax/base_layer.csv (+ .meta.json, sealed)

Read from the `base` arm (the layer without adapters, one CUDA-graph replay per forward, profiled: each kernel's GPU
time from CUPTI) of every session of data/kernels/kernels_parts.csv (studies/kernels/record_parts.py); each session's
commit says which path it ran. Parts by kernel name (studies/kernels/read_floors.py: `part_of`); floors
(`torch_part_floors`: the router as one bf16 product with float logits out, SiLU-and-mul reading the (pairs, 2I)
product once and writing (pairs, I), the top-k sum reading (pairs, H) and writing (M, H)) at the highest copy
bandwidth and matmul rate recorded on the H200. `of_floor` = floor / time; `nongemm_pct`: the three parts' share of the
layer's busy kernel time.
"""
from __future__ import annotations

import pandas as pd

from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import DATA

from studies.kernels import tidy
from studies.kernels.read_floors import BUSY, TORCH_PARTS, ceilings, layer_parts, torch_part_floors

OUT = DATA / "lora_tax" / "base_layer.csv"
# a part's name, old path (torch) and new (one kernel each): one row per part either way
PARTS = dict(zip(TORCH_PARTS, ("router", "SiLU and mul", "top-k sum")))


def table(c: dict | None = None, path=None) -> pd.DataFrame:
    c = ceilings() if c is None else c
    p = layer_parts(tuple(tidy.sessions("kernels_parts", path)), path)
    p = p.assign(part=p.part.replace(PARTS))
    rows = []
    for (session, preset, M), g in p.groupby(["session", "preset", "M"], sort=False):
        g = g.set_index("part").base_us
        fl = {PARTS[k]: v for k, v in torch_part_floors(preset, int(M), c).items()}
        busy = float(g.get(BUSY, float("nan")))
        meta = tidy.meta("kernels_parts", session, path)
        for part, floor in fl.items():
            us = float(g.get(part, 0.0))
            rows.append(dict(session=session, commit=meta.get("commit", ""), preset=preset, M=int(M), part=part,
                             us=us, floor_us=floor, of_floor=floor / us if us else float("nan"),
                             busy_us=busy, nongemm_pct=100 * sum(float(g.get(q, 0.0)) for q in fl) / busy))
    return pd.DataFrame(rows)


def main() -> int:
    t = table()
    tables.write_table(OUT, t, replace=True, meta=dict(source="data/kernels/kernels_parts.csv (base arm)",
                                                        method=__doc__.strip()))
    print(t.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
