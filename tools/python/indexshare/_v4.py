"""Private: the DeepSeek-V4 (``deepseek_v4``) side of ``python -m indexshare.dump``.

transformers' ``DeepseekV4Attention`` runs, per layer: q (q_a_proj, q_a_norm, q_b_proj, the
unweighted q_b_norm, RoPE), the token kv (kv_proj, kv_norm, RoPE), and on C4A / HCA layers the
compressor (kv_proj / gate_proj, position_bias, softmax, kv_norm, RoPE at w * m), on C4A layers
also the indexer (its own compressor at index_head_dim, q_b_proj and RoPE, the scorer's
``sum_h w_h ReLU(q_h . K_s) * D^-0.5`` with ``w = weights_proj(x).float() * H^-0.5``, top-k, -1
past the causal blocks); then one eager softmax over [window tokens ; compressed entries] with
the per-head sink, and the inverse RoPE (``-sin``) on the output before o_a_proj. Every C4A layer
runs its own indexer: transformers has no index sharing for V4, so a dump's schedule is all Full.

Hooks capture, per dumped layer, the golden v4 set's input tensors (tools/lib/golden_v4.h) and the
model's own outputs under the names ``indexshare diff`` judges:

- inputs: ``attn.q`` bf16 [T, H, D], ``attn.kv`` bf16 [T, 1, D] (the token rows only: ``golden
  --from`` appends its own compressed entries), ``attn.sink`` f32 [H]; C4A / HCA:
  ``compressor.{kv, gate}`` f32 [T, 2D or D] (kv_proj / gate_proj outputs),
  ``compressor.position_bias`` [m, width], ``compressor.norm_weight`` [D]; C4A:
  ``indexer.{kv, gate, position_bias, norm_weight}``, ``indexer.q`` f32 [T, H_I, D_I] (after the
  compress RoPE), ``indexer.weights`` f32 [T, H_I] (the scorer's own expression);
- the model's own: ``compressor.entries`` [n_c, D], ``indexer.entries`` [n_b, D_I],
  ``indexer.scores`` [T, n_b] (-inf where the block is not causal, as the indexer masks them),
  ``indexer.blocks`` i32 [T, k] (the indexer's top-k, -1 past the causal blocks), ``attn.out``
  [T, H, D] (the eager attention's output, before the inverse RoPE) and ``attn.out_rotated``
  [T, H, D] (o_a_proj's input, after it), all f32.

Only f32 models are dumped. In a bf16 model transformers rounds the compressor at bf16 points
(``softmax(...).to(kv.dtype)``: ref/v4/compressor.h's ``hf_bf16``) and its eager attention takes
the softmax in bf16, neither of which a v4 golden set (f32 compressor, f32 attention over bf16
q / kv) bounds. The kernels read bf16 q and kv: during the dump the model's eager attention is
handed bf16-rounded q, token kv and compressed entries (as tests/python/test_v4_hf.py does), so
the model's attention reads what the golden's attention reads; everything else runs as the model
runs it. The V4 descriptor (``problem`` metadata) fixes the RoPE (main: theta 10000; compress:
theta 160000, YaRN factor 16, beta 32 / 1, no mscale) and eps 1e-6: a model with other values is
refused, and the model's own inverse frequencies are recorded (``main_inv_freq``,
``compress_inv_freq``) so that ``golden --from`` checks them against ref's.
"""

from __future__ import annotations

import json
import struct

import torch

from ._bridge import Stop, meta_head, prefill

FAMILY = "deepseek_v4"
TYPE_CHAR = {"sliding_attention": "S", "compressed_sparse_attention": "C", "heavily_compressed_attention": "H"}
INPUTS = ("attn.q", "attn.kv", "attn.sink", "compressor.kv", "compressor.gate", "compressor.position_bias",
          "compressor.norm_weight", "indexer.kv", "indexer.gate", "indexer.position_bias", "indexer.norm_weight",
          "indexer.q", "indexer.weights")
OWN = ("compressor.entries", "indexer.entries", "indexer.scores", "indexer.blocks", "attn.out", "attn.out_rotated")


class V4Error(Exception):
    """A deepseek_v4 model or option the bridge cannot dump (the message names what and why)."""


def is_v4(config) -> bool:
    return getattr(config, "model_type", None) == FAMILY


