"""LoRA under CUDA graphs: three ways serving engines capture a model whose batches may or may not
use adapters, side by side on the same model.

A graph replays fixed kernels with fixed grids on fixed buffers, so "which LoRA work runs" must be
settled either at capture time (several graphs, one chosen per batch on the host) or on the GPU
at run time (one graph, kernels that exit early):

    one_graph         ONE graph per batch size with the LoRA kernels always inside (all
                      `max_loras` rows). A batch without adapters replays it too: the kernels'
                      early exit (adapter disabled / no row) skips the work on the GPU.
    lora_split        TWO graphs per size: a base graph recorded with no LoRA kernel at all, used
                      when the batch uses no adapter (decided on the host from its Python lists),
                      and the one_graph graph otherwise.
    per_active_count  one graph per size and per BUCKET of active adapters (0 = the base graph,
                      then 1, 2, 4, ... up to max_loras). The batch is COMPACTED to as many LoRA
                      rows as its bucket (model/lora.py: LoRABatchInfo.build(rows=...)), so the
                      alignment and the LoRA kernels' work space shrink with the bucket. The bucket
                      is counted on the host from the request list: never a device read.

Batch sizes: each graph holds `size` requests of `tokens_per_request` tokens (decode: 1). A batch
of R <= size requests replays the smallest graph that fits, padded with requests that use no
adapter (their outputs are computed and dropped: a graph has fixed shapes). A batch larger than
every graph gets `NoGraphFits`, or runs eagerly with `fallback="eager"` (counted).

The same code runs without graphs (`use_graphs=False`, the only choice on a CPU): every "graph"
is then the eager forward of the exact padded, compacted batch it would replay, so the selection,
padding and compaction are tested on any machine, and on a GPU replay is compared with it bit for bit.

THE REGISTRY, as for the guards (model/guards.py): a strategy is a `GraphStrategy` subclass decorated
with `@register_strategy`; it says which graphs it captures (`graph_keys`) and which one a batch
replays (`pick_rows`). `one_graph` was called `launch_always` before 2026-12-01 (the name of the
guard it relies on); recordings made before then are read with the new name (`RENAMED`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .. import runtime
from .graphs import capture
from .lora import LoRABatchInfo, LoRABatchTensors

class GraphStrategy:
    """How a strategy captures a model for LoRA batches. Subclass, set `name` and `description`,
    override the two methods, decorate with @register_strategy."""

    name: str = ""
    description: str = ""
    compacts: bool = False  # the batch is compacted to as many LoRA rows as the graph has

    def graph_keys(self, max_loras: int) -> list[int]:
        """LoRA rows of each graph captured per batch size (0: the base graph, no LoRA kernel)."""
        raise NotImplementedError

    def pick_rows(self, num_active: int, max_loras: int) -> int:
        """Which graph (its LoRA rows) a batch with `num_active` distinct adapters replays: a
        host-side count from the request list, never a device read."""
        raise NotImplementedError


_REGISTRY: dict[str, GraphStrategy] = {}
RENAMED = {"launch_always": "one_graph"}  # old strategy name -> new, for recordings made before


def register_strategy(cls: type[GraphStrategy]) -> type[GraphStrategy]:
    if not (isinstance(cls, type) and issubclass(cls, GraphStrategy) and cls.name):
        raise TypeError(f"register_strategy takes a GraphStrategy subclass with its own name, got {cls!r}")
    if cls.name in _REGISTRY and type(_REGISTRY[cls.name]) is not cls:
        raise ValueError(f"a graph strategy named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls()
    return cls


def buckets(max_loras: int) -> list[int]:
    """Active-adapter buckets of per_active_count: powers of two below max_loras, then max_loras."""
    out, b = [], 1
    while b < max_loras:
        out.append(b)
        b *= 2
    return out + [max_loras]


@register_strategy
class OneGraph(GraphStrategy):
    name = "one_graph"
    description = "one graph, LoRA kernels always inside; early exit on the GPU"

    def graph_keys(self, max_loras):
        return [max_loras]

    def pick_rows(self, num_active, max_loras):
        return max_loras


@register_strategy
class PerActiveCount(GraphStrategy):
    name = "per_active_count"
    description = "a graph per bucket of active adapters (0, 1, 2, 4, ...); grid sized by the bucket"
    compacts = True

    def graph_keys(self, max_loras):
        return [0] + buckets(max_loras)

    def pick_rows(self, num_active, max_loras):
        return 0 if num_active == 0 else next(b for b in buckets(max_loras) if b >= num_active)


@register_strategy
class LoRASplit(GraphStrategy):
    name = "lora_split"
    description = "a no-LoRA graph and a LoRA graph; chosen on the host"

    def graph_keys(self, max_loras):
        return [0, max_loras]

    def pick_rows(self, num_active, max_loras):
        return 0 if num_active == 0 else max_loras


def strategy_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


STRATEGIES = strategy_names()  # the registered ones at import: one_graph, per_active_count, lora_split
DESCRIPTIONS = {n: st.description for n, st in _REGISTRY.items()}


class NoGraphFits(ValueError):
    """A batch that no captured graph can replay (more requests than the largest graph, or
    requests of another length than the graphs were captured for)."""


def get_strategy(name: str) -> GraphStrategy:
    if name in _REGISTRY:
        return _REGISTRY[name]
    hint = f" (renamed {RENAMED[name]!r})" if name in RENAMED else ""
    raise ValueError(f"unknown graph strategy {name!r}{hint}; choose one of {', '.join(_REGISTRY)}")


def check_strategy(name: str) -> str:
    return get_strategy(name).name


def graph_keys(strategy: str, max_loras: int) -> list[int]:
    """LoRA rows of each graph a strategy captures per batch size (0: the base graph, no LoRA)."""
    return get_strategy(strategy).graph_keys(max_loras)


def pick_rows(strategy: str, num_active: int, max_loras: int) -> int:
    """Which graph a batch with `num_active` distinct adapters replays (a host-side count)."""
    return get_strategy(strategy).pick_rows(num_active, max_loras)


def pool_bytes(pool) -> dict:
    """Bytes the caching allocator holds in one graph pool (its segments, and what is allocated in
    them), from a memory snapshot: exact per pool, where before/after deltas of the global counters
    also see other pools grow or shrink. Empty when this torch's snapshot has no pool ids."""
    segs = [s for s in torch.cuda.memory_snapshot() if "segment_pool_id" in s]
    if not segs:
        return {}
    mine = [s for s in segs if tuple(s["segment_pool_id"]) == tuple(pool)]
    return dict(pool_segments=sum(s["total_size"] for s in mine), pool_allocated=sum(s["allocated_size"] for s in mine))


