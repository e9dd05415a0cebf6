"""Cross-check of ref/v4 (DeepSeek-V4 compressed sparse attention) against transformers' deepseek_v4
modules: a tiny random DeepseekV4Attention per layer type (sliding, C4A, HCA) runs in float32 on the
CPU, hooks capture the kernel-level tensors it computes (the compressor's and the indexer's kv / gate
projections, the indexer's roped q and head weights, the attention's q and kv, its output after the
inverse RoPE), and our functions (indexshare._core.v4_*) recompute from those same tensors:

  compressor entries (C4A overlap, HCA, indexer)   f32 tolerance: 2e-6 absolute (values of order 1)
  indexer scores I on the causally valid blocks     2e-6 relative to max(1, |I|); -inf elsewhere
  selected blocks                                   equal as sets per row (no near ties here)
  attention output (after the inverse RoPE)         2e-6 absolute

The attention is fed bf16 inputs on both sides: a wrapper around transformers' eager attention rounds
q and kv (window tokens and compressed entries) to bf16 before its f32 softmax, as a kernel reading
bf16 would; our attention reads the same bf16 q, kv and entries and transformers' own blocks. The HF
indexer has no Hadamard rotation: we use rotation "hf". In an f32 model transformers' cast of the
compressor weights to the kv dtype is a no-op, so it computes our f32 variant (ref/v4/compressor.h).
"""
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
M = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
from transformers import DeepseekV4Config  # noqa: E402

from indexshare._core_loader import core  # noqa: E402

T, W, H, D, ROPE = 64, 8, 2, 64, 16
TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


def make_config():
    cfg = DeepseekV4Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=3, num_attention_heads=H, head_dim=D, q_lora_rank=32,
        partial_rotary_factor=ROPE / D, sliding_window=W, o_groups=1, o_lora_rank=16, index_n_heads=4,
        index_head_dim=32, index_topk=4, layer_types=TYPES,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32,
                         "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=512, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        mlp_layer_types=["moe"] * 3)
    cfg._attn_implementation = "eager"
    return cfg


MAIN_ROPE = (ROPE, 10000.0, False, 1.0, 4096, 32.0, 1.0)
COMPRESS_ROPE = (ROPE, 160000.0, True, 16.0, 32, 32.0, 1.0)


