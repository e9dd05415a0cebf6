"""Private: the GLM-5.3 KPool-DSA (``glm5_next``, ``glm5_next_text``) side of ``python -m indexshare.dump``.

transformers' ``Glm5NextTextAttention`` runs, per DSA layer (``layer_types`` "indexed_attention"; the
others are KDA linear attention): q_resid = q_a_layernorm(q_a_proj(x)), per-head NoPE queries
q_b_proj(q_resid), the latent kv_a_layernorm(kv_a_proj_with_mqa(x)) and per-head keys and values through
kv_b_proj (unabsorbed MLA, scale qk_head_dim^-1/2); on a Full layer its own ``Glm5NextTextIndexer``:
q = wq_b(q_resid), k = k_norm(wk(x)) (a LayerNorm), gate scores F.linear(x, index_kpool_compress_gate),
the pooled keys (softmax over each pool's P slots of gate + ape), ``sum_h w_h ReLU(q_h . Kbar D^-1/2)``
with ``w = weights_proj(x).float() * H^-1/2``, top-(k / P) pools, their tokens and the query's tail; on
a Shared layer the ``prev_topk_indices`` it is handed.

Per DSA layer l (its model layer number) the dump holds (tools/lib/golden_kpool.h), under the golden names:

- inputs, Full layers: ``indexer.q`` f32 [S, H, D], ``indexer.k`` f32 [S, D] (the k_norm output),
  ``indexer.gate`` f32 [S, D], ``indexer.ape`` f32 [P, D], ``indexer.weights`` f32 [S, H] (the model's own
  expression); every layer, as a bf16 kernel reads the absorbed NoPE MLA: ``attn.q`` bf16 [S, h, kv_lora]
  (q_nope W_uk per head) and ``attn.kv`` bf16 [S, 1, kv_lora] (the latent, which is also V);
- the model's own, Full layers: ``indexer.pool_keys`` [n, D] (``get_pooled_states``), ``indexer.scores``
  [S, n] (finfo.min where a pool is not visible: -inf, the golden's), ``indexer.pools`` i32 [S, k / P]
  (-1 where the model picked no visible pool), ``indexer.history``, ``indexer.tail`` and ``indexer.indices``
  (its returned list, whose layout is the golden's: history | tail | -1); every layer ``attn.indices`` i32
  [S, 1, width] (the list the layer's attention used: a Shared layer's is the one it was handed).

Only f32 models: the pooled keys and scores are then f32 arithmetic, which the set's bounds hold. The
model's attention output is not dumped: it runs unabsorbed MLA on f32 q / k / v (V through W_uv), and
the set's attention reads their bf16 absorbed form. The descriptor fixes the attention scale at GLM-5.3's
256^-1/2 (qk_head_dim 256) and the DSA layers at i % 4 == 3 or every layer: another config is refused.

transformers hands a top-k only to the very next decoder layer, and a KDA or Shared layer hands none on:
a Shared DSA layer that does not directly follow a Full DSA layer (GLM-5.3's layout puts KDA layers
between its DSA layers) makes the forward raise. The bridge says so before running; what transformers
can run (an all-Full schedule, or every layer DSA with each Shared layer right after a Full one) dumps.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from ._bridge import meta_head, prefill

FAMILIES = ("glm5_next", "glm5_next_text")


class KpoolError(Exception):
    """A glm5_next model or option the bridge cannot dump (the message names what and why)."""


def is_kpool(config) -> bool:
    return getattr(config, "model_type", None) in FAMILIES


def text_config(config):
    return config.text_config if getattr(config, "model_type", None) == "glm5_next" else config


def text_model(model):
    for m in model.modules():
        if type(m).__name__ == "Glm5NextTextModel":
            return m
    raise KpoolError(f"{type(model).__name__}: no Glm5NextTextModel inside (the bridge reads its layers)")


def dsa_of(cfg) -> str:
    """'glm53' or 'all' from config.layer_types; KpoolError naming the field otherwise."""
    n = cfg.num_hidden_layers
    dsa = [t == "indexed_attention" for t in cfg.layer_types[:n]]
    if all(dsa):
        return "all"
    if dsa == [i % 4 == 3 for i in range(n)]:
        return "glm53"
    raise KpoolError(f"config.layer_types {cfg.layer_types[:n]!r}: a kpool set places the DSA layers at i % 4 == 3 "
                     "(GLM-5.3's layout, KDA elsewhere) or at every layer (dsa=all)")


def schedule(cfg) -> tuple[list[int], str]:
    """The DSA layers and their F/S pattern; KpoolError where transformers cannot run it."""
    n = cfg.num_hidden_layers
    layers = [i for i in range(n) if cfg.layer_types[i] == "indexed_attention"]
    kinds = cfg.indexer_types[:n]
    sched = "".join("F" if kinds[i] == "full" else "S" for i in layers)
    if not layers:
        raise KpoolError(f"config.num_hidden_layers {n}: no DSA layer (GLM-5.3's first is layer 3)")
    if sched[0] != "F":
        raise KpoolError(f"config.indexer_types: the first DSA layer {layers[0]} is Shared (a Shared layer reuses a Full "
                         "one's list)")
    for i in layers:
        if kinds[i] == "full":
            continue
        prev = i - 1
        what = ("a linear-attention (KDA) layer" if cfg.layer_types[prev] != "indexed_attention"
                else "a Shared DSA layer")
        if cfg.layer_types[prev] != "indexed_attention" or kinds[prev] != "full":
            raise KpoolError(
                f"config.indexer_types: layer {i} is a Shared DSA layer after {what} ({prev}): transformers' glm5_next "
                "hands the top-k only to the very next decoder layer and KDA and Shared layers hand none on, so its "
                "forward raises 'Shared DSA layers require top-k indices from a previous full indexer layer' (a "
                "transformers limitation, not the model's). Dump an all-Full schedule, or every layer DSA "
                "(layer_types all 'indexed_attention') with each Shared layer right after a Full one")
    return layers, sched


def check_config(cfg) -> None:
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if float(torch.tensor(qk ** -0.5, dtype=torch.float32)) != 0.0625:
        raise KpoolError(f"config.qk_nope_head_dim + qk_rope_head_dim = {qk}: the attention's sm_scale {qk}^-1/2 is not "
                         "GLM-5.3's 256^-1/2 = 0.0625, which a kpool golden set fixes")
    if cfg.qk_rope_head_dim != 0:
        raise KpoolError(f"config.qk_rope_head_dim {cfg.qk_rope_head_dim}: a kpool set's attention is NoPE")
    if cfg.index_topk % cfg.index_kpool:
        raise KpoolError(f"config.index_topk {cfg.index_topk} is not a multiple of config.index_kpool {cfg.index_kpool}")


def spec(cfg, tokens: int, dsa: str, sched: str) -> str:
    """The kpool descriptor of the model (tools/lib/golden_kpool.h)."""
    tail = "yes" if cfg.index_kpool_always_select_tail else "no"
    L = cfg.kv_lora_rank
    return (f"sq={tokens} skv={tokens} h={cfg.index_n_heads} d={cfg.index_head_dim} pool={cfg.index_kpool} "
            f"k={cfg.index_topk} tail={tail} rounding=f32 hq={cfg.num_attention_heads} dqk={L} dv={L} "
            f"nl={cfg.num_hidden_layers} dsa={dsa} sched={sched}")


def _attention_inputs(attn, x, put):
    """The absorbed NoPE MLA inputs of one layer from its hidden states x [1, S, hidden], with its own layers."""
    S, h, nope, v, L = x.shape[1], attn.num_heads, attn.qk_nope_head_dim, attn.v_head_dim, attn.kv_lora_rank
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(1, S, h, nope)
    latent = attn.kv_a_layernorm(attn.kv_a_proj_with_mqa(x)[..., :L])
    w_uk = attn.kv_b_proj.weight.view(h, nope + v, L)[:, :nope]
    put("attn.q", torch.einsum("bshn,hnl->shl", q, w_uk).to(torch.bfloat16))
    put("attn.kv", latent[0][:, None].to(torch.bfloat16))


def capture(model, input_ids, cfg, layers: list[int]):
    """One prefill with hooks on every DSA layer; returns the tensors."""
    tm = text_model(model)
    P, S = cfg.index_kpool, int(input_ids.shape[1])
    tensors: dict[str, torch.Tensor] = {}
    handles, state, patched = [], {"indexer": None}, {}
    topk_fn = torch.Tensor.topk

    def put(layer, name, t):
        tensors[f"layers.{layer}.{name}"] = t.detach().to("cpu").contiguous().clone()

    def attn_pre(layer):
        def hook(m, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            _attention_inputs(m, x, lambda n, t: put(layer, n, t))
            if m.indexer is None and kwargs.get("prev_topk_indices") is not None:
                put(layer, "attn.indices", kwargs["prev_topk_indices"][0].to(torch.int32)[:, None])
        return hook

    def ix_pre(layer):
        def hook(m, args, kwargs):
            state["indexer"] = layer
            x = kwargs.get("hidden_states", args[0] if args else None)
            put(layer, "indexer.gate", F.linear(x, m.index_kpool_compress_gate)[0].float())
            put(layer, "indexer.ape", m.index_kpool_compress_ape.float())
            put(layer, "indexer.weights", (m.weights_proj(x.to(m.weights_proj.weight.dtype)).float() * (m.n_heads**-0.5))[0])
        return hook

    def ix_post(layer):
        def hook(m, _args, _kwargs, out):
            state["indexer"] = None
            idx = out[0].to(torch.int32)
            n_sel = tensors[f"layers.{layer}.indexer.pools"].shape[1]
            put(layer, "indexer.indices", idx)
            put(layer, "indexer.history", idx[:, : n_sel * P])
            if m.index_kpool_always_select_tail:
                put(layer, "indexer.tail", idx[:, n_sel * P: n_sel * P + P - 1])
            put(layer, "attn.indices", idx[:, None])
        return hook

    def pooled(layer, fn):
        def wrapped(*a, **kw):
            keys, idx, valid = fn(*a, **kw)
            put(layer, "indexer.pool_keys", keys[0].float())
            return keys, idx, valid
        return wrapped

    def topk(self, *a, **kw):
        res = topk_fn(self, *a, **kw)
        layer = state["indexer"]
        if layer is not None:  # the pool selection: masked pools hold finfo.min
            lo = torch.finfo(self.dtype).min
            put(layer, "indexer.scores", self[0].float().masked_fill(self[0] == lo, float("-inf")))
            picked = self[0].gather(-1, res.indices[0])
            put(layer, "indexer.pools", torch.where(picked == lo, -1, res.indices[0]).to(torch.int32))
        return res

    try:
        for layer in layers:
            attn = tm.layers[layer].self_attn
            handles.append(attn.register_forward_pre_hook(attn_pre(layer), with_kwargs=True))
            ix = attn.indexer
            if ix is None:
                continue
            handles.append(ix.register_forward_pre_hook(ix_pre(layer), with_kwargs=True))
            handles.append(ix.register_forward_hook(ix_post(layer), with_kwargs=True))
            handles.append(ix.wq_b.register_forward_hook(
                lambda _m, _i, out, layer=layer, ix=ix: put(layer, "indexer.q", out[0].view(S, ix.n_heads, ix.head_dim).float())))
            handles.append(ix.k_norm.register_forward_hook(
                lambda _m, _i, out, layer=layer: put(layer, "indexer.k", out[0].float())))
            patched[layer] = vars(ix).get("get_pooled_states")  # an instance's own, kept
            ix.get_pooled_states = pooled(layer, ix.get_pooled_states)
        torch.Tensor.topk = topk
        prefill(model, input_ids)
    except ValueError as e:
        if "Shared DSA layers require" in str(e):
            raise KpoolError(f"transformers' forward raised '{e}': its glm5_next hands the top-k only to the next decoder "
                             "layer (nothing written)") from None
        raise
    finally:
        torch.Tensor.topk = topk_fn
        for hd in handles:
            hd.remove()
        for layer, own in patched.items():
            ix = tm.layers[layer].self_attn.indexer
            if own is None:
                del ix.get_pooled_states
            else:
                ix.get_pooled_states = own
    return tensors


def dump(model, input_ids, layers: list[int] | None, source: str):
    """(tensors, metadata) of a glm5_next model's DSA layers (every one) on input_ids [1, S]."""
    cfg = text_config(model.config)
    if next(model.parameters()).dtype != torch.float32:
        raise KpoolError(f"the model runs in {next(model.parameters()).dtype}: the bridge dumps glm5_next in float32 (a bf16 "
                         "model pools with bf16 probabilities and products, which the f32 set does not bound)")
    dsa = dsa_of(cfg)
    all_dsa, sched = schedule(cfg)
    if layers is not None and list(layers) != all_dsa:
        raise KpoolError(f"--layer-list: a glm5_next dump holds every DSA layer ({','.join(map(str, all_dsa))}: a Shared layer "
                         "needs its source Full layer)")
    check_config(cfg)
    S = int(input_ids.shape[1])
    tensors = capture(model, input_ids, cfg, all_dsa)
    meta = {
        **meta_head("kpool", model, source),
        "problem": spec(cfg, S, dsa, sched),
        "layers": json.dumps(all_dsa),
        "schedule": sched,
        "tokens": str(S),
        "dtype": "float32",
        "attention_inputs": "bf16, absorbed NoPE MLA: attn.q = q_nope W_uk per head, attn.kv = the latent (also V)",
    }
    return tensors, meta


def randomize_indexer(model, seed: int) -> None:
    """Random pooling parameters, seeded: transformers' init sets the slot embedding to 0 and every
    gate weight to 1 (every channel of a token would then get the same gate score)."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("index_kpool_compress_ape"):
                p.copy_((0.5 * torch.randn(p.shape, generator=g)).to(p.dtype))
            elif name.endswith("index_kpool_compress_gate"):
                p.copy_((torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5).to(p.dtype))
