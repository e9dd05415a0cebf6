"""Private: the Hunyuan HY V4 (``hy_v4``) side of ``python -m indexshare.dump``.

transformers' ``HYV4Attention`` runs, per layer: q (q_a_proj, q_a_layernorm, q_b_proj, RoPE on its rope
slice), the latent kv (kv_a_proj_with_mqa, kv_a_layernorm, RoPE on k_rot), per-head keys and values
through kv_b_proj, on a Full layer its own ``HYV4Indexer`` (wq_b(q_resid), LayerNorm k_norm of wk(x) in
f32, RoPE on the TRAILING qk_rope_head_dim dims of each head, ``sum_h w_h ReLU(q_h . k)`` with ``w =
weights_proj(x.float()) * H^-0.5 * D^-0.5``, the causal mask, top-k), on a Shared layer the previous Full
layer's top-k; then the eager softmax with the unscaled per-head sink and the sigmoid gate before o_proj.

Per dumped layer the dump holds (tools/lib/golden_hyv4.h), under the golden names:

- inputs, Full layers: ``indexer.q`` f32 [S, H, D] (wq_b(q_resid), before RoPE), ``indexer.k`` f32 [S, D]
  (wk(x), before the LayerNorm), ``indexer.k_norm_w`` / ``k_norm_b`` f32 [D], ``indexer.weights_raw`` f32
  [S, H] (weights_proj(x.float())); every layer, as a bf16 kernel reads them (absorbed MLA): ``attn.q``
  bf16 [S, h, kv_lora + rope] (q_nope W_uk per head, then the roped q), ``attn.kv`` bf16 [S, 1, kv_lora +
  rope] (kv_a_layernorm of the latent, then the roped key), ``attn.w_uv`` bf16 [h, v, kv_lora],
  ``attn.gate`` bf16 [S, h, v] (gate_proj(x)) and ``attn.sink`` f32 [h];
- the model's own, Full layers: ``indexer.k_norm`` [S, D], ``indexer.q_rope`` [S, H, D], ``indexer.k_rope``
  [S, D] (transformers writes the rotated pairs de-interleaved, ``[even' | odd']``: put back in place, the
  golden's layout), ``indexer.weights`` [S, H] (the model's own expression), ``indexer.scores`` [S, S]
  (-inf where masked) and ``indexer.topk`` i32 [S, k]; every layer ``attn.indices`` i32 [S, 1, k] (the
  top-k the layer's attention used: a Shared layer's is its source's). A pick of a masked key (transformers
  takes one in rows with fewer than k causal keys) is -1, the golden's convention.

Only f32 models with every layer dumped: the indexer's intermediates are then f32 arithmetic, which the
golden's bounds hold (a bf16 model rounds k_norm and runs RoPE in bf16, which they do not). The model's
attention itself is not dumped: it runs unabsorbed MLA on f32 q / k / v, whose bf16 absorbed form the set's
attention reads. The descriptor fixes rms_norm_eps 1e-5 and a default RoPE with theta 10000: a model with
other values is refused.
"""

from __future__ import annotations

import json
import sys

import torch

from ._bridge import meta_head, prefill

FAMILY = "hy_v4"


class HYV4Error(Exception):
    """A hy_v4 model or option the bridge cannot dump (the message names what and why)."""


def is_hyv4(config) -> bool:
    return getattr(config, "model_type", None) == FAMILY


def check_config(cfg) -> None:
    rope = cfg.rope_parameters or {}
    want = [("rms_norm_eps", cfg.rms_norm_eps, 1e-5), ("rope_parameters.rope_type", rope.get("rope_type"), "default"),
            ("rope_parameters.rope_theta", rope.get("rope_theta"), 10000.0)]
    for name, got, expected in want:
        if got != expected:
            raise HYV4Error(f"config.{name} is {got!r}; a hyv4 golden set fixes it at {expected!r}")


def spec(cfg, tokens: int, scaling: float) -> str:
    """The hyv4 descriptor of the model's layers (tools/lib/golden_hyv4.h)."""
    sched = "".join("F" if t == "full" else "S" for t in cfg.indexer_types[: cfg.num_hidden_layers])
    sm = float(torch.tensor(scaling, dtype=torch.float32))
    return (f"sq{tokens} skv{tokens} hq{cfg.num_attention_heads} dqk{cfg.kv_lora_rank + cfg.qk_rope_head_dim} "
            f"dv{cfg.kv_lora_rank} ih{cfg.index_n_heads} id{cfg.index_head_dim} k{cfg.index_topk} sm={sm:.9g} "
            f"sink=random nl{cfg.num_hidden_layers} sched={sched} rope={cfg.qk_rope_head_dim} vd={cfg.v_head_dim}")