@dataclass
class Graph:
    """One captured (or, without graphs, eagerly run) forward: `size` requests, `rows` LoRA rows."""
    size: int
    rows: int
    x: torch.Tensor  # static input (size * tokens_per_request, hidden)
    tensors: LoRABatchTensors  # static batch metadata
    batch: LoRABatchInfo  # the geometry it was captured with (host lists)
    graph: object = None
    out: torch.Tensor | None = None
    capture_s: float = 0.0
    replays: int = 0


@dataclass
class GraphSet:
    """One strategy's graphs for one lab (MiniMoEModel or DecoderModel) at the given batch sizes."""
    lab: object
    strategy: str
    sizes: list[int]
    tokens_per_request: int = 1
    use_graphs: bool | None = None  # None: on a CUDA device
    fallback: str = "error"  # or "eager": run a batch no graph fits without a graph
    graphs: dict = field(default_factory=dict)  # (size, rows) -> Graph
    eager_fallbacks: int = 0
    memory: dict = field(default_factory=dict)  # bytes, from torch.cuda memory statistics
    capture_s: float = 0.0

    def __post_init__(self):
        check_strategy(self.strategy)
        if self.fallback not in ("error", "eager"):
            raise ValueError(f"fallback must be 'error' or 'eager', got {self.fallback!r}")
        if not self.sizes or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in self.sizes):
            raise ValueError(f"sizes must be a non-empty list of positive ints (requests per graph), "
                             f"got {self.sizes!r}")
        t = self.tokens_per_request
        if not isinstance(t, int) or isinstance(t, bool) or t <= 0:
            raise ValueError(f"tokens_per_request must be a positive int, got {t!r}")
        self.sizes = sorted(set(self.sizes))
        if self.use_graphs is None:
            self.use_graphs = self.lab.device.type == "cuda"
        S, lab = self.lab.pool.max_loras, self.lab
        for size in reversed(self.sizes):  # largest first, as engines capture
            M = size * t
            for rows in graph_keys(self.strategy, S):
                batch = self._batch([None] * size, [t] * size, rows)
                x = torch.zeros(M, lab.shape.hidden, dtype=lab.dtype, device=lab.device)
                tensors = LoRABatchTensors.from_batch(batch, lab.device)  # static buffers, this geometry
                self.graphs[(size, rows)] = Graph(size, rows, x, tensors, batch)

    # --- host side: which graph, which batch ----------------------------------------------------
    def _batch(self, adapters, counts, rows) -> LoRABatchInfo:
        pool = self.lab.pool
        if rows == 0:  # the base graph: no LoRA (no adapter can be in such a batch)
            return LoRABatchInfo.build(pool, [None] * len(adapters), counts)
        return LoRABatchInfo.build(pool, adapters, counts, rows=rows if get_strategy(self.strategy).compacts else None)

    def pick(self, adapters: list, token_counts: list[int]) -> tuple[Graph, list, list]:
        """(graph, padded adapters, padded token counts) for a batch: host lists only, no GPU."""
        t, R = self.tokens_per_request, len(adapters)
        if len(token_counts) != R:
            raise ValueError(f"{R} adapter entries but {len(token_counts)} token counts")
        if any(c != t for c in token_counts):
            raise NoGraphFits(f"these graphs hold requests of {t} token(s) each; got token counts "
                              f"{sorted(set(token_counts))}")
        fit = [s for s in self.sizes if s >= R]
        if not fit:
            raise NoGraphFits(f"a batch of {R} requests fits no captured graph (largest: {self.sizes[-1]} "
                              f"requests); capture a larger size or use fallback='eager'")
        size = fit[0]
        n_active = len({a for a, c in zip(adapters, token_counts) if a is not None and c > 0})
        for a in adapters:  # an unknown adapter is named here, before anything runs
            if a is not None:
                self.lab.pool.slot_of(a)
        rows = pick_rows(self.strategy, n_active, self.lab.pool.max_loras)
        pad = size - R
        return self.graphs[(size, rows)], list(adapters) + [None] * pad, list(token_counts) + [t] * pad

    # --- capture and run -----------------------------------------------------------------------
    def _forward(self, g: Graph):
        """Graph g's forward. A LoRA graph (rows > 0) runs under capture mode, where every guard
        launches the LoRA kernels; the base graph runs `cpu_flag` on a batch without adapters, so
        the host's decision (no LoRA kernel at all) is what gets recorded."""
        return lambda: self.lab.model(g.x, g.batch, g.tensors, guard="cpu_flag" if g.rows == 0 else "launch_always")

    def capture(self, warmup: int = 2) -> "GraphSet":
        """Capture every graph into ONE private memory pool; records capture time and memory."""
        if not self.use_graphs:
            raise RuntimeError("CUDA graphs need a CUDA GPU; this GraphSet runs eagerly (use_graphs=False)")
        runtime.synchronize()
        a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        t_all = time.perf_counter()
        for g in self.graphs.values():  # largest size first: smaller graphs reuse its pool blocks
            t0 = time.perf_counter()
            g.graph, g.out = capture(self._forward(g), warmup=warmup, pool=pool, launch_all=g.rows > 0)
            torch.cuda.synchronize()
            g.capture_s = time.perf_counter() - t0
        self.capture_s = time.perf_counter() - t_all
        self.memory = dict(allocated=torch.cuda.memory_allocated() - a0,
                           reserved=torch.cuda.memory_reserved() - r0, **pool_bytes(pool))
        return self

    def load(self, g: Graph, x: torch.Tensor, adapters: list, counts: list) -> None:
        """Write a batch into a graph's static buffers (in place, no host sync)."""
        batch = self._batch(adapters, counts, g.rows)
        LoRABatchTensors.from_batch(batch, self.lab.device, out=g.tensors)
        g.x[:x.shape[0]].copy_(x)

    def __call__(self, x: torch.Tensor, adapters: list, token_counts: list[int]) -> torch.Tensor:
        """The forward of a batch through its graph: (M, hidden) for the batch's own M tokens."""
        try:
            g, ad, counts = self.pick(adapters, token_counts)
        except NoGraphFits:
            if self.fallback != "eager":
                raise
            self.eager_fallbacks += 1
            batch = LoRABatchInfo.build(self.lab.pool, adapters, token_counts)
            return self.lab.model(x, batch, LoRABatchTensors.from_batch(batch, self.lab.device), guard="cpu_flag")
        if x.shape[0] != sum(token_counts):
            raise ValueError(f"x has {x.shape[0]} rows but the batch has {sum(token_counts)} tokens")
        if x.dtype != g.x.dtype or x.device.type != g.x.device.type:  # copy_ would convert silently
            raise TypeError(f"x is {x.dtype} on {x.device}; the graphs take {g.x.dtype} on {g.x.device}")
        self.load(g, x, ad, counts)
        g.replays += 1
        if self.use_graphs:
            if g.graph is None:
                raise RuntimeError("call capture() first (or use_graphs=False for eager runs)")
            g.graph.replay()
            return g.out[:x.shape[0]]
        return self.eager(g, x.shape[0])

    def eager(self, g: Graph, num_tokens: int) -> torch.Tensor:
        """What graph `g` computes, run eagerly on its current static buffers (same kernels, same
        shapes, same guard decision): the bit-for-bit reference of a replay."""
        with runtime.capture_mode(g.rows > 0):
            y = self._forward(g)()
        return y[:num_tokens]
