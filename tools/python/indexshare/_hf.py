"""Private: what indexshare reads from a transformers DSA model, family by family.

Two families implement DeepSeek Sparse Attention in PyPI transformers (5.x):

- ``glm_moe_dsa`` (``GlmMoeDsaIndexer``, ``GlmMoeDsaAttention``): interleaved indexer RoPE, and
  cross-layer sharing through ``config.indexer_types`` ("full" layers run the indexer, "shared" ones
  have none and reuse ``prev_topk_indices``, the last Full layer's positions).
- ``deepseek_v32`` (``DeepseekV32Indexer``, ``DeepseekV32Attention``): half-split indexer RoPE,
  every layer Full, YaRN through ``config.rope_parameters``.

Both compute the bf16 indexer (no Hadamard, no FP8): for query row t and key s,

    index_scores[t, s] = sum_h w[t, h] * ReLU((q[t, h] . k[s]) * D^-0.5),
    w = weights_proj(x).float() * H^-0.5,

with q and k the bf16 vectors after RoPE, the dot in f32 (``torch.matmul`` of the upcast
tensors), the future masked with -inf, then ``topk(min(index_topk, T))``. The functions below
recompute those intermediates from a module's own inputs with the module's own weights and the
modeling file's own RoPE function, the expression ``forward`` uses, so the bits are the model's;
``dump`` checks that claim on every layer (the recomputed top-k must equal the one the model
returned).

Nothing here imports the indexshare C++ extension: torch and transformers only.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.nn.functional as F

# model_type -> (indexer RoPE function name in the modeling module, layout name, has sharing)
FAMILIES = {
    "glm_moe_dsa": ("apply_rotary_pos_emb_interleave", "interleave", True),
    "deepseek_v32": ("apply_rotary_pos_emb", "half", False),
}
# The two layouts, by the name of the modeling module's function that applies each.
_ROPE_FUNCTION = {"interleave": "apply_rotary_pos_emb_interleave", "half": "apply_rotary_pos_emb"}


class BridgeError(Exception):
    """A model, config or option the bridge cannot read (the message names what and why)."""


def family_of(config) -> str:
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise BridgeError(
            f"model_type {model_type!r} is not a DSA family this bridge reads (it reads {', '.join(sorted(FAMILIES))})"
        )
    return model_type


def indexer_rope_layout(config) -> str:
    return FAMILIES[family_of(config)][1]


def schedule_of(config) -> list[str]:
    """'F' or 'S' per model layer: GLM's ``indexer_types``, else every layer Full."""
    n = config.num_hidden_layers
    types = getattr(config, "indexer_types", None)
    if not FAMILIES[family_of(config)][2] or types is None:
        return ["F"] * n
    if len(types) < n:
        raise BridgeError(f"config.indexer_types has {len(types)} entries for {n} layers")
    out = []
    for i, t in enumerate(types[:n]):
        if t not in ("full", "shared"):
            raise BridgeError(f"config.indexer_types[{i}] is {t!r}, expected 'full' or 'shared'")
        out.append("F" if t == "full" else "S")
    if out and out[0] == "S":
        raise BridgeError("config.indexer_types[0] is 'shared': the first layer has no earlier Full layer to reuse")
    return out


def _rope_half(q, k, cos, sin, unsqueeze_dim=1):
    """Half-split RoPE (dim j pairs with j + R/2), transformers' ``apply_rotary_pos_emb``."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rope_interleave(q, k, cos, sin, unsqueeze_dim=1):
    """Interleaved RoPE (pairs 2j, 2j + 1), output [evens | odds]: ``apply_rotary_pos_emb_interleave``."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    q1, q2 = q[..., 0::2], q[..., 1::2]
    k1, k2 = k[..., 0::2], k[..., 1::2]
    return torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], -1), torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], -1)


def rope_function(module: torch.nn.Module, layout: str, own: bool = True):
    """The modeling module's own RoPE function for `layout` ('interleave' or 'half').

    own=False (a negative control asking for the other layout, which the family's modeling file
    may not define): the module's function when it has one, else this file's copy.
    """
    mod = sys.modules[type(module).__module__]
    name = _ROPE_FUNCTION[layout]
    fn = getattr(mod, name, None)
    if fn is None and not own:
        return {"half": _rope_half, "interleave": _rope_interleave}[layout]
    if fn is None:
        raise BridgeError(f"{mod.__name__} has no {name}: this transformers version is not one the bridge knows")
    return fn


def bind(module: torch.nn.Module, args, kwargs) -> dict:
    """The arguments of module.forward by name (hooks see them positional or by keyword)."""
    return inspect.signature(module.forward).bind(*args, **kwargs).arguments


