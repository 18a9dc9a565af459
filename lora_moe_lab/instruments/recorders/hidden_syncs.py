"""The hidden syncs serving engines shipped, as runnable patterns: each an original forward that
syncs, and its sync-free rewrite with the same output. Notebook 07, its tests and
studies/hidden_syncs/record.py all read PATTERNS; the recorded sessions are read by
analysers/hidden_sync_runs.py.

    case = build("lora_guard", Size.smoke(), "cpu")
    case.original(), case.rewrite()             # equal (bit for bit where `exact`)
    audit(case.original).kinds                  # {"item": case.per_forward}

Every forward is the same small multi-layer model: per layer `work` (M, H) x (H, H) matmuls with a
tanh, then the pattern's step, then a residual. The matmuls are the GPU work queued ahead of the
sync: when the step reads a device value, the host waits for them to finish, and the GPU then
idles while the host issues the next layer (the bubble). Metadata a serving engine knows on the
host (request lengths, which request has an adapter) is built once per batch, outside the forward,
from Python lists, and uploaded with one pinned non_blocking copy (as model/lora.py does).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

__all__ = [
    "Size",
    "Pattern",
    "Case",
    "PATTERNS",
    "KINDS_SEEN",
    "build",
    "names",
    "equal",
    "measure",
]


@dataclasses.dataclass(frozen=True)
class Size:
    tokens: int = 4096  # M
    hidden: int = 2048  # H
    layers: int = 8
    work: int = 2  # matmuls per layer ahead of the step
    experts: int = 4
    requests: int = 8

    @classmethod
    def smoke(cls) -> "Size":
        return cls(tokens=16, hidden=32, layers=3, work=1, experts=4, requests=4)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Size.{f.name} must be a positive int, got {v!r}")
        if self.tokens < 2 * self.requests:
            raise ValueError(f"Size.tokens={self.tokens} must be >= 2 x requests={self.requests}")


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    title: str
    kind: str  # the audit kind the original shows (audit.KINDS)
    per_layer: int | None  # syncs per layer of the original (None: the machine decides, see allocator)
    case: str  # the real case, as a fact
    fix: str  # the rewrite, in words
    exact: bool  # rewrite equal bit for bit
    make: Callable


@dataclasses.dataclass
class Case:
    pattern: Pattern
    size: Size
    original: Callable[[], torch.Tensor]
    rewrite: Callable[[], torch.Tensor]

    @property
    def per_forward(self) -> int | None:
        p = self.pattern.per_layer
        return None if p is None else p * self.size.layers


def _upload(values: list, device, dtype=torch.int64) -> torch.Tensor:
    """Host list -> device tensor the way a batch builder does it: pinned, one non_blocking copy."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _lens(s: Size) -> list[int]:
    """Request lengths summing to M, uneven (a real batch is)."""
    base = [1 + (i % 3) for i in range(s.requests)]
    rest = s.tokens - sum(base)
    out = [b + rest // s.requests for b in base]
    out[0] += s.tokens - sum(out)
    return out


class _Model:
    """The shared forward: the step sees (layer, h) and returns the layer's update."""

    def __init__(self, s: Size, device, seed: int):
        g = torch.Generator().manual_seed(seed)
        H = s.hidden
        self.s, self.dev = s, torch.device(device)
        self.x = torch.randn(s.tokens, H, generator=g).to(device)
        self.W = [
            [(torch.randn(H, H, generator=g) / H**0.5).to(device) for _ in range(s.work)]
            for _ in range(s.layers)
        ]
        self.gen = g

    def rand(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.gen) * scale).to(self.dev)

    def forward(self, step) -> torch.Tensor:
        x = self.x
        for layer in range(self.s.layers):
            h = x
            for w in self.W[layer]:
                h = torch.tanh(h @ w)  # the GPU work queued ahead of the step's sync
            x = x + step(layer, h)
        return x


# --- the patterns -----------------------------------------------------------------------------------
def _lora_guard(m: _Model):
    enabled = _upload([0, 1, 0, 0], m.dev, torch.int32)  # per-slot flags on the device
    has_active = any([0, 1, 0, 0])  # the same fact from the batch's Python list
    A, B = m.rand(m.s.hidden, 8, scale=0.1), m.rand(8, m.s.hidden, scale=0.1)

    def orig(layer, h):
        if enabled.any().item():  # HOST-DEVICE SYNC: the old guard
            return h + (h @ A) @ B
        return h

    def fix(layer, h):
        return h + (h @ A) @ B if has_active else h

    return orig, fix


