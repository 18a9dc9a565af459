"""The simulator calibrated on the canonical GPU recording, and its one home on disk.

    cal = calibrate(load_guards())   # fit on every point, held-out validation, production extrapolation
    cal.save(folder)                 # simulator_fit.json, simulator_validation.csv, simulator_vs_production.csv
                                     # (studies/simulator/record.py; no folder: the catalog's "simulator")
    cal = load_calibration()         # what the notebooks show on a machine without a GPU

Every production figure the project quotes (README, notebook 05) is `cal.production`: one
extrapolation with PRODUCTION_SETTINGS, read from simulator_vs_production.csv.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..instruments.analysers import schemas
from ..instruments.recorders import tables
from ..provenance import DATA, catalog, label as _label, normalize_meta, repo_relative
from .cost import CostModel
from .fit import FIT_BOUNDS, FIT_PARAMS_RECORDED, FitResult, Validation, fit, holdout
from .production import compare_production, extrapolate

FILES = {"fit": "simulator_fit.json", "validation": "simulator_validation.csv",
         "production": "simulator_vs_production.csv"}
# The production extrapolation (sim/production.py: extrapolate): Qwen3-30B-A3B at TP=4, 48 layers,
# a 128 x 2048-token prefill in chunks, half the tokens with an adapter, one all-reduce per layer,
# and ONE guard sync per layer as in this lab's model (48 per forward; production counted 260).
PRODUCTION_SETTINGS = dict(preset="qwen3-30b-a3b-tp4", layers=48, batch=128, input_len=2048, chunks=(8192, 16384),
                           active=0.5, rank=16, tp=4, collective=True, syncs_per_layer=1)
HEADLINE_CHUNK = 16384  # the chunk whose figures the README quotes


@dataclass
class Calibration:
    fit: FitResult  # fitted on every point of the recording
    validation: Validation  # held out: each point predicted by a fit that did not see it
    production: pd.DataFrame  # compare_production(extrapolate(params, **PRODUCTION_SETTINGS))
    recording: dict  # the recording's metadata (gpu, commit, date) and file

    @property
    def params(self) -> CostModel:
        return self.fit.params

    @property
    def label(self) -> str:
        """The recording's label ("H200 · commit 1a2b3c4 · 2026-11-30"), for every caption."""
        return _label(self.recording)

    def headline(self, chunk: int = HEADLINE_CHUNK) -> dict:
        """metric -> predicted value at one chunk (eager): the figures the README quotes."""
        p = self.production
        p = p[(p["tokens"] == chunk) & (p["mode"] == "eager")]
        return {r.metric: float(r.predicted) for r in p.itertuples()}

    def save(self, folder: str | Path | None = None) -> Path:
        folder = _folder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        f = self.fit
        # "fitted": the parameters, "fitted_names": those the fit moved (the keys sim/tp.py reads too)
        doc = dict(recording=dict(self.recording, label=self.label), fitted=f.params.as_dict(),
                   fitted_names=list(f.fitted), at_bound=list(f.at_bound), bounds={p: FIT_BOUNDS[p] for p in f.fitted},
                   rows=f.rows, rms_log_error=f.rms_log_error, sources=f.sources,
                   validation=dict(how=self.validation.how, target_pct=self.validation.target_pct,
                                   points=len(self.validation.points),
                                   passed=int(self.validation.points["passes"].sum())),
                   production_settings=dict(PRODUCTION_SETTINGS, chunks=list(PRODUCTION_SETTINGS["chunks"])),
                   headline_chunk=HEADLINE_CHUNK, headline=self.headline())
        # each file whole (temp file + rename; instruments/recorders/tables.py), then the tables' seals
        tables.write_json_atomic(folder / FILES["fit"], doc)
        for key, df in (("validation", self.validation.points), ("production", self.production)):
            path = folder / FILES[key]
            tables.write_text_atomic(path, df.to_csv(index=False))
            tables.seal(path)
        return folder


def production_figures(params: CostModel) -> pd.DataFrame:
    """The production extrapolation with PRODUCTION_SETTINGS, beside production's figures."""
    return compare_production(extrapolate(params, **PRODUCTION_SETTINGS))


def calibrate(rec, *, target_pct: float = 15.0, params=FIT_PARAMS_RECORDED) -> Calibration:
    """Fit on every point of a recording (`instruments.analysers.recordings.Recording`), validate leaving one
    token count out, extrapolate to production. Deterministic: the same recording gives the same
    numbers (fixed starting values, no random restarts)."""
    sweep = rec.as_sweep()
    f = fit(sweep, params=params)
    v = holdout(sweep, by="tokens", target_pct=target_pct, params=params)
    meta = normalize_meta(rec.meta)
    recording = {k: meta.get(k, "") for k in ("gpu", "commit", "date")}
    recording["file"] = str(rec.path.relative_to(DATA)) if rec.path and DATA in rec.path.parents else str(rec.path)
    return Calibration(f, v, production_figures(f.params), recording)


