"""Adapter pool, per-batch LoRA metadata built on the host, and the per-layer `LoRAInfo`.

The point of this module: whether *any* adapter is active in a batch is known on the host the
moment the batch is built (it is a property of plain Python lists), so `has_active_lora` costs
nothing. Asking the GPU the same question later (`tensor.any().item()`) costs a host-device sync.
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field

import torch

from .. import runtime
from ..config import LoRAConfig, MoEShape, check_int, check_real, parse_dtype
from . import init

_POOL_IDS = itertools.count(1)  # every AdapterPool gets its own id (id() could be reused after a pool is freed)


class ForeignBatchError(ValueError):
    """A batch (or its device tensors) that another adapter pool built: its slot numbers name that pool's slots."""


class StaleBatchError(ValueError):
    """A batch built before one of the slots it uses was unloaded or reloaded: it would apply the slot's new
    weights (another adapter) to requests that asked for the old one."""


class AdapterNotLoadedError(KeyError):
    """An adapter name the pool does not hold: never loaded, or unloaded since (the message then names the slot it
    left). A KeyError, as a missing name is; its message is printed as written (KeyError would quote it)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class AdapterWeightsError(ValueError):
    """Adapter weights refused at load: a tensor missing, of the wrong shape or dtype, or holding NaN or inf (given,
    or after the scaling is folded into B in the pool's dtype). The message names the adapter, the layer and the
    first bad tensor (with the index and value of its first bad element); the pool is left as it was."""


LORA_TENSORS = ("gate_up_a", "gate_up_b", "down_a", "down_b")  # the names load_weights takes and errors name
# the load-time overflow probe (AdapterPool._check_written): run where the pool's dtype tops out below this (float16)
NARROW_RANGE, PROBE_ROWS = 1e6, 16
DELTA_PARTS = ("gate delta", "up delta", "SiLU(gate) x up of the deltas", "down delta")
INT32_MAX = 2**31 - 1  # the batch's token offsets and the per-token mapping are int32 on the device


def _first_bad(t: torch.Tensor):
    """(index, value) of the first NaN or inf element of `t` (row-major), or None. Reads the device (a sync): for
    load time only."""
    ok = torch.isfinite(t)
    if bool(ok.all()):
        return None
    flat = int((~ok).reshape(-1).nonzero()[0, 0])
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))
    return idx, float(t[idx])


def pool_layer_bytes(shape: MoEShape, lora: LoRAConfig, dtype: torch.dtype) -> int:
    """One layer's stacks in an `AdapterPool` (the layout below: gate_up A and B, down A and B, every slot and
    expert at the pool's max rank). Read by the build's sizing (model/sizing.py) before anything is allocated."""
    S, E, K, I, r = lora.max_loras, shape.num_experts, shape.hidden, shape.intermediate, lora.max_rank
    return (2 * S * E * r * K + 2 * S * E * I * r + S * E * r * I + S * E * K * r) * dtype.itemsize


@dataclass
class LayerLoRAWeights:
    """Stacked LoRA weights of one MoE layer (layout of docs/design.md; S slots, E experts)."""

    gate_up_a: torch.Tensor  # (2, S, E, r, K)   slice 0 = gate, 1 = up
    gate_up_b: torch.Tensor  # (2, S, E, I, r)   scaling already folded in
    down_a: torch.Tensor  # (S, E, r, I)
    down_b: torch.Tensor  # (S, E, K, r)          scaling already folded in
    # the LoRA paths' own layouts of these stacks (kernels/paths/: the packed path's B_packed, the wide path's wider
    # base weights), {key: (tensor, refresh, tag)}: built by the path at first use, outside any graph (the layer's
    # warm-up), then rewritten in place by every load and unload (`refresh`), so a captured graph that reads one sees
    # the new adapter as it does the stacks. The pool never knows what they hold.
    derived: dict = field(default_factory=dict, repr=False)

    def derive(self, key, build, refresh, tag=None) -> torch.Tensor:
        """The tensor a path keeps under `key`: build() at first use or when `tag` (what it was built from) changed;
        refresh(weights, t) rewrites it in place after every load and unload, in the order the tensors were first
        built. refresh is handed these weights rather than holding them: a swapped-out pool's GPU memory is then
        freed when its last reference goes, not at the cyclic collector's next pass."""
        d = self.derived.get(key)
        if d is None or d[2] != tag:
            self.derived[key] = d = (build(), refresh, tag)
        return d[0]

    def refresh_derived(self) -> None:
        for t, refresh, _ in list(self.derived.values()):
            refresh(self, t)


class AdapterPool:
    """`max_loras` slots of LoRA weights for every expert of every layer.

    Weights live in preallocated stacks that are never reallocated: loading an adapter writes into
    its slot in place, so a captured CUDA graph that reads the stacks sees the new adapter.
    Smaller ranks are zero-padded up to `max_rank`; `scaling` is folded into B at load time.
    `load` draws a seeded random adapter, `load_weights` takes given tensors; both refuse (a named error, the pool
    left as it was) a rank above `max_rank` and weights that are NaN or inf, given or once scaled in the pool's dtype.
    """

    def __init__(self, shape: MoEShape, lora: LoRAConfig = LoRAConfig(), *, num_layers: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 tp_rank: int = 0, tp_size: int = 1):
        # Under tensor parallelism `shape` is one rank's: B of gate_up and A of down hold this
        # rank's slice of the intermediate dim, drawn from the same seeded full tensors.
        if not isinstance(shape, MoEShape):
            raise ValueError(f"shape must be a MoEShape (config.get_shape), got {shape!r}")
        if not isinstance(lora, LoRAConfig):
            raise ValueError(f"lora must be a LoRAConfig, got {lora!r}")
        self.shape, self.cfg = shape, lora
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.num_layers = shape.num_layers if num_layers is None else check_int("num_layers", num_layers, 1)
        self.dtype, self.device = parse_dtype(dtype), runtime.resolve_device(device)
        dtype = self.dtype
        S, E, K, I, r = lora.max_loras, shape.num_experts, shape.hidden, shape.intermediate, lora.max_rank
        z = dict(dtype=dtype, device=self.device)
        self.layers = [
            LayerLoRAWeights(torch.zeros(2, S, E, r, K, **z), torch.zeros(2, S, E, I, r, **z),
                             torch.zeros(S, E, r, I, **z), torch.zeros(S, E, K, r, **z))
            for _ in range(self.num_layers)
        ]
        self.slot_names: list[str | None] = [None] * S
        self.slot_ranks: list[int] = [0] * S
        # IDENTITY. A batch records the pool that built it (`pool_id`) and the generation of each slot its requests
        # use; every load and unload bumps the slot's generation, so a batch built before a slot was reused is
        # recognised (`check_batch`) on the host, from plain ints.
        self.pool_id: int = next(_POOL_IDS)
        self.slot_generations: list[int] = [0] * S
        # adapter name -> the slot it was last unloaded from (host bookkeeping for the error that names it)
        self.unloaded: dict[str, int] = {}

    # --- host-side bookkeeping (plain Python; never touches the GPU) ---------------------------
    @property
    def max_loras(self) -> int:
        return self.cfg.max_loras

    @property
    def max_rank(self) -> int:
        return self.cfg.max_rank

    def loaded(self) -> dict[str, int]:
        return {n: s for s, n in enumerate(self.slot_names) if n is not None}

    def slot_of(self, name: str) -> int:
        try:
            return self.slot_names.index(name)
        except ValueError:
            gone = self.unloaded.get(name) if isinstance(name, str) else None
            why = (f": it was unloaded from slot {gone} and is no longer in the pool" if gone is not None else "")
            raise AdapterNotLoadedError(f"unknown adapter {name!r}{why}; loaded adapters: "
                                        f"{sorted(self.loaded())}") from None

    def max_loaded_rank(self) -> int:
        return max(self.slot_ranks)

    # --- load / unload ---------------------------------------------------------------------------
    def load(self, name: str, rank: int, *, scaling: float = 1.0, seed: int | None = None,
             slot: int | None = None) -> int:
        """Load a seeded random adapter into a free slot (or `slot`); returns the slot."""
        scaling, slot = self._claim(name, rank, scaling, slot)
        if seed is not None:
            check_int(f"adapter {name!r}: seed", seed)
        seed = zlib.crc32(name.encode()) if seed is None else seed
        gen = torch.Generator(device=self.device).manual_seed(seed)
        K, I = self.shape.hidden, self.shape.intermediate
        for w in self.layers:
            self._fill(w, slot, rank, scaling, K, I, gen)
            w.refresh_derived()
        self._check_written(name, rank, scaling, slot)
        return self._register(name, rank, slot)

    def load_weights(self, name: str, weights: dict, *, scaling: float = 1.0, slot: int | None = None) -> int:
        """Load an adapter from given weights (a converted checkpoint) into a free slot (or `slot`); returns the slot.
        `weights` maps each of LORA_TENSORS to a tensor over every layer of the full (un-split) model, of rank r:

            gate_up_a (L, 2, E, r, K)   gate_up_b (L, 2, E, I, r)   down_a (L, E, r, I)   down_b (L, E, K, r)

        (slice 0 of gate_up is the gate, 1 the up projection; I the full intermediate size: under tensor parallelism
        this rank keeps its slice). The rank is read from gate_up_a; `scaling` is folded into B as `load` does.
        Refused before anything is written (AdapterWeightsError, or ValueError for the rank, naming the adapter):
        a missing or extra tensor, a wrong shape or a non-float dtype, a rank above the pool's maximum, NaN or inf
        anywhere (the first bad tensor, layer and element are named). The check reads each tensor's finiteness on
        the host: a sync per tensor, at load time, never in a forward."""
        if not isinstance(weights, dict):
            raise AdapterWeightsError(f"adapter {name!r}: weights must be a dict of {list(LORA_TENSORS)}, "
                                      f"got {type(weights).__name__}")
        missing = [k for k in LORA_TENSORS if k not in weights]
        extra = sorted(set(weights) - set(LORA_TENSORS), key=str)
        if missing or extra:
            raise AdapterWeightsError(f"adapter {name!r}: weights need exactly {list(LORA_TENSORS)}; "
                                      f"missing {missing}, unexpected {extra}")
        for k in LORA_TENSORS:
            t = weights[k]
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise AdapterWeightsError(f"adapter {name!r}: {k} must be a floating-point tensor, got "
                                          f"{getattr(t, 'dtype', type(t).__name__)}")
        a13 = weights["gate_up_a"]
        rank = int(a13.shape[-2]) if a13.dim() == 5 else 0
        L, E, K, I = self.num_layers, self.shape.num_experts, self.shape.hidden, self.shape.intermediate * self.tp_size
        want = dict(gate_up_a=(L, 2, E, rank, K), gate_up_b=(L, 2, E, I, rank), down_a=(L, E, rank, I),
                    down_b=(L, E, K, rank))
        for k in LORA_TENSORS:
            if tuple(weights[k].shape) != want[k]:
                raise AdapterWeightsError(f"adapter {name!r}: {k} has shape {tuple(weights[k].shape)}, this pool "
                                          f"needs {want[k]} (layers, [2,] experts, ... at rank {rank}; the full "
                                          f"intermediate size {I})")
        for k in LORA_TENSORS:  # before _claim: a NaN adapter never takes a slot
            bad = _first_bad(weights[k])
            if bad is not None:
                idx, val = bad
                raise AdapterWeightsError(f"adapter {name!r}: {k} holds {val} at {k}{list(idx)} (layer {idx[0]}): "
                                          "NaN or inf weights are refused at load")
        scaling, slot = self._claim(name, rank, scaling, slot)
        lo, Ir = self.shape.intermediate * self.tp_rank, self.shape.intermediate
        for i, w in enumerate(self.layers):
            src = {k: weights[k][i].to(device=self.device, dtype=self.dtype) for k in LORA_TENSORS}
            w.gate_up_a[:, slot].zero_()[:, :, :rank].copy_(src["gate_up_a"])
            w.gate_up_b[:, slot].zero_()[..., :rank].copy_(src["gate_up_b"][:, :, lo:lo + Ir] * scaling)
            w.down_a[slot].zero_()[:, :rank].copy_(src["down_a"][:, :, lo:lo + Ir])
            w.down_b[slot].zero_()[..., :rank].copy_(src["down_b"] * scaling)
            w.refresh_derived()
        self._check_written(name, rank, scaling, slot)
        return self._register(name, rank, slot)

    def _claim(self, name, rank, scaling, slot) -> tuple[float, int]:
        """The checks every load makes before it writes: (the scaling as a float, the slot to write)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"adapter name must be a non-empty string, got {name!r}")
        if name in self.slot_names:
            raise ValueError(f"adapter {name!r} is already loaded in slot {self.slot_names.index(name)}")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
            raise ValueError(f"adapter {name!r}: rank must be a positive int, got {rank!r}")
        if rank > self.max_rank:
            raise ValueError(f"adapter {name!r}: rank {rank} is above the pool's max rank {self.max_rank} "
                             f"(LoRAConfig.max_rank: the slots hold ranks up to {self.max_rank})")
        # a NaN or inf scaling, folded into B, would turn every row of the adapter into NaN
        scaling = check_real(f"adapter {name!r}: scaling", scaling)
        if slot is None:
            free = [s for s, n in enumerate(self.slot_names) if n is None]
            if not free:
                raise RuntimeError(f"all {self.max_loras} adapter slots are in use: unload one first")
            slot = free[0]
        elif not isinstance(slot, int) or isinstance(slot, bool):
            raise ValueError(f"adapter {name!r}: slot must be an int or None, got {slot!r}")
        elif not (0 <= slot < self.max_loras):
            raise IndexError(f"slot {slot} out of range [0, {self.max_loras})")
        elif self.slot_names[slot] is not None:
            raise ValueError(f"slot {slot} holds adapter {self.slot_names[slot]!r}: unload it first")
        return scaling, slot

    def _slot_tensors(self, w: LayerLoRAWeights, slot: int) -> tuple:
        return w.gate_up_a[:, slot], w.gate_up_b[:, slot], w.down_a[slot], w.down_b[slot]

    def _check_written(self, name: str, rank: int, scaling: float, slot: int) -> None:
        """The slot as written must be finite, and so must what it computes: a finite scaling folded into B can
        overflow the pool's dtype (float16 above 65504) in the weights, or, with finite weights, in the delta's
        outputs (float16 at scaling 64 gives inf, then NaN rows). The outputs are probed on PROBE_ROWS unit-scale
        input rows (seeded) per layer, in float32, where the dtype's range is narrow (`_delta_peaks`). One host read
        per load (every flag and peak stacked), never in a forward. Refused: the slot is zeroed again (as it was: it
        was free) and AdapterWeightsError names the first bad tensor or layer."""
        flags = torch.stack([torch.isfinite(t).all() for w in self.layers for t in self._slot_tensors(w, slot)])
        top = torch.finfo(self.dtype).max
        peaks = self._delta_peaks(slot) if top < NARROW_RANGE else None
        both = torch.cat([flags.float(), peaks.flatten()]) if peaks is not None else flags.float()
        host = both.cpu()  # the one read
        ok = bool(host[:len(flags)].all())
        over = None if peaks is None else (host[len(flags):].view(peaks.shape) > top).nonzero()
        if ok and (over is None or not len(over)):
            return
        for w in self.layers:
            for t in self._slot_tensors(w, slot):
                t.zero_()
            w.refresh_derived()
        if not ok:
            j = int((host[:len(flags)] == 0).nonzero()[0, 0])
            layer, k = divmod(j, len(LORA_TENSORS))
            raise AdapterWeightsError(f"adapter {name!r} (rank {rank}): {LORA_TENSORS[k]} of layer {layer} is not "
                                      f"finite in {self.dtype} after folding scaling={scaling:g} into B: refused, "
                                      f"slot {slot} left empty")
        layer, part = (int(v) for v in over[0])
        peak = float(host[len(flags):].view(peaks.shape)[layer, part])
        raise AdapterWeightsError(f"adapter {name!r} (rank {rank}): at scaling={scaling:g} its {DELTA_PARTS[part]} "
                                  f"reaches {peak:.3g} in layer {layer} on unit-scale inputs, past {self.dtype}'s "
                                  f"largest finite value {top:g}: its rows would overflow to inf and NaN; lower the "
                                  f"scaling or use bfloat16: refused, slot {slot} left empty")

    def _delta_peaks(self, slot: int) -> torch.Tensor:
        """(layers, 4) float32: the largest |value| of the adapter's gate delta, up delta, their product through
        SiLU and the down delta of it, on PROBE_ROWS seeded unit-normal input rows (what the delta computes on
        inputs of the scale the model's normalised activations have)."""
        gen = torch.Generator(device=self.device).manual_seed(0)
        out = []
        for w in self.layers:
            gu_a, gu_b, d_a, d_b = (t.float() for t in self._slot_tensors(w, slot))
            x = torch.randn(PROBE_ROWS, gu_a.shape[-1], generator=gen, device=self.device)
            g = torch.einsum("enr,eir->eni", torch.einsum("nk,erk->enr", x, gu_a[0]), gu_b[0])
            u = torch.einsum("enr,eir->eni", torch.einsum("nk,erk->enr", x, gu_a[1]), gu_b[1])
            h = torch.nn.functional.silu(g) * u
            d = torch.einsum("enr,ekr->enk", torch.einsum("eni,eri->enr", h, d_a), d_b)
            out.append(torch.stack([t.abs().amax() for t in (g, u, h, d)]))
        return torch.nan_to_num(torch.stack(out), nan=float("inf"))

    def _register(self, name: str, rank: int, slot: int) -> int:
        self.slot_names[slot], self.slot_ranks[slot] = name, rank
        self.slot_generations[slot] += 1
        self.unloaded.pop(name, None)
        return slot

    def _fill(self, w: LayerLoRAWeights, s: int, r: int, scaling: float, K: int, I: int, gen) -> None:
        def randn(*size, std):
            return init.randn(gen, self.device, *size, std=std)

        E = self.shape.num_experts
        If, lo = I * self.tp_size, I * self.tp_rank  # full intermediate, this rank's first index
        # A ~ N(0, 1/K) and B ~ N(0, 1/r): the delta has the same scale as the base projection,
        # so a dropped or doubled delta is far outside any tolerance.
        for t, (a, b, k_in) in enumerate([(w.gate_up_a[0], w.gate_up_b[0], K), (w.gate_up_a[1], w.gate_up_b[1], K)]):
            a[s].zero_()[:, :r].copy_(randn(E, r, k_in, std=k_in ** -0.5))
            b[s].zero_()[:, :, :r].copy_((randn(E, If, r, std=r ** -0.5) * scaling)[:, lo:lo + I])
        w.down_a[s].zero_()[:, :r].copy_(randn(E, r, If, std=If ** -0.5)[:, :, lo:lo + I])
        w.down_b[s].zero_()[:, :, :r].copy_(randn(E, K, r, std=r ** -0.5) * scaling)

    def unload(self, name: str) -> int:
        slot = self.slot_of(name)
        for w in self.layers:
            for t in (w.gate_up_a[:, slot], w.gate_up_b[:, slot], w.down_a[slot], w.down_b[slot]):
                t.zero_()
            w.refresh_derived()
        self.slot_names[slot], self.slot_ranks[slot] = None, 0
        self.slot_generations[slot] += 1
        self.unloaded[name] = slot
        return slot

    # --- identity of batches ---------------------------------------------------------------------
    def check_batch(self, batch: "LoRABatchInfo", tensors: "LoRABatchTensors | None" = None) -> None:
        """Refuse a batch this pool did not build (ForeignBatchError) or one built before a slot it uses was
        unloaded or reloaded (StaleBatchError, naming the adapter and the slot). The model's eager forward calls it
        once per forward. Host only: it compares plain Python ints that the batch recorded when it was built with
        the pool's; no device value is read, so it adds no host-device sync.

        SKIPPED UNDER CUDA-GRAPH CAPTURE AND REPLAY (`runtime.capture_mode()`, or a stream that is capturing): a
        captured graph reads the slot buffers by address, and reloading an adapter into a slot in place is how a
        graph is meant to follow new weights; the graph's metadata buffers are rewritten for each replay's batch.
        Checking there would be host work on the replay path for a reuse that is intended."""
        if runtime.in_capture_mode() or runtime.stream_capturing():
            return
        self._check_source("this batch", batch.pool_id, batch.slot_generations)
        built = getattr(tensors, "built_from", None)
        if built is not None:  # static buffers filled by hand (LoRABatchTensors.empty) carry none
            self._check_source("these batch tensors", *built)

    def _check_source(self, what: str, pool_id, generations) -> None:
        if pool_id != self.pool_id:
            raise ForeignBatchError(
                f"{what} came from adapter pool {pool_id} but this model reads adapter pool {self.pool_id}: a batch's "
                f"slot numbers only hold for the pool that built it (another lab may keep other adapters in them); "
                f"build the batch with this lab's make_batch")
        for slot, name, gen in generations:
            if self.slot_generations[slot] != gen:
                now = self.slot_names[slot]
                holds = f"now holds adapter {now!r}" if now is not None else "is now empty"
                raise StaleBatchError(
                    f"{what} was built for adapter {name!r} in slot {slot} (generation {gen}), but slot {slot} was "
                    f"unloaded or reloaded since and {holds} (generation {self.slot_generations[slot]}): it would "
                    f"apply other weights to the requests of {name!r}; build the batch again")


@dataclass
class LoRABatchInfo:
    """Per-batch LoRA metadata computed from Python lists on the host (no GPU involved)."""

    adapters: list[str | None]  # adapter name or None, per request
    token_counts: list[int]  # tokens per request
    req_slots: list[int]  # LoRA row per request, -1 = no adapter
    seg_indptr: list[int]  # request boundaries in the token dimension (R + 1)
    adapter_enabled: list[int]  # per row: 1 if some request of this batch uses it
    lora_ids: list[int]  # per row: its weight slot if an adapter is there, else -1
    lora_ranks: list[int]  # per row
    has_active_lora: bool  # THE flag: decided here, from lists, for free
    # identity: the pool that built the batch, and (slot, adapter, generation) of each slot its requests use
    # (AdapterPool.check_batch compares them with the pool's at the forward; host ints)
    pool_id: int | None = None
    slot_generations: tuple = ()

    # LoRA ROWS. By default a batch has one row per pool slot, row s = slot s (L = max_loras). With
    # `rows=L` it is COMPACTED: the adapters this batch uses get rows 0, 1, ... in slot order and
    # lora_ids maps each row to its slot; the rest of the L rows are empty (-1). The kernels' work
    # and the alignment then scale with L, not with the pool: what a `per_active_count` graph
    # captured for L active adapters launches.

    @property
    def num_tokens(self) -> int:
        return self.seg_indptr[-1]

    @property
    def num_rows(self) -> int:
        return len(self.lora_ids)

    @property
    def num_active(self) -> int:
        """Distinct adapters this batch uses (requests with tokens): host lists, free."""
        return sum(self.adapter_enabled)

    @classmethod
    def build(cls, pool: AdapterPool, adapters: list[str | None], token_counts: list[int],
              rows: int | None = None) -> "LoRABatchInfo":
        if len(adapters) != len(token_counts):
            raise ValueError(f"{len(adapters)} adapter entries but {len(token_counts)} token counts: "
                             f"one each per request")
        if not adapters:
            raise ValueError("a batch needs at least one request")
        for i, c in enumerate(token_counts):
            if not isinstance(c, int) or isinstance(c, bool) or c < 0:
                raise ValueError(f"token counts must be non-negative ints, got {c!r}")
            if c > INT32_MAX:
                raise ValueError(f"token_counts={c} (request {i}) is past int32 ({INT32_MAX}): the batch's offsets "
                                 "are int32 on the device")
        if sum(token_counts) > INT32_MAX:
            raise ValueError(f"token_counts sum to tokens={sum(token_counts)}, past int32 ({INT32_MAX}): the batch's "
                             "offsets are int32 on the device; split it into smaller batches")
        slots = [-1 if a is None else pool.slot_of(a) for a in adapters]  # KeyError names an unknown adapter
        generations = tuple((s, pool.slot_names[s], pool.slot_generations[s]) for s in sorted(set(slots)) if s >= 0)
        indptr = [0]
        for c in token_counts:
            indptr.append(indptr[-1] + c)
        if indptr[-1] == 0:
            raise ValueError("a batch needs at least one token")
        enabled = [0] * pool.max_loras
        for s, c in zip(slots, token_counts):
            if s >= 0 and c > 0:
                enabled[s] = 1
        lora_ids = [s if n is not None else -1 for s, n in enumerate(pool.slot_names)]
        ranks = list(pool.slot_ranks)
        if rows is not None:
            slots, enabled, lora_ids, ranks = _compact(slots, enabled, pool.slot_ranks, rows, pool.max_loras)
        return cls(list(adapters), list(token_counts), slots, indptr, enabled, lora_ids,
                   ranks, has_active_lora=any(enabled), pool_id=pool.pool_id, slot_generations=generations)

    @classmethod
    def random(cls, pool: AdapterPool, num_requests: int, tokens_per_request: int, active_fraction: float,
               *, seed: int = 0) -> "LoRABatchInfo":
        """A batch where `active_fraction` of the requests use one of the loaded adapters."""
        import random

        check_int("num_requests", num_requests, 1)
        check_int("tokens_per_request", tokens_per_request, 1)
        active_fraction = check_real("active_fraction", active_fraction, 0.0, 1.0)  # True would pass as 1.0
        check_int("seed", seed)
        rng = random.Random(seed)
        names = sorted(pool.loaded())
        if active_fraction > 0 and not names:
            raise ValueError("active_fraction > 0 but the pool has no adapter loaded")
        n_active = round(active_fraction * num_requests)
        act = set(rng.sample(range(num_requests), n_active))
        adapters = [rng.choice(names) if i in act else None for i in range(num_requests)]
        return cls.build(pool, adapters, [tokens_per_request] * num_requests)


def _compact(slots: list[int], enabled: list[int], slot_ranks: list[int], rows: int, max_loras: int):
    """Slot-indexed lists -> L = `rows` LoRA rows holding only the adapters in use (in slot order)."""
    if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= max_loras:
        raise ValueError(f"rows must be an int in [1, max_loras={max_loras}], got {rows!r}")
    used = [s for s, e in enumerate(enabled) if e]
    if len(used) > rows:
        raise ValueError(f"this batch uses {len(used)} adapters but only {rows} LoRA rows were asked for")
    row_of = {s: i for i, s in enumerate(used)}
    pad = rows - len(used)
    req_rows = [row_of.get(s, -1) for s in slots]  # a request on a slot with no tokens gets no row
    return (req_rows, [1] * len(used) + [0] * pad, used + [-1] * pad,
            [slot_ranks[s] for s in used] + [0] * pad)


@dataclass
class LoRABatchTensors:
    """The device copies of a batch's metadata. In capture mode these are static buffers that a
    new batch overwrites in place (the captured graph keeps reading the same addresses)."""

    seg_indptr: torch.Tensor  # (R + 1,) int32
    req_slots: torch.Tensor  # (R,) int32
    adapter_enabled: torch.Tensor  # (S,) int32
    lora_ids: torch.Tensor  # (S,) int32
    lora_ranks: torch.Tensor  # (S,) int32
    token_lora_mapping: torch.Tensor  # (M,) int32, slot or -1 per token
    # (pool_id, slot_generations) of the batch last written into these tensors (None: never written by from_batch)
    built_from: tuple | None = field(default=None, compare=False)

    @classmethod
    def empty(cls, num_requests: int, num_tokens: int, max_loras: int, device) -> "LoRABatchTensors":
        i = dict(dtype=torch.int32, device=device)
        return cls(torch.zeros(num_requests + 1, **i), torch.full((num_requests,), -1, **i),
                   torch.zeros(max_loras, **i), torch.full((max_loras,), -1, **i),
                   torch.zeros(max_loras, **i), torch.full((num_tokens,), -1, **i))

    @classmethod
    def from_batch(cls, b: LoRABatchInfo, device, out: "LoRABatchTensors | None" = None) -> "LoRABatchTensors":
        """Host lists -> device tensors with no host sync.

        All small per-request/per-slot lists travel in ONE host-to-device copy from pinned memory
        (non_blocking: the host does not wait). The per-token mapping is expanded on the GPU with
        `repeat_interleave(..., output_size=M)`: passing output_size is what keeps it sync-free
        (without it torch must read the repeat counts back to size the output).
        """
        device = torch.device(device)
        R, S, M = len(b.req_slots), len(b.lora_ids), b.num_tokens
        packed = torch.tensor(b.seg_indptr + b.req_slots + b.adapter_enabled + b.lora_ids + b.lora_ranks
                              + b.token_counts, dtype=torch.int32)
        if device.type == "cuda":
            packed = packed.pin_memory()
        dev = packed.to(device, non_blocking=True)
        o = 0
        parts = []
        for n in (R + 1, R, S, S, S, R):
            parts.append(dev[o:o + n])
            o += n
        indptr, slots, enabled, ids, ranks, counts = parts
        mapping = torch.repeat_interleave(slots, counts, output_size=M)
        built_from = (b.pool_id, b.slot_generations)
        if out is None:
            return cls(indptr, slots, enabled, ids, ranks, mapping, built_from=built_from)
        # Capture mode: overwrite the static buffers (shapes must match the captured batch).
        for name, new in zip(("seg_indptr", "req_slots", "adapter_enabled", "lora_ids", "lora_ranks",
                              "token_lora_mapping"), (indptr, slots, enabled, ids, ranks, mapping)):
            buf = getattr(out, name)
            if buf.shape != new.shape:
                raise ValueError(f"static buffer {name} has shape {tuple(buf.shape)} but this batch needs "
                                 f"{tuple(new.shape)}: a captured graph replays one batch geometry")
            buf.copy_(new, non_blocking=True)
        out.built_from = built_from
        return out


@dataclass
class LoRAInfo:
    """What one MoE layer's LoRA path needs (docs/design.md). `has_active_lora` defaults to True: a code
    path that forgets to set it launches kernels that exit early on the GPU; it never skips work."""

    weights: LayerLoRAWeights
    batch: LoRABatchTensors
    max_lora_rank: int
    has_active_lora: bool = True
    debug_check: bool = False  # cross-check the CPU flag against the device (SYNCS: debug only)
    # whether the deltas read each row's own rank (`batch.lora_ranks`) instead of the stacks' padded one: decided on
    # the host from the batch's rank list (some row below the padding), as has_active_lora is; False keeps the
    # kernels' unmasked build (nothing to skip when every adapter is at the pool's max rank)
    read_own_ranks: bool = False

    def __post_init__(self):
        # the rank the kernels loop to: above the slots' padded rank they would read past each adapter's A and B
        # (host ints only: the stacks' shapes, no device read)
        r, cap = self.max_lora_rank, self.weights.down_a.shape[2]
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= cap:
            raise ValueError(f"LoRAInfo: max_lora_rank must be an int in [0, {cap}] (the pool's max rank, the slots' "
                             f"padded rank), got {r!r}")

    # views of the batch tensors under the names of docs/design.md
    seg_indptr = property(lambda self: self.batch.seg_indptr)
    req_to_lora = property(lambda self: self.batch.req_slots)
    lora_ranks = property(lambda self: self.batch.lora_ranks)
    adapter_enabled = property(lambda self: self.batch.adapter_enabled)
    lora_ids = property(lambda self: self.batch.lora_ids)
    token_lora_mapping = property(lambda self: self.batch.token_lora_mapping)


def device_any_enabled(batch: LoRABatchTensors) -> torch.Tensor:
    """What the old guard asked the GPU each layer: 'is any adapter enabled?' (0-dim bool). One
    reduction: free of syncs to compute; *reading* it on the host (`.item()`) is the sync."""
    return batch.adapter_enabled.any()


def device_any_active(batch: LoRABatchTensors) -> torch.Tensor:
    """The token-level device truth 'does any token use an enabled adapter?' (0-dim bool), for the
    debug cross-check. Computing it is free of syncs; reading it on the host is a sync."""
    m = batch.token_lora_mapping.long()
    used = m >= 0
    enabled = batch.adapter_enabled.long()[m.clamp(min=0)] > 0
    return (used & enabled).any()


def check_flag_against_device(info: LoRAInfo) -> None:
    """Debug cross-check of the host flag. THIS SYNCS (it reads a device value on the host)."""
    truth = bool(device_any_active(info.batch).item())  # host-device sync, on purpose
    if truth and not info.has_active_lora:
        raise AssertionError("has_active_lora=False but the device says an adapter is active: the LoRA "
                             "delta would be silently dropped for this batch")
