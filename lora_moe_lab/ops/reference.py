"""Float64 references for every op, written the plainest way: per (token, k) pair gathers.

Only for small shapes (they materialise per-pair weight copies); the `_grouped` ones loop over
experts on the inputs' device, for production shapes. Every kernel and backend is
tested against these on fresh random inputs.
"""
from __future__ import annotations

import torch

f64 = torch.float64


def _d(t):
    """Every reference computes on the CPU in float64, wherever its inputs live."""
    return t.detach().to("cpu", f64)


def _i(t):
    return t.detach().cpu().long()


def _rows(x, top_k, gather):
    x = _d(x)
    return x.repeat_interleave(top_k, 0) if gather else x  # (M*top_k, K)


def ref_router_logits(x, router_w, bias=None):
    """(M, E) float64 router logits x @ router_w.T (+ the skew bias)."""
    logits = _d(x) @ _d(router_w).T
    return logits if bias is None else logits + _d(bias)


def ref_router(x, router_w, top_k, bias=None):
    """(weights, ids): softmax over the experts, its top_k, renormalised (MoELayer.route in float64)."""
    probs = torch.softmax(ref_router_logits(x, router_w, bias), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def ref_moe_gemm(x, w, topk_ids, top_k, routed_weights=None, gather=True):
    xr = _rows(x, top_k, gather)
    W = _d(w)[_i(topk_ids).reshape(-1)]  # (pairs, N, K)
    y = torch.einsum("pk,pnk->pn", xr, W)
    if routed_weights is not None:
        y = y * _d(routed_weights).reshape(-1, 1)
    return y


def ref_lora_delta(x, lora_a, lora_b, topk_ids, token_slot, lora_ids, adapter_enabled, top_k,
                   routed_weights=None, gather=True):
    """(M*top_k, P*N) delta: zero for pairs whose token has no LoRA row (-1), or whose row holds no
    adapter (lora_ids -1) or a disabled one. token_slot holds LoRA rows; lora_ids[row] is the
    weight slot (the pool's batches: row = slot)."""
    P, S, E, r, K = lora_a.shape
    xr = _rows(x, top_k, gather)
    row = _i(token_slot).repeat_interleave(top_k)
    e = _i(topk_ids).reshape(-1)
    rw_ = row.clamp(min=0)
    live = (row >= 0) & (_i(lora_ids)[rw_] >= 0) & (_i(adapter_enabled)[rw_] != 0)
    s = _i(lora_ids)[rw_].clamp(min=0)
    outs = []
    for p in range(P):
        a = _d(lora_a[p])[s, e]  # (pairs, r, K)
        b = _d(lora_b[p])[s, e]  # (pairs, N, r)
        d = torch.einsum("pnr,pr->pn", b, torch.einsum("prk,pk->pr", a, xr))
        outs.append(d)
    d = torch.cat(outs, dim=1) * live[:, None].to(f64)
    if routed_weights is not None:
        d = d * _d(routed_weights).reshape(-1, 1)
    return d


def ref_silu_mul(inter):
    I = inter.shape[-1] // 2
    g, u = _d(inter[..., :I]), _d(inter[..., I:])
    return g * torch.sigmoid(g) * u


def ref_moe_sum(y, top_k, residual=None):
    """(M, K): each token's top_k rows of y (M*top_k, K) summed (+ residual (M, K))."""
    s = _d(y).view(-1, top_k, y.shape[-1]).sum(1)
    return s if residual is None else s + _d(residual)


def ref_rmsnorm(x, weight, eps=1e-6):
    x = _d(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _d(weight)


def ref_moe_layer(x, layer, lora=None, topk_ids=None):
    """One MoE block in float64. `layer` has router_w, w13, w2; `lora` is None or a dict with
    weights (LayerLoRAWeights), token_slot, lora_ids, adapter_enabled. `topk_ids` pins the expert
    choice (near-ties may pick differently in float64 than in the model's fp32 router); the routed
    weights are still computed here in float64."""
    k = layer.top_k
    bias = getattr(layer, "router_bias", None)
    tw, ids = ref_router(x, layer.router_w, k, bias)
    if topk_ids is not None:
        probs = torch.softmax(ref_router_logits(x, layer.router_w, bias), dim=-1)
        ids = _i(topk_ids)
        tw = probs.gather(1, ids)
        tw = tw / tw.sum(-1, keepdim=True)
    inter = ref_moe_gemm(x, layer.w13, ids, k)
    if lora is not None:
        w = lora["weights"]
        inter = inter + ref_lora_delta(x, w.gate_up_a, w.gate_up_b, ids, lora["token_slot"], lora["lora_ids"],
                                       lora["adapter_enabled"], k)
    act = ref_silu_mul(inter)
    out = ref_moe_gemm(act, layer.w2, ids, k, routed_weights=tw, gather=False)
    if lora is not None:
        out = out + ref_lora_delta(act, w.down_a[None], w.down_b[None], ids, lora["token_slot"],
                                   lora["lora_ids"], lora["adapter_enabled"], k, routed_weights=tw, gather=False)
    return ref_moe_sum(out, k)


def ref_model(x, model, lora_by_layer=None, routing=None):
    """The mini model in float64; `routing` is the model's per-layer (weights, ids) log, if pinned."""
    h = _d(x)
    for i, layer in enumerate(model.layers):
        lora = None if lora_by_layer is None else lora_by_layer[i]
        ids = None if routing is None else routing[i][1]
        h = h + ref_moe_layer(ref_rmsnorm(h, layer.norm_w, layer.eps), layer, lora, ids)
    return h


def ref_rope(x, pos, theta):
    """x (M, heads, D) rotated by position, rotate-half convention, all in float64."""
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=f64) / D)
    ang = pos.to(f64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def ref_attention(x, attn, token_counts):
    """Qwen3 attention of already-normed x (M, hidden) in float64, each request its own causal
    sequence: explicit softmax with a causal mask, KV heads repeated for their query-head group.
    `attn` has qkv_w, o_w, q_norm_w, k_norm_w, H, KV, D, eps, theta."""
    H, KV, D = attn.H, attn.KV, attn.D
    x = _d(x)
    M = x.shape[0]
    q, k, v = (x @ _d(attn.qkv_w).T).split([H * D, KV * D, KV * D], -1)
    q = ref_rmsnorm(q.reshape(M, H, D), attn.q_norm_w, attn.eps)
    k = ref_rmsnorm(k.reshape(M, KV, D), attn.k_norm_w, attn.eps)
    pos = torch.cat([torch.arange(c) for c in token_counts])
    q, k = ref_rope(q, pos, attn.theta), ref_rope(k, pos, attn.theta)
    k, v = k.repeat_interleave(H // KV, 1), v.reshape(M, KV, D).repeat_interleave(H // KV, 1)
    out = torch.zeros(M, H, D, dtype=f64)
    start = 0
    for c in token_counts:
        s = slice(start, start + c)
        scores = torch.einsum("qhd,khd->hqk", q[s], k[s]) / D ** 0.5
        scores = scores.masked_fill(torch.ones(c, c, dtype=torch.bool).triu(1), float("-inf"))
        out[s] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v[s])
        start += c
    return out.reshape(M, H * D) @ _d(attn.o_w).T


def ref_decoder_layer(x, layer, token_counts, lora=None, topk_ids=None):
    """One decoder layer in float64: pre-norm attention + residual, pre-norm MoE + residual.
    `layer` has norm_w, eps, attn and moe (see ref_moe_layer for `lora` and `topk_ids`)."""
    h = _d(x)
    h = h + ref_attention(ref_rmsnorm(h, layer.norm_w, layer.eps), layer.attn, token_counts)
    return h + ref_moe_layer(ref_rmsnorm(h, layer.moe.norm_w, layer.eps), layer.moe, lora, topk_ids)


def exit_codes(align, lora_ids, adapter_enabled) -> torch.Tensor:
    """The fused LoRA kernel's early-exit rule on the host side, as an (L, EM // BM) int32 tensor
    on the inputs' device (sync-free): 0 ran, 1 lora_id -1, 2 disabled, 3 past
    num_tokens_post_padded, 4 expert -1 (names: kernels/exits.py). The first
    rule that applies wins, in that order, as in the kernel."""
    ei, ntpp, bm = align.expert_ids, align.num_tokens_post_padded, align.block_m
    S, nb = ei.shape
    start = torch.arange(nb, device=ei.device)[None, :] * bm
    code = torch.zeros(S, nb, dtype=torch.int32, device=ei.device)
    for c, hit in ((4, ei < 0), (3, start >= ntpp[:, None]), (2, (adapter_enabled == 0)[:, None].expand(S, nb)),
                   (1, (lora_ids < 0)[:, None].expand(S, nb))):
        code = torch.where(hit, torch.full_like(code, c), code)
    return code


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error ||a - b|| / ||b|| in float64 (the one measure of every check)."""
    a, b = a.double(), b.double().to(a.device)
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def ref_moe_gemm_grouped(x, w, topk_ids, top_k, routed_weights=None, gather=True):
    """ref_moe_gemm for production shapes: one float64 GEMM per expert on the inputs' device (no
    per-pair weight copies). (M*top_k, N)."""
    E, N, _ = w.shape
    e = topk_ids.flatten().long()
    order = torch.argsort(e, stable=True)
    counts = torch.bincount(e, minlength=E).tolist()  # a host sync: fine, this is the reference
    out = torch.empty(e.numel(), N, dtype=f64, device=x.device)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            p = order[start:start + c]
            out[p] = x[p // top_k if gather else p].double() @ w[ex].double().T
            start += c
    if routed_weights is not None:
        out *= routed_weights.reshape(-1, 1).double()
    return out


def ref_lora_delta_grouped(x, lora_a, lora_b, topk_ids, token_slot, lora_ids, adapter_enabled, top_k,
                           routed_weights=None, gather=True):
    """ref_lora_delta for production shapes: one float64 shrink and expand per (slot, expert) group on
    the inputs' device. Returns ((M*top_k, P*N) delta, (M*top_k,) bool live pairs)."""
    P, S, E, _, _ = lora_a.shape
    N = lora_b.shape[3]
    e = topk_ids.flatten().long()
    slot = token_slot.long().repeat_interleave(top_k)
    sc = slot.clamp(min=0)
    live = (slot >= 0) & (lora_ids.long()[sc] >= 0) & (adapter_enabled.long()[sc] != 0)
    key = torch.where(live, sc * E + e, torch.full_like(e, S * E))
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=S * E + 1).tolist()
    out = torch.zeros(e.numel(), P * N, dtype=f64, device=x.device)
    start = 0
    for kk, c in enumerate(counts[:-1]):
        if c:
            p = order[start:start + c]
            s, ex = divmod(kk, E)
            xr = x[p // top_k if gather else p].double()
            for q in range(P):
                out[p, q * N:(q + 1) * N] = (xr @ lora_a[q, s, ex].double().T) @ lora_b[q, s, ex].double().T
            start += c
    if routed_weights is not None:
        out *= routed_weights.reshape(-1, 1).double()
    return out, live


def tolerance(dtype: torch.dtype, device) -> float:
    """Relative Frobenius error allowed against the float64 reference: fp32 exact paths (CPU, the
    interpreter) < 1e-5; fp32 on a GPU (tf32 dots) < 5e-3; fp16/bf16 < 2e-2."""
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-2
    return 5e-3 if torch.device(device).type == "cuda" else 1e-5