def layer_types(config) -> str:
    return "".join(TYPE_CHAR[t] for t in config.layer_types[: config.num_hidden_layers])


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def check_config(cfg) -> None:
    """Refuses what a v4 descriptor cannot express (it fixes eps, the RoPE thetas and YaRN's constants)."""
    main, comp = cfg.rope_parameters.get("main", {}), cfg.rope_parameters.get("compress", {})
    want = [
        ("rms_norm_eps", cfg.rms_norm_eps, 1e-6),
        ("rope_parameters.main.rope_type", main.get("rope_type"), "default"),
        ("rope_parameters.main.rope_theta", main.get("rope_theta"), 10000.0),
        ("rope_parameters.compress.rope_type", comp.get("rope_type"), "yarn"),
        ("rope_parameters.compress.rope_theta", comp.get("rope_theta"), 160000.0),
        ("rope_parameters.compress.factor", comp.get("factor"), 16.0),
        ("rope_parameters.compress.beta_fast", comp.get("beta_fast"), 32),
        ("rope_parameters.compress.beta_slow", comp.get("beta_slow"), 1),
        ("rope_parameters.compress.attention_factor", comp.get("attention_factor"), 1.0),
    ]
    for name, got, expected in want:
        if got != expected:
            raise V4Error(f"config.{name} is {got!r}; a v4 golden set fixes it at {expected!r} (V4's value)")
    if cfg.qk_rope_head_dim % 2 or cfg.qk_rope_head_dim > cfg.index_head_dim:
        raise V4Error(f"qk_rope_head_dim {cfg.qk_rope_head_dim} must be even and <= index_head_dim {cfg.index_head_dim}")


def spec(cfg, types: str, tokens: int) -> str:
    """The v4 descriptor of the dumped layers (tools/lib/golden_v4.h), every C4A layer Full."""
    rates = cfg.compress_rates
    ctx = cfg.rope_parameters["compress"]["original_max_position_embeddings"]
    return (f"t={tokens} h={cfg.num_attention_heads} d={cfg.head_dim} w={cfg.sliding_window} "
            f"csa={rates['compressed_sparse_attention']} hca={rates['heavily_compressed_attention']} "
            f"ih={cfg.index_n_heads} id={cfg.index_head_dim} k={cfg.index_topk} rope={cfg.qk_rope_head_dim} "
            f"ctx={ctx} types={types} sched={'F' * types.count('C')} rot=hf")


def _bf16(x):
    return x.to(torch.bfloat16).to(x.dtype)