def _if_tensor(m: _Model):
    def orig(layer, h):
        if torch.isinf(h).any():  # `if tensor:` calls bool(): a sync
            h = torch.nan_to_num(h)
        return h * 0.5

    def fix(layer, h):
        return torch.nan_to_num(h) * 0.5  # always: identity on finite values, no host decision

    return orig, fix


def _tolist_routing(m: _Model):
    E, H, D = m.s.experts, m.s.hidden, max(1, m.s.hidden // 16)
    Wg, We, Wo = m.rand(H, E), m.rand(E, H, D, scale=H**-0.5), m.rand(D, H, scale=D**-0.5)
    M = m.s.tokens

    def orig(layer, h):
        ids = torch.argmax(h @ Wg, dim=1)
        counts = torch.zeros(E, dtype=torch.long, device=h.device).scatter_add_(0, ids, torch.ones_like(ids))
        order = torch.argsort(ids, stable=True)
        parts = torch.split(h[order], counts.tolist())  # .tolist() of routing data: a sync
        out = torch.cat([p @ We[e] for e, p in enumerate(parts)])
        y = torch.empty_like(out)
        y[order] = out
        return y @ Wo

    def fix(layer, h):
        ids = torch.argmax(h @ Wg, dim=1)
        y = torch.bmm(h.expand(E, M, H), We)  # every expert on every token: static shapes (E x the FLOPs)
        return y[ids, torch.arange(M, device=h.device)] @ Wo

    return orig, fix


def _nonzero_where(m: _Model):
    def orig(layer, h):
        idx = torch.where(h[:, 0] > 0)[0]  # torch.where(cond) == nonzero: output size from device data
        return h.index_copy(0, idx, h[idx] * 2)

    def fix(layer, h):
        return torch.where((h[:, 0] > 0)[:, None], h * 2, h)  # three-argument where: static shape

    return orig, fix


def _mask_index(m: _Model):
    def orig(layer, h):
        mask = h[:, 1] > 0
        h = h.clone()
        h[mask] = torch.relu(h[mask]) * 3  # a read and a write through a boolean mask: two syncs
        return h

    def fix(layer, h):
        return torch.where((h[:, 1] > 0)[:, None], torch.relu(h) * 3, h)

    return orig, fix


def _unique(m: _Model):
    E = m.s.experts
    Wg = m.rand(m.s.hidden, E)

    def orig(layer, h):
        ids = torch.argmax(h @ Wg, dim=1)
        used = torch.zeros(E, device=h.device)
        used[torch.unique(ids)] = 1.0  # unique: its length is device data
        return h * (1.0 + used.mean())

    def fix(layer, h):
        ids = torch.argmax(h @ Wg, dim=1)
        used = torch.zeros(E, device=h.device).scatter_(0, ids, 1.0)  # a fixed-size mask instead
        return h * (1.0 + used.mean())

    return orig, fix


def _repeat_interleave(m: _Model):
    lens = _lens(m.s)
    counts = _upload(lens, m.dev)
    R, M = m.s.requests, m.s.tokens
    bias = m.rand(R, m.s.hidden, scale=0.1)
    req = torch.arange(R, device=m.dev)

    def orig(layer, h):
        return h + bias[torch.repeat_interleave(req, counts)]  # output length = counts.sum(): a sync

    def fix(layer, h):
        return h + bias[torch.repeat_interleave(req, counts, output_size=M)]  # M known on the host

    return orig, fix


def _max_item(m: _Model):
    lens = _lens(m.s)
    lens_dev = _upload(lens, m.dev)
    n_host = min(max(lens), m.s.hidden)

    def orig(layer, h):
        n = min(int(lens_dev.max().item()), h.shape[1])  # max().item() to size a buffer: a sync
        return torch.cat([h[:, :n] * 1.5, h[:, n:]], dim=1)

    def fix(layer, h):
        return torch.cat([h[:, :n_host] * 1.5, h[:, n_host:]], dim=1)  # the batch's max, from its list

    return orig, fix


def _cpu_log(m: _Model):
    log = []
    stats = torch.empty(m.s.layers, device=m.dev)

    def orig(layer, h):
        log.append(h.norm().cpu())  # logging a device value: a device-to-host copy (print is the same)
        return h

    def fix(layer, h):
        stats[layer] = h.norm()  # kept on the device; read once, after the step, if at all
        return h

    return orig, fix


def _pageable_copy(m: _Model):
    L, H = m.s.layers, m.s.hidden
    host = [torch.rand(H, generator=m.gen) + 0.5 for _ in range(L)]  # per-layer scales computed on the host
    buf = torch.empty(H, device=m.dev)
    pinned = torch.stack(host)
    if m.dev.type == "cuda":
        pinned = pinned.pin_memory()  # page-locked: the copy engine reads it by DMA, the host moves on
    dev_all = torch.empty(L, H, device=m.dev)

    def orig(layer, h):
        buf.copy_(host[layer], non_blocking=True)  # pageable source: staged by the host thread
        return h * buf

    def fix(layer, h):
        if layer == 0:  # one upload per forward from the pinned buffer (never rewritten while in flight)
            dev_all.copy_(pinned, non_blocking=pinned.is_pinned())
        return h * dev_all[layer]

    return orig, fix


def _allocator(m: _Model):
    M, H = m.s.tokens, m.s.hidden
    ws = torch.empty(M, H, device=m.dev)

    def orig(layer, h):
        out = torch.mul(h, 2.0, out=torch.empty(M, H, device=h.device))
        torch.cuda.empty_cache()  # "keep memory low": cudaFree syncs; the next allocation is a cudaMalloc
        return out

    def fix(layer, h):
        return torch.mul(h, 2.0, out=ws)  # a workspace allocated once, outside the forward

    return orig, fix


def _mamba_mask(m: _Model):
    R = m.s.requests
    track = [i % 2 == 0 for i in range(R)]  # which requests' states to keep: known at batch time
    mask = _upload(track, m.dev, torch.bool)
    idx_dev = _upload([i for i, t in enumerate(track) if t], m.dev)
    last = _upload([sum(_lens(m.s)[: i + 1]) - 1 for i in range(R)], m.dev)
    has_track = any(track)
    states = torch.zeros(m.s.layers, R, m.s.hidden, device=m.dev)

    def orig(layer, h):
        if mask.any():  # sync 1
            idx = mask.nonzero().squeeze(1)  # sync 2
            states[layer][idx] = h[last][idx]
        return h

    def fix(layer, h):
        if has_track:  # hoisted: the forward's metadata, from the batch's Python list
            states[layer].index_copy_(0, idx_dev, h.index_select(0, last).index_select(0, idx_dev))
        return h

    def wrap(step):
        def f(layer, h):
            return step(layer, h) + 0 * states[layer].sum()  # the states are an output too

        return f

    return wrap(orig), wrap(fix)


def _offsets_item(m: _Model):
    lens = _lens(m.s)
    pad = m.s.tokens // 8  # a padded chunk: the tail holds no real tokens
    lens[-1] -= pad
    offsets_host = [0]
    for n in lens:
        offsets_host.append(offsets_host[-1] + n)
    offsets = _upload(offsets_host, m.dev)

    def orig(layer, h):
        total = int(offsets[-1].item())  # the chunk's token count read from the device: a sync
        return torch.cat([h[:total] * 0.9, h[total:] * 0])

    def fix(layer, h):
        total = offsets_host[-1]  # the same number, from the host's list
        return torch.cat([h[:total] * 0.9, h[total:] * 0])

    return orig, fix


PATTERNS = [
    Pattern(
        "lora_guard",
        "the LoRA guard: adapter_enabled.any().item() per layer",
        "item",
        1,
        "sgl-project/sglang#25531: 260 syncs per forward; removed: +14.4 % input throughput, -12.6 % TTFT",
        "host-side metadata: has_active_lora from the batch's Python lists",
        True,
        _lora_guard,
    ),
    Pattern(
        "if_tensor",
        "`if tensor:` (an overflow check)",
        "item",
        1,
        "the implicit bool() behind `if tensor:` is an .item()",
        "static shapes: do the cheap op unconditionally on the device",
        True,
        _if_tensor,
    ),
    Pattern(
        "tolist_routing",
        ".tolist() of routing counts to split tokens per expert",
        "tolist",
        1,
        "MoE routing read back to size per-expert GEMMs; grouped kernels read counts on the device",
        "static shapes: every expert on a fixed layout (this lab's fused_moe reads counts on the GPU)",
        False,
        _tolist_routing,
    ),
    Pattern(
        "nonzero_where",
        "torch.where(cond) / nonzero to pick rows",
        "shape",
        1,
        "one-argument where is nonzero: its length is device data",
        "three-argument torch.where: a static shape",
        True,
        _nonzero_where,
    ),
    Pattern(
        "mask_index",
        "boolean-mask indexing: h[mask] = f(h[mask])",
        "shape",
        2,
        "a boolean index is a nonzero on the read and on the write",
        "torch.where over all rows (or masked_fill): a static shape",
        True,
        _mask_index,
    ),
    Pattern(
        "unique",
        "torch.unique of expert ids",
        "shape",
        1,
        "unique's output length is device data",
        "a fixed-size mask by scatter_ (bincount syncs on CUDA too: it sizes its output)",
        True,
        _unique,
    ),
    Pattern(
        "repeat_interleave",
        "repeat_interleave without output_size",
        "shape",
        1,
        "this lab's own batch upload passes output_size=M (model/lora.py)",
        "output_size from the host's token count",
        True,
        _repeat_interleave,
    ),
    Pattern(
        "max_item",
        "max().item() to size a buffer",
        "item",
        1,
        "a padded buffer sized by the longest request, read from the device",
        "host-side metadata: the batch's max length from its list (or a static bound)",
        True,
        _max_item,
    ),
    Pattern(
        "cpu_log",
        ".cpu() / print of a tensor in the forward",
        "d2h",
        1,
        "debug logging left in a forward",
        "keep values on the device; read after the step",
        True,
        _cpu_log,
    ),
    Pattern(
        "pageable_copy",
        "non_blocking=True copy from pageable memory",
        "pageable",
        1,
        "vLLM's sync check flags non_blocking copies from unpinned memory",
        "pinned buffers: one non_blocking upload per forward",
        True,
        _pageable_copy,
    ),
    Pattern(
        "allocator",
        "cache-allocator growth inside the forward (empty_cache + fresh buffers)",
        "allocator",
        None,
        "cudaFree synchronizes the device; cudaMalloc is slow",
        "a workspace allocated once; no empty_cache in the forward (capture-safe too)",
        True,
        _allocator,
    ),
    Pattern(
        "mamba_mask",
        "per-layer mask .any() + nonzero()",
        "item",
        2,
        "sgl-project/sglang#32589: 56 syncs per prefill forward (27 mamba layers); hoisted into "
        "per-forward metadata",
        "host-side metadata, once per forward",
        True,
        _mamba_mask,
    ),
    Pattern(
        "offsets_item",
        "[-1].item() of an offsets tensor in chunked prefill",
        "item",
        1,
        "sgl-project/sglang#33662: swa_offsets[-1].item(); removed: +12.6 % prefill throughput, "
        "-31.6 % TTFT p50",
        "host-side metadata: the total from the host's offsets list",
        True,
        _offsets_item,
    ),
]
_BY_NAME = {p.name: p for p in PATTERNS}
# the mamba mask shows two kinds: bool() of .any() (item) and nonzero (shape)
KINDS_SEEN = {p.name: {p.kind} for p in PATTERNS} | {"mamba_mask": {"item", "shape"}}


def names() -> list[str]:
    return [p.name for p in PATTERNS]


_BASE: dict = {}  # (size, device, seed) -> the shared base model (one at a time: H200 weights are 128 MB)


def build(name: str, size: Size | None = None, device="cpu", seed: int = 0) -> Case:
    """The pattern's original and rewrite forwards on `device`, same weights and inputs. The base
    model is shared between patterns; each pattern's own tensors come from its own seed."""
    if name not in _BY_NAME:
        raise KeyError(f"unknown pattern {name!r}; choose one of {names()}")
    s = size or Size()
    key = (s, str(torch.device(device)), seed)
    if key not in _BASE:
        _BASE.clear()
        _BASE[key] = _Model(s, device, seed)
    m = _BASE[key]
    m.gen = torch.Generator().manual_seed(seed + 1 + names().index(name))
    orig, fix = _BY_NAME[name].make(m)
    return Case(_BY_NAME[name], s, lambda: m.forward(orig), lambda: m.forward(fix))


def equal(case: Case) -> tuple[bool, float]:
    """(rewrite matches the original, relative Frobenius error): bit for bit where the pattern is
    exact, else within 1e-5 (fp32: the rewrite reorders a reduction, e.g. another GEMM shape)."""
    a, b = case.original(), case.rewrite()
    err = float(((a.double() - b.double()).norm() / a.double().norm().clamp_min(1e-300)).item())
    return (bool(torch.equal(a, b)) if case.pattern.exact else err < 1e-5), err


# --- measuring a pattern (the recording script and notebook 07's live run) --------------------------
def _time_ms(fn, device) -> float:
    import time

    from ... import runtime

    t0 = time.perf_counter()
    fn()
    runtime.synchronize(device)  # the forward ends when the GPU is done: a sync's host blocking counts
    return (time.perf_counter() - t0) * 1e3


def measure(
    name: str, size: Size | None = None, device="cpu", reps: int = 24, warmup: int = 4, session: str = "live",
    estimator=None,
) -> dict:
    """One row: the rewrite checked equal and audited sync-free (on a GPU also inside checked_region),
    the original audited (its syncs per forward: the occurrences), then both forwards timed
    interleaved and paired (order alternating per repetition, `warmup` pairs discarded first, the
    warm-up drift checked by stats.warmup_check), the paired median difference (µs) with its
    bootstrap 95 % interval, and per occurrence. An unsettled point keeps NaN figures. `estimator`: the
    audit's saving estimator (lora_moe_lab.audit.estimate, the replay engine) for the audit_saving_us column."""
    import math

    import numpy as np

    from ..analysers import stats
    from .audit import audit
    from .syncs import checked_region

    cuda = torch.device(device).type == "cuda"
    s = size or Size()
    case = build(name, s, device)
    same, err = equal(case)
    checked = True
    if cuda:
        try:
            with checked_region():
                case.rewrite()
        except Exception:  # noqa: BLE001 - a rewrite that syncs is a finding, recorded
            checked = False
    dev = "cuda" if cuda else "cpu"  # audit the tensors' device (a CPU case on a GPU machine too)
    fix_syncs = audit(case.rewrite, warmup=0, reps=1, profile=False, device=dev).count
    rep = audit(case.original, warmup=1, reps=1, profile=cuda, device=dev, estimator=estimator)
    t = rep.table()
    row = dict(
        session=session,
        pattern=name,
        kind=case.pattern.kind,
        equal=same,
        rel_err=err,
        rewrite_syncs=fix_syncs,
        rewrite_checked=checked,
        occurrences=rep.count,
        kinds=" ".join(sorted(rep.kinds)),
        sites=" ".join(sorted(rep.sites)),
        audit_host_blocked_us=float(t["host_blocked_us_per_call"].sum()) if len(t) else 0.0,
        audit_gpu_idle_us=float(np.nansum(t["gpu_idle_after_us"])) if cuda and len(t) else math.nan,
        audit_saving_us=rep.total_saving_ns / 1e3 if cuda else math.nan,
        tokens=s.tokens,
        hidden=s.hidden,
        layers=s.layers,
        work=s.work,
    )
    arms = {"original": [], "rewrite": []}
    fns = {"original": case.original, "rewrite": case.rewrite}
    for i in range(warmup + reps):
        for arm in ("original", "rewrite") if i % 2 == 0 else ("rewrite", "original"):
            arms[arm].append(_time_ms(fns[arm], device))
    a, b = np.array(arms["original"][warmup:]), np.array(arms["rewrite"][warmup:])
    wc = stats.warmup_check({"original": a, "rewrite": b}, min_keep=min(stats.MIN_PAIRED_REPS, len(a)))
    row.update(
        n=len(a) - wc.dropped,
        dropped=wc.dropped,
        warmup_discarded=warmup,
        status=wc.status,
        warmup_note=wc.note,
        method=stats.METHOD_BOOT,
    )
    row.update(
        dict.fromkeys(
            [
                "original_ms",
                "rewrite_ms",
                "diff_us",
                "diff_lo_us",
                "diff_hi_us",
                "per_occ_us",
                "per_occ_lo_us",
                "per_occ_hi_us",
            ],
            math.nan,
        )
    )
    if wc.stable and len(a) - wc.dropped >= stats.MIN_PAIRED_REPS:
        ak, bk = a[wc.dropped :], b[wc.dropped :]
        d, lo, hi = stats.bootstrap_paired(ak * 1e3, bk * 1e3, "median_diff")  # µs
        row.update(
            original_ms=float(np.median(ak)),
            rewrite_ms=float(np.median(bk)),
            diff_us=d,
            diff_lo_us=lo,
            diff_hi_us=hi,
        )
        if rep.count:
            row.update(per_occ_us=d / rep.count, per_occ_lo_us=lo / rep.count, per_occ_hi_us=hi / rep.count)
    return row