def init_(module, gen):
    """Random parameters (the module allocates them with torch.empty)."""
    for name, p in module.named_parameters():
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.25 * (torch.rand(p.shape, generator=gen) * 2 - 1))
            elif "position_bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def run_hf(layer_idx, seed=0):
    """Runs one DeepseekV4Attention and returns the tensors it computed, captured by hooks."""
    cfg = make_config()
    gen = torch.Generator().manual_seed(seed)
    attn = M.DeepseekV4Attention(cfg, layer_idx).float().eval()
    init_(attn, gen)
    cap = {}

    def out_hook(key):
        def f(_m, _inp, out):
            cap[key] = out.detach().clone()
        return f

    comp = attn.compressor
    if comp is not None:
        comp.kv_proj.register_forward_hook(out_hook("comp_kv"))
        comp.gate_proj.register_forward_hook(out_hook("comp_gate"))
        comp.register_forward_hook(lambda _m, _i, out: cap.__setitem__("entries", out[0].detach().clone()))
        if hasattr(comp, "indexer"):
            ix = comp.indexer
            ix.kv_proj.register_forward_hook(out_hook("idx_kv"))
            ix.gate_proj.register_forward_hook(out_hook("idx_gate"))
            ix.scorer.weights_proj.register_forward_hook(out_hook("idx_w_raw"))
            ix.register_forward_hook(out_hook("blocks"))

            def scorer_hook(_m, inp, out):
                cap["idx_q"], cap["idx_k"], cap["scores"] = inp[0].detach().clone(), inp[1].detach().clone(), out.detach()
            ix.scorer.register_forward_hook(scorer_hook)
    attn.o_a_proj.register_forward_pre_hook(lambda _m, inp: cap.__setitem__("out", inp[0].detach().clone()))

    original = M.eager_attention_forward

    def bf16_attention(module, query, key, value, attention_mask, scaling, **kw):
        q16, kv16 = bf16(query), bf16(key)  # K = V: one tensor
        cap["q"], cap["kv_full"] = q16.clone(), kv16.clone()
        return original(module, q16, kv16, kv16, attention_mask, scaling, **kw)

    hidden = torch.randn(1, T, cfg.hidden_size, generator=gen)
    pos = torch.arange(T).unsqueeze(0)
    rot = M.DeepseekV4RotaryEmbedding(cfg)
    pe = {k: rot(hidden, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    t = torch.arange(T)
    visible = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)
    mask = torch.zeros(1, 1, T, T).masked_fill(~visible, float("-inf"))
    M.eager_attention_forward = bf16_attention
    try:
        with torch.no_grad():
            attn(hidden, pe, pos, mask)
    finally:
        M.eager_attention_forward = original
    cap["sinks"] = attn.sinks.detach().clone()
    cap["module"] = attn
    return cap


def np32(x):
    return np.ascontiguousarray(x.detach().cpu().numpy().astype(np.float32))


def compress(cap, prefix, module, overlap, ratio, rope=COMPRESS_ROPE):
    c = core()
    return c.v4_compress(np32(cap[prefix + "_kv"][0]), np32(cap[prefix + "_gate"][0]), np32(module.position_bias),
                         np32(module.kv_norm.weight), ratio, overlap, 1e-6, rope, "f32", c.Impl.ref)


def attend(cap, type_, blocks, rope):
    c = core()
    q = np32(cap["q"][0].transpose(0, 1))            # [T, H, D]
    kv_full = np32(cap["kv_full"][0, 0])              # [T + n_c, D]
    to16 = lambda a: np.ascontiguousarray(a.astype(ml_dtypes.bfloat16).view(np.uint16))  # noqa: E731
    entries = np.ascontiguousarray(kv_full[T:]) if type_ != "S" else np.zeros((0, D), np.float32)
    out = c.v4_attend(to16(q), to16(kv_full[:T]), np32(cap["sinks"]), entries, blocks, type_, W, 8, rope, c.Impl.ref)
    return out


def hf_out(cap):
    return np32(cap["out"][0].reshape(T, H, D))


@pytest.mark.parametrize("layer_idx, type_", [(1, "C"), (2, "H")])
def test_compressor_entries_match_hf(layer_idx, type_):
    cap = run_hf(layer_idx)
    comp = cap["module"].compressor
    ratio, overlap = (4, True) if type_ == "C" else (8, False)
    ours = compress(cap, "comp", comp, overlap, ratio)
    hf = np32(cap["entries"][0, 0])
    assert ours.shape == hf.shape == (T // ratio, D)
    err = np.abs(ours - hf).max()
    assert err < 2e-6, err
    # Fault: the main RoPE instead of the compress RoPE is far off (the check can fail).
    assert np.abs(compress(cap, "comp", comp, overlap, ratio, MAIN_ROPE) - hf).max() > 1e-2


def test_indexer_scores_and_blocks_match_hf():
    cap = run_hf(1)
    c = core()
    ix = cap["module"].compressor.indexer
    k_ours = compress(cap, "idx", ix, True, 4)
    k_hf = np32(cap["idx_k"][0])
    assert np.abs(k_ours - k_hf).max() < 2e-6
    weights = np32(cap["idx_w_raw"][0]) * np.float32(4 ** -0.5)
    q = np32(cap["idx_q"][0])                                # [T, H_I, D_I] after the compress RoPE
    ours = c.v4_index_scores(q, k_hf, weights, 4, "hf", c.Impl.ref)
    hf = np32(cap["scores"][0])
    valid = np.arange(T // 4)[None, :] < ((np.arange(T) + 1) // 4)[:, None]
    assert np.isneginf(ours[~valid]).all()
    rel = np.abs(ours[valid] - hf[valid]) / np.maximum(1, np.abs(hf[valid]))
    assert rel.max() < 2e-6, rel.max()
    # The Hadamard rotation (Megatron) of both q and k is orthogonal: without quantization it changes
    # the scores by rounding only (it matters when q and k are then quantized to FP8).
    rot = c.v4_index_scores(q, k_hf, weights, 4, "megatron", c.Impl.ref)
    assert (np.abs(rot[valid] - hf[valid]) / np.maximum(1, np.abs(hf[valid]))).max() < 4e-6
    # Fault: the head weights without H^-0.5 (the check can fail).
    wrong = c.v4_index_scores(q, k_hf, weights * np.float32(2), 4, "hf", c.Impl.ref)
    assert np.abs(wrong[valid] - hf[valid]).max() > 1e-3
    blocks = c.v4_select_blocks(ours, 4, 4, c.Impl.ref)
    hf_blocks = cap["blocks"][0].numpy()
    assert blocks.shape == hf_blocks.shape == (T, 4)
    for t in range(T):
        assert sorted(blocks[t]) == sorted(hf_blocks[t]), t


@pytest.mark.parametrize("layer_idx, type_", [(0, "S"), (1, "C"), (2, "H")])
def test_attention_output_matches_hf(layer_idx, type_):
    cap = run_hf(layer_idx)
    blocks = np.ascontiguousarray(cap["blocks"][0].numpy().astype(np.int32)) if type_ == "C" else None
    rope = MAIN_ROPE if type_ == "S" else COMPRESS_ROPE
    out, out_bf16, max_logits, lse, indices = attend(cap, type_, blocks, rope)
    hf = hf_out(cap)
    err = np.abs(out - hf).max()
    assert err < 2e-6, err
    assert (out_bf16 == out.astype(ml_dtypes.bfloat16).view(np.uint16)).all()
    assert np.isfinite(lse).all() and np.isfinite(max_logits).all()
    assert indices.shape[:2] == (T, 1)
    # Fault: the inverse RoPE of the other RoPE type changes the trailing dims.
    other = COMPRESS_ROPE if type_ == "S" else MAIN_ROPE
    assert np.abs(attend(cap, type_, blocks, other)[0] - hf).max() > 1e-3


def bf16_ulps(a, b):
    """|a - b| in units of the bf16 spacing at max(|a|, |b|) (both bf16 values held in f32)."""
    mag = np.maximum(np.abs(a), np.abs(b))
    exp = np.floor(np.log2(np.maximum(mag, np.finfo(np.float32).tiny)))
    return np.abs(a - b) / np.exp2(exp - 7)


def run_bf16_compressor(kind, seed=1):
    """transformers' compressor with bf16 projections (a bf16 model; the position bias and the norm
    weight stay f32 as transformers declares them): kv / gate captured, entries returned."""
    cfg = make_config()
    gen = torch.Generator().manual_seed(seed)
    comp = (M.DeepseekV4CSACompressor if kind == "C" else M.DeepseekV4HCACompressor)(cfg).float()
    init_(comp, gen)
    for mod in comp.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.to(torch.bfloat16)
    cap = {}
    for name, mod in (("comp", comp), ("idx", getattr(comp, "indexer", None))):
        if mod is None:
            continue
        mod.kv_proj.register_forward_hook(lambda _m, _i, o, n=name: cap.__setitem__(n + "_kv", o.float()))
        mod.gate_proj.register_forward_hook(lambda _m, _i, o, n=name: cap.__setitem__(n + "_gate", o.float()))
    if kind == "C":
        comp.indexer.scorer.register_forward_hook(
            lambda _m, inp, _o: cap.__setitem__("idx_entries", inp[1].float()))
    hidden = torch.randn(1, T, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    q_res = torch.randn(1, T, cfg.q_lora_rank, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        out = comp(hidden, q_res, torch.arange(T)[None], None, 0)
    cap["entries"] = out[0][0, 0].float()
    return comp, cap


@pytest.mark.parametrize("kind", ["C", "H"])
def test_compressor_hf_bf16_rounding_matches_hf_in_bf16(kind):
    comp, cap = run_bf16_compressor(kind)
    ratio, overlap = (4, True) if kind == "C" else (8, False)
    c = core()

    def ours(prefix, module, rounding):
        return c.v4_compress(np32(cap[prefix + "_kv"][0]), np32(cap[prefix + "_gate"][0]), np32(module.position_bias),
                             np32(module.kv_norm.weight), ratio, overlap, 1e-6, COMPRESS_ROPE, rounding, c.Impl.ref)

    pairs = [(ours("comp", comp, "hf_bf16"), np32(cap["entries"]), ours("comp", comp, "f32"))]
    if kind == "C":
        pairs.append((ours("idx", comp.indexer, "hf_bf16"), np32(cap["idx_entries"][0]),
                      ours("idx", comp.indexer, "f32")))
    for mine, hf, f32 in pairs:
        assert mine.shape == hf.shape
        ulps = bf16_ulps(mine, hf)
        # torch's own f32 softmax / mean can move a value across a bf16 rounding boundary: at most
        # one bf16 ulp, at a few elements.
        assert ulps.max() <= 1.0, ulps.max()
        assert (ulps > 0).mean() < 0.02, (ulps > 0).mean()
        # The f32 variant is not transformers' bf16 arithmetic (the check can fail).
        assert (bf16_ulps(f32.astype(ml_dtypes.bfloat16).astype(np.float32), hf) > 0).mean() > 0.05