def _folder(folder: str | Path | None) -> Path:
    """The calibration's folder: the one handed, else the catalog's "simulator"."""
    return Path(folder) if folder is not None else catalog("simulator")


def load_calibration(folder: str | Path | None = None) -> Calibration:
    """The calibration studies/simulator/record.py wrote (no refit), in `folder` or the catalog's "simulator"."""
    folder = _folder(folder)
    path = folder / FILES["fit"]
    doc = schemas.read_json(path)
    if "recording" not in doc or "fitted_names" not in doc:
        raise ValueError(f"{path} is of an older format (no recording or fitted names): re-run "
                         "studies/simulator/record.py")
    f = FitResult(CostModel(**doc["fitted"]), doc["rms_log_error"], doc["rows"], tuple(doc["fitted_names"]),
                  doc["sources"], tuple(doc["at_bound"]))
    val = doc["validation"]
    v = Validation(schemas.read_csv(folder / FILES["validation"], "simulator_validation"), val["target_pct"],
                   val["how"])
    rec = {k: v_ for k, v_ in doc["recording"].items() if k != "label"}
    return Calibration(f, v, schemas.read_csv(folder / FILES["production"], "simulator_vs_production"), rec)


def readme_block(folder: str | Path | None = None) -> str:
    """The README's simulator paragraph (scripts/readme_tables.py), written from the saved calibration
    only: the same numbers notebook 05 shows. It names the folder it read (repo-relative)."""
    from .production import PRODUCTION as P

    folder = _folder(folder)
    where = repo_relative(str(folder.resolve()))
    cal = load_calibration(folder)
    f, v, p, s = cal.fit, cal.validation, cal.params, PRODUCTION_SETTINGS
    rows = ["| guard | mode | points | pass | mean abs error | worst |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    rows += [f"| {r.guard} | {r.mode} | {r.n} | {r.passed} | {r.mean_abs_err_pct:.1f} % | {r.max_abs_err_pct:.1f} % |"
             for r in v.summary.itertuples()]
    bound = (f" {', '.join(f'`{b}`' for b in f.at_bound)} ended on the edge of its range: the recording barely "
             "constrains it." if f.at_bound else "")

    def figs(h):
        return (f"{h['input_throughput_gain_pct']:+.1f} % input throughput, {h['ttft_change_pct']:+.1f} % TTFT, "
                f"{h['stall_us_per_sync']:.0f} µs lost per sync")

    h = cal.headline()
    other = [c for c in s["chunks"] if c != HEADLINE_CHUNK]
    return "\n".join([
        f"The host/device queue model (`lora_moe_lab.sim`) fitted to the archived guards recording ({cal.label}) by "
        f"`studies/simulator/record.py`, into `{where}/`: {f.rows} points, rms log error "
        f"{f.rms_log_error:.2f}. Host: {p.launch_us:.1f} µs per eager launch, {p.triton_extra_us:.0f} µs more per "
        f"Triton launch, {p.sync_us:.1f} µs after each sync; device: {p.kernel_us:.2f} µs per kernel, "
        f"{p.tflops:.0f} TFLOP/s, {p.tbps:.2f} TB/s.{bound}", "",
        f"Validated on points the fit did not see ({v.how.removeprefix('held out: ')}): "
        f"**{int(v.points['passes'].sum())} of {len(v.points)} pass** (within ±{v.target_pct:g} % of the measured "
        "median, or inside its 95 % interval where that is wider). The misses, each with why, are in "
        "`simulator_validation.csv` and notebook 05.", ""] + rows + [
        "",
        f"Extrapolated to production ({s['preset']}: one TP={s['tp']} rank, {s['layers']} layers, "
        f"{s['syncs_per_layer']} guard sync per layer = {h['syncs_per_forward']:.0f} syncs per forward, "
        f"{s['batch']} × {s['input_len']} input tokens in {HEADLINE_CHUNK}-token chunks, half of them with an "
        f"adapter), removing the guard gives **{figs(h)}** (GPU time lost per sync: the forward difference); "
        f"production: {P['input_throughput_gain_pct']:+.1f} %, {P['ttft_change_pct']:+.1f} % over "
        f"{P['syncs_per_forward']:.0f} syncs per forward, and no published time lost per sync (its ~100 ms per "
        "forward is host time blocked in the syncs)."
        + "".join(f" At {c}-token chunks: {figs(cal.headline(c))}." for c in other)
        + f" Every figure: `{where}/{FILES['production']}`."])