def _in_place(x, rope: int):
    """transformers' de-interleaved rope slice [even' | odd'] back to pairs in place (the last `rope` dims)."""
    y = x.clone()
    rot = x[..., x.shape[-1] - rope:]
    y[..., x.shape[-1] - rope::2] = rot[..., : rope // 2]
    y[..., x.shape[-1] - rope + 1::2] = rot[..., rope // 2:]
    return y


def _picks(idx, k: int):
    """The model's top-k [S, n] as the golden's: picks of masked keys (> the row's position) -1, padded to k."""
    S = idx.shape[0]
    out = torch.where(idx <= torch.arange(S)[:, None], idx, torch.full_like(idx, -1)).to(torch.int32)
    if out.shape[1] < k:
        out = torch.cat([out, torch.full((S, k - out.shape[1]), -1, dtype=torch.int32)], dim=1)
    return out


def _inputs(attn, x, cos, sin, rope_fn, put):
    """The kernel inputs of one layer from its hidden states x [1, S, hidden], with the module's own layers."""
    cfg = attn.config
    S, h, nope, r, v, L = x.shape[1], attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim, attn.kv_lora_rank
    q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_resid).view(1, S, h, nope + r).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, r], dim=-1)
    kv_pass, k_rot = torch.split(attn.kv_a_proj_with_mqa(x), [L, r], dim=-1)
    latent = attn.kv_a_layernorm(kv_pass)
    q_rot, k_rot = rope_fn(q_rot, k_rot.view(1, 1, S, r), cos, sin)
    w = attn.kv_b_proj.weight.view(h, nope + v, L)
    q_abs = torch.einsum("bhsn,hnl->bhsl", q_pass, w[:, :nope])
    put("attn.q", torch.cat([q_abs, q_rot], dim=-1)[0].transpose(0, 1).to(torch.bfloat16))
    put("attn.kv", torch.cat([latent[0], k_rot[0, 0]], dim=-1)[:, None].to(torch.bfloat16))
    put("attn.w_uv", w[:, nope:].to(torch.bfloat16))
    put("attn.gate", attn.gate_proj(x).view(S, h, v).to(torch.bfloat16))
    put("attn.sink", attn.sinks.float())
    ix = attn.indexer
    if ix is None:
        return
    put("indexer.q", ix.wq_b(q_resid).view(S, ix.n_heads, ix.head_dim).float())
    put("indexer.k", ix.wk(x)[0].float())
    put("indexer.k_norm_w", ix.k_norm.weight.float())
    put("indexer.k_norm_b", ix.k_norm.bias.float())
    put("indexer.weights_raw", ix.weights_proj(x.to(ix.weights_proj.weight.dtype))[0].float())
    put("indexer.weights", (ix.weights_proj(x.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads**-0.5) * ix.softmax_scale)[0])
    del cfg