def capture(model, input_ids, layers: list[int]):
    """One prefill with hooks on `layers`; returns the tensors (renumbered 0, 1, ...) and the RoPE record."""
    import sys

    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    new_index = {layer: i for i, layer in enumerate(layers)}
    tensors: dict[str, torch.Tensor] = {}
    handles = []

    def put(layer, name, t):
        tensors[f"layers.{new_index[layer]}.{name}"] = t.detach().to("cpu").contiguous()

    def out_hook(layer, name):
        return lambda _m, _i, out: put(layer, name, out[0].float())

    def scorer_hook(layer):
        def hook(m, args, out):
            q, k, hs = args
            put(layer, "indexer.q", q[0].float())
            put(layer, "indexer.entries", k[0].float())
            # the scorer's own expression for the head weights, so the bits are the model's
            put(layer, "indexer.weights", (m.weights_proj(hs).float() * m.weights_scaling)[0])
            T, n_b = out.shape[1], out.shape[2]
            ratio = model.config.compress_rates["compressed_sparse_attention"]
            future = torch.arange(n_b)[None, :] >= ((torch.arange(T) + 1) // ratio)[:, None]
            put(layer, "indexer.scores", out[0].float().masked_fill(future.to(out.device), float("-inf")))
        return hook

    def o_hook(layer):
        def hook(_m, args):
            x = args[0]
            put(layer, "attn.out_rotated", x.reshape(x.shape[1], model.config.num_attention_heads, -1).float())
            if layer == layers[-1]:
                raise Stop()
        return hook

    original = mod.eager_attention_forward

    def bf16_attention(module, query, key, value, attention_mask, scaling, **kw):
        layer = module.layer_idx
        if layer not in new_index:
            return original(module, query, key, value, attention_mask, scaling, **kw)
        q16, kv16 = _bf16(query), _bf16(key)  # K = V: one tensor, tokens then compressed entries
        T = query.shape[2]
        put(layer, "attn.q", q16[0].transpose(0, 1).to(torch.bfloat16))
        put(layer, "attn.kv", kv16[0, 0, :T].unsqueeze(1).to(torch.bfloat16))
        put(layer, "attn.sink", module.sinks.float())
        out, w = original(module, q16, kv16, kv16, attention_mask, scaling, **kw)
        put(layer, "attn.out", out[0].float())
        return out, w

    def params(layer, pre, m):
        put(layer, pre + "position_bias", m.position_bias.float())
        put(layer, pre + "norm_weight", m.kv_norm.weight.float())

    try:
        for layer in layers:
            attn = model.model.layers[layer].self_attn
            handles.append(attn.o_a_proj.register_forward_pre_hook(o_hook(layer)))
            comp = attn.compressor
            if comp is None:
                continue
            handles.append(comp.kv_proj.register_forward_hook(out_hook(layer, "compressor.kv")))
            handles.append(comp.gate_proj.register_forward_hook(out_hook(layer, "compressor.gate")))
            handles.append(comp.register_forward_hook(lambda _m, _i, out, layer=layer: put(layer, "compressor.entries", out[0][0, 0].float())))
            params(layer, "compressor.", comp)
            ix = getattr(comp, "indexer", None)
            if ix is None:
                continue
            handles.append(ix.kv_proj.register_forward_hook(out_hook(layer, "indexer.kv")))
            handles.append(ix.gate_proj.register_forward_hook(out_hook(layer, "indexer.gate")))
            handles.append(ix.scorer.register_forward_hook(scorer_hook(layer)))
            handles.append(ix.register_forward_hook(lambda _m, _i, out, layer=layer: put(layer, "indexer.blocks", out[0].to(torch.int32))))
            params(layer, "indexer.", ix)
        mod.eager_attention_forward = bf16_attention
        prefill(model, input_ids)
    finally:
        mod.eager_attention_forward = original
        for h in handles:
            h.remove()
    rotary = model.model.rotary_emb
    rope = {f"{k}_inv_freq": json.dumps([_f32(f) for f in getattr(rotary, f"{k}_inv_freq").float().cpu()])
            for k in ("main", "compress")}
    return tensors, rope


def dump(model, input_ids, layers: list[int] | None, source: str):
    """(tensors, metadata) of a deepseek_v4 model's `layers` (all by default) on input_ids [1, T]."""
    cfg = model.config
    if next(model.parameters()).dtype != torch.float32:
        raise V4Error(f"the model runs in {next(model.parameters()).dtype}: the bridge dumps deepseek_v4 in float32 "
                      "(transformers' bf16 compressor and bf16 eager softmax are not what a v4 golden set bounds)")
    if getattr(cfg, "_attn_implementation", None) != "eager":
        raise V4Error(f"attn_implementation {cfg._attn_implementation!r}: deepseek_v4 ships eager attention only")
    check_config(cfg)
    layers = list(range(cfg.num_hidden_layers)) if layers is None else layers
    all_types = layer_types(cfg)
    types = "".join(all_types[layer] for layer in layers)
    T = int(input_ids.shape[1])
    tensors, rope = capture(model, input_ids, layers)
    meta = {
        **meta_head("v4", model, source),
        "problem": spec(cfg, types, T),
        "schedule": "F" * types.count("C"),
        "model_layer_types": all_types,
        "layers": json.dumps(layers),
        "tokens": str(T),
        "dtype": "float32",
        "attn_implementation": "eager",
        "attention_inputs": "bf16: the dump hands the model's eager attention bf16-rounded q, token kv and "
                            "compressed entries (what a kernel reading bf16 reads)",
        **rope,
    }
    return tensors, meta


def bytes_per_token_layer(cfg, kind: str, tokens: int) -> int:
    """What one token costs in one dumped layer of type kind ('S', 'C' or 'H'): the README's memory figure.

    Every layer: attn.q bf16, attn.kv bf16, attn.out and attn.out_rotated f32; C4A / HCA the compressor's
    kv and gate (f32, width 2D or D) and its entries (one per m tokens); C4A the indexer's kv, gate, q,
    weights, blocks, entries and its scores (n_b = T / 4 per token: quadratic in T).
    """
    H, D, HI, DI, k = cfg.num_attention_heads, cfg.head_dim, cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
    n = 2 * H * D + 2 * D + 8 * H * D
    rates = cfg.compress_rates
    if kind == "H":
        n += 8 * D + 4 * D // rates["heavily_compressed_attention"]
    if kind == "C":
        m = rates["compressed_sparse_attention"]
        n += 16 * D + 4 * D // m
        n += 16 * DI + 4 * HI * DI + 4 * HI + 4 * min(k, tokens // m) + 4 * DI // m + 4 * (tokens // m)
    return n


def bytes_per_layer(cfg, kind: str) -> int:
    """What one dumped layer costs whatever the token count: the sink, position biases and norm weights."""
    H, D, DI = cfg.num_attention_heads, cfg.head_dim, cfg.index_head_dim
    rates = cfg.compress_rates
    n = 4 * H
    if kind == "H":
        n += 4 * rates["heavily_compressed_attention"] * D + 4 * D
    if kind == "C":
        m = rates["compressed_sparse_attention"]
        n += 4 * m * 2 * D + 4 * D + 4 * m * 2 * DI + 4 * DI
    return n


def randomize_attention_extras(model, seed: int) -> None:
    """Random sinks and compressor position biases (transformers' init sets both to 0), seeded."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks") or name.endswith("position_bias"):
                p.copy_((0.5 * torch.randn(p.shape, generator=g)).to(p.dtype))