@torch.no_grad()
def indexer_intermediates(indexer: torch.nn.Module, hidden_states, q_resid, position_embeddings, layout: str,
                          own: bool = True, attention_mask=None):
    """Recomputes what ``*Indexer.forward`` computes, for batch 1, no cache.

    Returns q [S, H, D] and k [S, D] (after RoPE, the model dtype), the model's per-head weights
    w [S, H] (f32, ``weights_proj(x).float() * H^-0.5``) and index_scores [S, S] (f32), each with
    the forward's own ops and shapes. attention_mask: the mask the forward received, applied as it
    applies it (a bool mask fills -inf; eager's float mask adds its finfo.min, so masked scores are
    finite there); None: the causal mask, -inf.
    """
    b, s, _ = hidden_states.shape
    if b != 1:
        raise BridgeError(f"batch {b}: the bridge dumps one sequence (batch 1)")
    cos, sin = position_embeddings
    H, D, R = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(b, s, H, D)
    q_rot, q_pass = torch.split(q, [R, D - R], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [R, D - R], dim=-1)
    q_rot, k_rot = rope_function(indexer, layout, own)(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale
    scores = F.relu(scores)
    w = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float() * (indexer.n_heads**-0.5)
    index_scores = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)
    if attention_mask is None:
        future = torch.ones(s, s, dtype=torch.bool, device=index_scores.device).triu(1)
        index_scores = index_scores.masked_fill(future, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        index_scores = index_scores.masked_fill(~attention_mask, float("-inf"))
    else:
        index_scores = index_scores + attention_mask
    return q[0], k[0], w[0], index_scores[0]


@torch.no_grad()
def mla_absorbed(attn: torch.nn.Module, hidden_states, position_embeddings):
    """The absorbed (MQA) form of ``*Attention.forward``'s query and key, batch 1.

    HF runs dense, non-absorbed MLA: kv_b_proj expands the normalised latent c [S, r] into
    per-head k_nope = c W_uk[h]^T and v = c W_uv[h]^T. The logits q_nope[h] . k_nope[h] + q_rot .
    k_rot equal q_abs[h] . c + q_rot . k_rot with q_abs[h] = q_nope[h] W_uk[h] (the absorption),
    so the kernel-level inputs are q = [q_abs | q_rot] [S, h, r + R] and kv = [c | k_rot]
    [S, 1, r + R]; the value is the first r columns of kv (d_v = r), the latent output.
    q_abs is computed in f32 from the model-dtype q_nope and W_uk and rounded once.
    """
    b, s, _ = hidden_states.shape
    h, nope, rope, r, dv = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.kv_lora_rank, attn.v_head_dim
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
    q_states = attn.q_b_proj(q_resid).view(b, s, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q_states, [nope, rope], dim=-1)
    compressed = attn.kv_a_proj_with_mqa(hidden_states)
    kv_pass, k_rot = torch.split(compressed, [r, rope], dim=-1)
    k_pass = attn.kv_a_layernorm(kv_pass).view(b, 1, s, r)
    k_rot = k_rot.view(b, 1, s, rope)
    cos, sin = position_embeddings
    q_rot, k_rot = rope_function(attn, "interleave")(q_rot, k_rot, cos, sin)
    w = attn.kv_b_proj.weight.view(h, nope + dv, r)
    w_uk = w[:, :nope, :]  # [h, nope, r]
    q_abs = torch.einsum("bhsn,hnr->bshr", q_pass.float(), w_uk.float()).to(q_pass.dtype)
    q = torch.cat([q_abs, q_rot.transpose(1, 2)], dim=-1)[0]  # [S, h, r + R]
    kv = torch.cat([k_pass, k_rot], dim=-1)[0].transpose(0, 1)  # [S, 1, r + R]
    return q, kv


@torch.no_grad()
def model_attention(attn: torch.nn.Module, hidden_states, context) -> dict:
    """The model's own attention output and what ``diff`` needs to judge it, batch 1.

    context: o_proj's input [1, S, h * v_head_dim] (eager or sdpa over the top-k mask, model dtype).
    Returns ``attn.model_out`` [S, h, v_head_dim] (that context per head), ``attn.w_uv``
    [h, v_head_dim, r] and ``attn.w_uk`` [h, nope, r] (``kv_b_proj.weight`` viewed [h, nope + v, r],
    split: v = c W_uv[h]^T and k_nope = c W_uk[h]^T of the normalised latent c), and ``attn.q_nope``
    [S, h, nope] (the model's q before absorption): all in the model dtype, bits as the model has them.
    diff maps the golden's latent output through W_uv and bounds the model's rounding with W_uk and
    q_nope (tools/python/README.md, "The model's own attention").
    """
    b, s, _ = hidden_states.shape
    h, nope, rope, r, dv = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.kv_lora_rank, attn.v_head_dim
    if tuple(context.shape) != (b, s, h * dv):
        raise BridgeError(f"o_proj input has shape {list(context.shape)}, expected {[b, s, h * dv]}")
    w = attn.kv_b_proj.weight.view(h, nope + dv, r)
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
    q_states = attn.q_b_proj(q_resid).view(b, s, h, nope + rope)
    return {
        "attn.model_out": context[0].reshape(s, h, dv),
        "attn.w_uv": w[:, nope:, :],
        "attn.w_uk": w[:, :nope, :],
        "attn.q_nope": q_states[0, :, :, :nope],
    }


def softmax_scale(attn: torch.nn.Module) -> float:
    """The attention's own scaling (qk_head_dim^-0.5, times mscale^2 under YaRN)."""
    return float(attn.scaling)


def to_golden_topk(topk: torch.Tensor, k: int) -> torch.Tensor:
    """HF's raw top-k [S, min(k, T)] -> the golden convention [S, k] (I32).

    Row t sees keys [0, t]; HF's ``topk`` fills the slots of a row with fewer than k visible keys
    with masked (future) positions. Those become -1, as the GPU stacks write them; the valid
    positions keep their order, the -1 slots trail, and a row is padded with -1 up to k when
    index_topk exceeded the sequence (HF then takes only T slots).
    """
    topk = topk.to(torch.int64).cpu()
    s, n = topk.shape
    t = torch.arange(s).unsqueeze(1)
    valid = topk <= t
    out = torch.full((s, k), -1, dtype=torch.int32)
    for row in range(s):
        v = topk[row][valid[row]]
        out[row, : v.numel()] = v.to(torch.int32)
    return out
