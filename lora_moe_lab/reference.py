"""Float64 references for every op, written the plainest way: per (token, k) pair gathers.

Only for small shapes (they materialise per-pair weight copies). Every kernel and backend is
tested against these on fresh random inputs.
"""
from __future__ import annotations

import torch

f64 = torch.float64


def _rows(x, top_k, gather):
    x = x.to(f64)
    return x.repeat_interleave(top_k, 0) if gather else x  # (M*top_k, K)


def ref_router(x, router_w, top_k):
    probs = torch.softmax(x.to(f64) @ router_w.to(f64).T, dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def ref_moe_gemm(x, w, topk_ids, top_k, routed_weights=None, gather=True):
    xr = _rows(x, top_k, gather)
    W = w.to(f64)[topk_ids.reshape(-1).long()]  # (pairs, N, K)
    y = torch.einsum("pk,pnk->pn", xr, W)
    if routed_weights is not None:
        y = y * routed_weights.reshape(-1, 1).to(f64)
    return y


def ref_lora_delta(x, lora_a, lora_b, topk_ids, token_slot, lora_ids, adapter_enabled, top_k,
                   routed_weights=None, gather=True):
    """(M*top_k, P*N) delta: zero for pairs whose token has no slot, an empty or disabled slot."""
    P, S, E, r, K = lora_a.shape
    N = lora_b.shape[3]
    xr = _rows(x, top_k, gather)
    slot = token_slot.long().repeat_interleave(top_k)
    e = topk_ids.reshape(-1).long()
    s = slot.clamp(min=0)
    live = (slot >= 0) & (lora_ids.long()[s] >= 0) & (adapter_enabled.long()[s] != 0)
    outs = []
    for p in range(P):
        a = lora_a[p].to(f64)[s, e]  # (pairs, r, K)
        b = lora_b[p].to(f64)[s, e]  # (pairs, N, r)
        d = torch.einsum("pnr,pr->pn", b, torch.einsum("prk,pk->pr", a, xr))
        outs.append(d)
    d = torch.cat(outs, dim=1) * live[:, None].to(f64)
    if routed_weights is not None:
        d = d * routed_weights.reshape(-1, 1).to(f64)
    return d


def ref_silu_mul(inter):
    I = inter.shape[-1] // 2
    g, u = inter[..., :I].to(f64), inter[..., I:].to(f64)
    return g * torch.sigmoid(g) * u


def ref_rmsnorm(x, weight, eps=1e-6):
    x = x.to(f64)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(f64)


def ref_moe_layer(x, layer, lora=None, topk_ids=None):
    """One MoE block in float64. `layer` has router_w, w13, w2; `lora` is None or a dict with
    weights (LayerLoRAWeights), token_slot, lora_ids, adapter_enabled. `topk_ids` pins the expert
    choice (near-ties may pick differently in float64 than in the model's fp32 router); the routed
    weights are still computed here in float64."""
    M = x.shape[0]
    k = layer.top_k
    tw, ids = ref_router(x, layer.router_w, k)
    if topk_ids is not None:
        probs = torch.softmax(x.to(f64) @ layer.router_w.to(f64).T, dim=-1)
        ids = topk_ids.long()
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
    return out.view(M, k, -1).sum(1)


def ref_model(x, model, lora_by_layer=None, routing=None):
    """The mini model in float64; `routing` is the model's per-layer (weights, ids) log, if pinned."""
    h = x.to(f64)
    for i, layer in enumerate(model.layers):
        lora = None if lora_by_layer is None else lora_by_layer[i]
        ids = None if routing is None else routing[i][1]
        h = h + ref_moe_layer(ref_rmsnorm(h, layer.norm_w, layer.eps), layer, lora, ids)
    return h
