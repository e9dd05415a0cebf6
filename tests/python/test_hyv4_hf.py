"""Hunyuan HY V4 (ref/hyv4/) against transformers' own hy_v4 modules, in f32 on the CPU.

Indexer: `HYV4Indexer` is driven with our tensors through identity projections: with hidden = [k | w]
and q_resid = q, wk(hidden) = k, weights_proj(hidden) = w and wq_b(q_resid) = q exactly (one nonzero
product per output). Its `k_norm` LayerNorm keeps our random weight and bias; the position embeddings
come from `HYV4RotaryEmbedding`. The final index scores are captured at their `.topk` call and the
roped q / k at `apply_rotary_pos_emb_interleave` (which writes the rotated pairs de-interleaved: we
permute ours the same way to compare). Tolerances, f32 against double-then-f32:
  k_norm, roped q / k          2e-6 absolute (values of order 1; torch's f32 LayerNorm and cos / sin
                               may each be a few ulps off the correctly rounded result)
  scores                       2e-6 relative to max(1, |I|): D = 32 f32 products per head summed by
                               torch in f32 (about 32 * 2^-24 * |q||k| ~ 1e-6 at worst), then H = 4
                               weighted terms; ref sums in double and rounds once
  index lists                  equal as sets per row, where a pick of a masked (-inf) key is -1; ReLU
                               makes exact ties at 0 possible, so a row may differ only by keys tied
                               with its lowest selected score
Attention: a tiny random `HYV4Attention` runs on random hidden states; a wrapper around transformers'
eager attention rounds query / key / value to bf16 (as a kernel reading bf16 would) and records them.
transformers expands MLA to per-head keys and values; we run each head h through our gated attention
with q' = [0 (v dims) | q_h] and kv' = [v_h | k_h] (V = kv's first v dims, and q'.kv' = q_h.k_h
exactly), HF's own indices, its sink and its gate: the gated output (o_proj's input) within 2e-6.
Planted mistakes, each of which must fail: the indexer's RoPE on the leading dims, and the sink
multiplied by the softmax scale. Last, the schedule: transformers' default indexer_types is our hy-v4
preset, and its whole tiny model (it runs, Shared layers included) reuses the last Full layer's top-k."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
M = pytest.importorskip("transformers.models.hy_v4.modeling_hy_v4")
from transformers import HYV4Config  # noqa: E402

from indexshare._core_loader import core  # noqa: E402

H, D, ROPE, TOPK, S = 4, 32, 16, 8, 24


def config(hidden, q_lora, layers=2):
    cfg = HYV4Config(vocab_size=32, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2, q_lora_rank=q_lora,
                     kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=ROPE, v_head_dim=16, index_n_heads=H,
                     index_head_dim=D, index_topk=TOPK, intermediate_size=16, moe_intermediate_size=8,
                     n_routed_experts=4, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "eager"
    return cfg


def causal(n):
    t = torch.arange(n)
    return torch.zeros(1, 1, n, n).masked_fill(t[None, :] > t[:, None], float("-inf"))


def np32(x):
    return np.ascontiguousarray(x.detach().cpu().numpy().astype(np.float32))


def deinterleave(x):
    """Our roped rows keep the rope pairs in place; transformers writes [even' | odd'] for the slice."""
    y = x.copy()
    rot = x[..., D - ROPE:]
    y[..., D - ROPE:] = np.concatenate([rot[..., 0::2], rot[..., 1::2]], axis=-1)
    return y


def run_hf_indexer(seed=0):
    cfg = config(D + H, H * D)
    g = torch.Generator().manual_seed(seed)
    ix = M.HYV4Indexer(cfg, 0).float().eval()
    with torch.no_grad():
        eye = torch.eye(D + H)
        ix.wk.weight.copy_(eye[:D])
        ix.weights_proj.weight.copy_(eye[D:])
        ix.wq_b.weight.copy_(torch.eye(H * D))
        ix.k_norm.weight.copy_(1 + 0.1 * torch.randn(D, generator=g))
        ix.k_norm.bias.copy_(0.1 * torch.randn(D, generator=g))
    bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).float()  # noqa: E731
    t = dict(q=bf(S, H, D), k=bf(S, D), w=torch.randn(S, H, generator=g))
    hidden = torch.cat([t["k"], t["w"]], dim=-1)[None]
    pos = torch.arange(S)[None]
    pe = M.HYV4RotaryEmbedding(cfg)(hidden, position_ids=pos)
    cap = {}
    ix.k_norm.register_forward_hook(lambda _m, _i, out: cap.__setitem__("k_norm", out.detach().clone()))
    rope_fn, topk_fn = M.apply_rotary_pos_emb_interleave, torch.Tensor.topk

    def rope(q, k, cos, sin, *a, **kw):
        qe, ke = rope_fn(q, k, cos, sin, *a, **kw)
        cap["q_rot"], cap["k_rot"] = qe.detach().clone(), ke.detach().clone()
        return qe, ke

    def topk(self, *a, **kw):
        cap["scores"] = self.detach().clone()
        return topk_fn(self, *a, **kw)

    M.apply_rotary_pos_emb_interleave, torch.Tensor.topk = rope, topk
    try:
        with torch.no_grad():
            cap["indices"] = ix(hidden, t["q"].reshape(1, S, H * D), pe, causal(S)[:, 0], pos)
    finally:
        M.apply_rotary_pos_emb_interleave, torch.Tensor.topk = rope_fn, topk_fn
    return ix, t, cap


def ours_indexer(ix, t, slice_="trailing"):
    c = core()
    return c.hyv4_indexer(np32(t["q"]), np32(t["k"]), np32(ix.k_norm.weight), np32(ix.k_norm.bias), np32(t["w"]),
                          TOPK, ROPE, 10000.0, slice_, 1e-5, c.Impl.ref)


def same_sets(ours, hf_idx, hf_scores):
    """Rows equal as sets (HF's picks of -inf keys are -1), except keys tied with the lowest selected score."""
    tie_rows = 0
    for t in range(S):
        mine = {int(i) for i in ours[t] if i >= 0}
        theirs = {int(i) for i in hf_idx[t] if np.isfinite(hf_scores[t, i])}
        if mine != theirs:
            low = min(hf_scores[t, i] for i in theirs)
            assert all(hf_scores[t, i] == low for i in mine ^ theirs), t
            tie_rows += 1
    return tie_rows


def test_indexer_matches_hf():
    ix, t, cap = run_hf_indexer()
    o = ours_indexer(ix, t)
    assert np.abs(o["k_norm"] - np32(cap["k_norm"][0])).max() < 2e-6
    q_hf = np.concatenate([np32(t["q"])[..., :D - ROPE], np32(cap["q_rot"][0])], axis=-1)
    k_hf = np.concatenate([o["k_norm"][..., :D - ROPE], np32(cap["k_rot"][0, :, 0])], axis=-1)
    assert np.abs(deinterleave(o["q_rope"]) - q_hf).max() < 2e-6
    assert np.abs(deinterleave(o["k_rope"]) - k_hf).max() < 2e-6
    hf = np32(cap["scores"][0])
    valid = np.isfinite(hf)
    assert (np.isfinite(o["scores"]) == valid).all()
    rel = np.abs(o["scores"][valid] - hf[valid]) / np.maximum(1, np.abs(hf[valid]))
    assert rel.max() < 2e-6, rel.max()
    assert same_sets(o["indices"], cap["indices"][0].numpy(), hf) <= 2
    # Planted mistake: RoPE on the leading dims (DeepSeek-V3.2's slice) is far off.
    wrong = ours_indexer(ix, t, "leading")["scores"]
    assert (np.abs(wrong[valid] - hf[valid]) / np.maximum(1, np.abs(hf[valid]))).max() > 1e-3


def run_hf_attention(seed=1):
    cfg = config(64, 32)
    g = torch.Generator().manual_seed(seed)
    attn = M.HYV4Attention(cfg, 0).float().eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name.endswith("sinks"):
                p.copy_(2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    cap = {}
    attn.gate_proj.register_forward_hook(lambda _m, _i, out: cap.__setitem__("gate", out.detach().clone()))
    attn.indexer.register_forward_hook(lambda _m, _i, out: cap.__setitem__("indices", out.detach().clone()))
    attn.o_proj.register_forward_pre_hook(lambda _m, inp: cap.__setitem__("gated", inp[0].detach().clone()))
    original = M.eager_attention_forward

    def bf16_attention(module, query, key, value, attention_mask, scaling, **kw):
        q, k, v = (x.to(torch.bfloat16).float() for x in (query, key, value))
        cap["q"], cap["k"], cap["v"], cap["scaling"] = q, k, v, scaling
        return original(module, q, k, v, attention_mask, scaling, **kw)

    hidden = torch.randn(1, S, 64, generator=g)
    pos = torch.arange(S)[None]
    pe = M.HYV4RotaryEmbedding(cfg)(hidden, position_ids=pos)
    M.eager_attention_forward = bf16_attention
    try:
        with torch.no_grad():
            attn(hidden, pe, causal(S), position_ids=pos)
    finally:
        M.eager_attention_forward = original
    cap["sinks"] = np32(attn.sinks)
    return cfg, cap


def ours_gated(cfg, cap, sink_scale=1.0):
    c = core()
    to16 = lambda a: np.ascontiguousarray(a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    idx = cap["indices"][0].numpy().astype(np.int32)
    idx = np.where(idx <= np.arange(S)[:, None], idx, -1).astype(np.int32)  # picks of masked keys: -1
    vd = cfg.v_head_dim
    gate = np32(cap["gate"][0]).reshape(S, -1, vd)
    outs = []
    for h in range(cfg.num_attention_heads):
        q, k, v = (np32(cap[n][0, h]) for n in ("q", "k", "v"))  # bf16 values: the upper halves are exact
        q2 = np.concatenate([np.zeros((S, vd), np.float32), q], axis=-1)[:, None]
        kv2 = np.concatenate([v, k], axis=-1)[:, None]
        sink = np.float32([cap["sinks"][h] * sink_scale])
        o = c.hyv4_attention(to16(q2), to16(kv2), idx, sink, cap["scaling"], vd, None,
                             np.ascontiguousarray(gate[:, h:h + 1]), c.Impl.ref)
        outs.append(o["gated"][:, 0])
    return np.stack(outs, axis=1)


def test_gated_attention_with_sink_matches_hf():
    cfg, cap = run_hf_attention()
    hf = np32(cap["gated"][0]).reshape(S, cfg.num_attention_heads, cfg.v_head_dim)
    err = np.abs(ours_gated(cfg, cap) - hf).max()
    assert err < 2e-6, err
    # Planted mistake: the sink multiplied by the softmax scale, like a q.k logit.
    assert np.abs(ours_gated(cfg, cap, cap["scaling"]) - hf).max() > 1e-3


def test_generated_layer_binding_is_consistent():
    c = core()
    d = c.hyv4_layer(12, 20, index_topk=6)
    again = c.hyv4_indexer(d["q"], d["k"], d["k_norm_w"], d["k_norm_b"], d["weights_raw"], 6, 16)
    assert (again["indices"] == d["indices"]).all()
    assert d["gated"].shape == (12, 2, 32) and d["indices"].shape == (12, 6)
    simd = c.hyv4_layer(12, 20, index_topk=6, impl=c.Impl.simd)
    assert (simd["gated"].view(np.uint32) == d["gated"].view(np.uint32)).all()


def test_schedule_and_sharing_match_hf():
    """transformers' default indexer_types is our hy-v4 preset, and its whole model (which runs, Shared
    layers included) hands a Shared layer the last Full layer's top-k, as run_stack does."""
    c = core()
    for n in (6, 34):
        hf = HYV4Config(num_hidden_layers=n).indexer_types
        ours = c.problem_fields(f"sq4 skv4 hq1 dqk16 dv8 ih1 id16 k2 nl{n} sched=hy-v4")["schedule"]
        assert ours == "".join("F" if t == "full" else "S" for t in hf)
    cfg = config(64, 32, layers=6)
    torch.manual_seed(0)
    model = M.HYV4Model(cfg).float().eval()
    got = {}
    for i, layer in enumerate(model.layers):
        layer.self_attn.register_forward_hook(lambda _m, _i, out, i=i: got.__setitem__(i, out[2].clone()))
    with torch.no_grad():
        model(torch.randint(3, 32, (1, S)))
    source = 0
    for i, kind in enumerate(cfg.indexer_types):
        source = i if kind == "full" else source
        assert torch.equal(got[i], got[source]), i
    assert not torch.equal(got[0], got[1])