def capture(model, input_ids):
    """One prefill with hooks on every layer; returns the tensors and the softmax scale."""
    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    cfg = model.config
    tensors: dict[str, torch.Tensor] = {}
    handles, state = [], {"indexer": None}
    rope_fn, topk_fn = mod.apply_rotary_pos_emb_interleave, torch.Tensor.topk

    def put(layer, name, t):
        tensors[f"layers.{layer}.{name}"] = t.detach().to("cpu").contiguous()

    def attn_pre(layer):
        def hook(m, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            cos, sin = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
            _inputs(m, x, cos, sin, rope_fn, lambda n, t: put(layer, n, t))
        return hook

    def attn_post(layer):
        def hook(_m, _args, _kwargs, out):
            put(layer, "attn.indices", _picks(out[2][0].long(), cfg.index_topk)[:, None])
        return hook

    def ix_pre(layer):
        return lambda _m, _args: state.__setitem__("indexer", layer)

    def ix_post(layer):
        def hook(_m, _args, out):
            state["indexer"] = None
            put(layer, "indexer.topk", _picks(out[0].long(), cfg.index_topk))
        return hook

    def rope(q, k, cos, sin, *a, **kw):
        qe, ke = rope_fn(q, k, cos, sin, *a, **kw)
        layer = state["indexer"]
        if layer is not None:  # the indexer's call: [B, S, H, rope] and [B, S, 1, rope]
            r = cfg.qk_rope_head_dim
            put(layer, "indexer.q_rot", _in_place(qe[0], r))
            put(layer, "indexer.k_rot", _in_place(ke[0, :, 0], r))
        return qe, ke

    def topk(self, *a, **kw):
        if state["indexer"] is not None:  # the model's mask adds finfo.min where a key is in the future: -inf, the golden's
            S = self.shape[-1]
            future = torch.arange(S)[None, :] > torch.arange(self.shape[-2])[:, None]
            put(state["indexer"], "indexer.scores", self[0].float().masked_fill(future.to(self.device), float("-inf")))
        return topk_fn(self, *a, **kw)

    try:
        for layer, block in enumerate(model.model.layers):
            attn = block.self_attn
            handles.append(attn.register_forward_pre_hook(attn_pre(layer), with_kwargs=True))
            handles.append(attn.register_forward_hook(attn_post(layer), with_kwargs=True))
            if attn.indexer is not None:
                handles.append(attn.indexer.register_forward_pre_hook(ix_pre(layer)))
                handles.append(attn.indexer.register_forward_hook(ix_post(layer)))
                handles.append(attn.indexer.k_norm.register_forward_hook(
                    lambda _m, _i, out, layer=layer: put(layer, "indexer.k_norm", out[0].float())))
        mod.apply_rotary_pos_emb_interleave, torch.Tensor.topk = rope, topk
        prefill(model, input_ids)
    finally:
        mod.apply_rotary_pos_emb_interleave, torch.Tensor.topk = rope_fn, topk_fn
        for hd in handles:
            hd.remove()
    # q_rope / k_rope: the pass dims, then the rotated slice in place (the indexer's own rope call).
    for layer, block in enumerate(model.model.layers):
        if block.self_attn.indexer is None:
            continue
        p, r = f"layers.{layer}.", cfg.qk_rope_head_dim
        q, k = tensors.pop(p + "indexer.q"), tensors.pop(p + "indexer.k")
        kn = tensors[p + "indexer.k_norm"]
        tensors[p + "indexer.q_rope"] = torch.cat([q[..., : q.shape[-1] - r], tensors.pop(p + "indexer.q_rot")], dim=-1)
        tensors[p + "indexer.k_rope"] = torch.cat([kn[..., : kn.shape[-1] - r], tensors.pop(p + "indexer.k_rot")], dim=-1)
        tensors[p + "indexer.q"], tensors[p + "indexer.k"] = q, k
    return tensors, model.model.layers[0].self_attn.scaling


def dump(model, input_ids, layers: list[int] | None, source: str):
    """(tensors, metadata) of a hy_v4 model's layers (every one) on input_ids [1, S]."""
    cfg = model.config
    if next(model.parameters()).dtype != torch.float32:
        raise HYV4Error(f"the model runs in {next(model.parameters()).dtype}: the bridge dumps hy_v4 in float32 (a bf16 "
                        "model rounds k_norm and runs RoPE in bf16, which a hyv4 golden set does not bound)")
    if layers is not None and list(layers) != list(range(cfg.num_hidden_layers)):
        raise HYV4Error("--layers: a hy_v4 dump holds every layer (a Shared layer needs its source Full layer)")
    check_config(cfg)
    S = int(input_ids.shape[1])
    tensors, scaling = capture(model, input_ids)
    meta = {
        **meta_head("hyv4", model, source),
        "problem": spec(cfg, S, scaling),
        "layers": json.dumps(list(range(cfg.num_hidden_layers))),
        "tokens": str(S),
        "dtype": "float32",
        "attention_inputs": "bf16, absorbed: attn.q = [q_nope W_uk | q_rot], attn.kv = [latent | k_rot], as a kernel reads them",
    }
    return tensors, meta


def randomize_sinks(model, seed: int) -> None:
    """Random sinks (transformers' init sets them to learnable_sink_init, 0), seeded."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.copy_((0.5 * torch.randn(p.shape, generator=g)).to(p.dtype))
