"""The module level of a DSA layer, step by step: the indexer (projections, k LayerNorm, RoPE,
Hadamard rotation, FP8 act_quant, head weights) and MLA in the absorbed form, from a layer input x to
the kernel-level tensors that :mod:`indexshare.kernels` takes (ref/module.h, ref/module_ops.h,
ref/numerics.h specify every step; a ``model=`` golden set stores each intermediate under
``layers.{l}.indexer.*`` / ``mla.*``).

Values: the module functions carry bf16 values in f32 (as ref/ does). Activations and weights may be
given as float32 (taken as they are: their values should be bf16 values, as the checkpoint's are) or
bfloat16 (widened to f32, exactly; a copy). Outputs documented as "bf16 values" are f32 arrays whose
every element is a bf16 number (``.astype(ml_dtypes.bfloat16)`` is exact). A contiguous f32 input
reaches C++ without a copy (weights are copied into the weight structs, activations are not).
``model``: a model preset (``deepseek-v3.2``, ``glm-5``, ``glm-5.2``, ``tiny-deepseek``, ``tiny-glm``;
:func:`model_config` prints its fields). ``impl``: "ref" or "simd" (the projections vectorized; the
same bits). numpy or torch CPU in, the same framework out.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _arrays as A
from ._core_loader import core
from .kernels import _impl

F32, I64 = np.float32, np.int64
INDEXER_WEIGHTS = ("wq_b", "wk", "k_norm_w", "k_norm_b", "weights_proj")
MLA_WEIGHTS = ("wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo")


def _f32(x, name: str, rank: int | None = None, dims: str = "") -> np.ndarray:
    """x as a C-contiguous float32 array (bf16 widened exactly; f32 as it is)."""
    a = A.to_numpy(x, name)
    if a.dtype not in (np.dtype(F32), A.BF16):
        raise TypeError(f"{name}: expected dtype float32 or bfloat16, got {A.dtype_name(a.dtype)}")
    if rank is not None and a.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} [{dims}], got shape {list(a.shape)}")
    if a.ndim == 0:
        raise ValueError(f"{name}: expected an array, got a scalar")
    return np.ascontiguousarray(a.astype(F32) if a.dtype == A.BF16 else a)


def _weights(weights, names, what: str) -> list:
    """The weights named `names` from a mapping (checkpoint names, e.g. "wq_b"), in that order."""
    try:
        missing = [n for n in names if n not in weights]
    except TypeError:
        raise TypeError(f"{what}: expected a mapping name -> array ({', '.join(names)})") from None
    if missing:
        raise ValueError(f"{what}: missing {', '.join(missing)} (expected {', '.join(names)})")
    return [_f32(weights[n], f"{what}[{n!r}]") for n in names]


def _torch(*xs) -> bool:
    return A.wants_torch(*xs)


def weights_of(golden, layer: int, part: str) -> dict:
    """A layer's weights from a module-level golden set (``golden(model=...)`` or ``load_golden``):
    part "indexer" (wq_b, wk, k_norm_w, k_norm_b, weights_proj; Full layers) or "mla" (wq_a,
    q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo), as name -> array (bf16), for the functions below."""
    names = {"indexer": INDEXER_WEIGHTS, "mla": MLA_WEIGHTS}.get(part)
    if names is None:
        raise ValueError(f"part: expected 'indexer' or 'mla', got {part!r}")
    t = golden.tensors
    key = f"layers.{int(layer)}.{part}."
    missing = [n for n in names if key + n not in t]
    if missing:
        raise ValueError(f"weights_of: the set has no {key}{missing[0]} (a model= set's layer with {part} weights?)")
    return {n: t[key + n] for n in names}


def model_config(model: str) -> dict:
    """The fields of a model preset (ref/config.h ``model_preset``): dim, n_heads, q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, index_n_heads (H), index_head_dim
    (D), index_topk, indexer_rope ("half_split" / "interleaved"), index_scale_rule, rope_theta, yarn,
    rms_eps, index_norm_eps, d_qk, d_v, softmax_scale, seq."""
    return dict(core().model_config(str(model)))


# ---- steps (ref/module_ops.h, ref/numerics.h) ----------------------------------------------------

def rope_inv_freq(rope_dim: int | None = None, theta: float | None = None, *, model: str | None = None):
    """RoPE inverse frequencies f32 [rope_dim / 2] (ref/module_ops.h): ``rope_inv_freq(rope_dim, theta)``
    = 1 / theta^(2i / rope_dim), or ``rope_inv_freq(model=NAME)``: the model's (qk_rope_head_dim, its
    theta, YaRN-corrected when the model uses YaRN: DeepSeek-V3.2)."""
    if model is not None:
        if rope_dim is not None or theta is not None:
            raise ValueError("rope_inv_freq: give rope_dim and theta, or model=, not both")
        return core().model_rope_inv_freq(str(model))
    if rope_dim is None or theta is None:
        raise ValueError("rope_inv_freq: give rope_dim and theta, or model=")
    return core().rope_inv_freq(int(rope_dim), float(theta))


def apply_rope(x, positions, inv_freq, layout: str):
    """RoPE (ref/module_ops.h ``apply_rope``): x f32 [S, ..., rope_dim] (the rope slice only: the
    indexer's is the FIRST qk_rope_head_dim dims of a head, MLA's the last), each row t rotated for
    position ``positions[t]`` (an int64 [S] array, or an int p: positions p, p + 1, ...);
    inv_freq f32 [rope_dim / 2] (:func:`rope_inv_freq`); layout "half_split" (pairs (j, j + rope_dim/2):
    the DeepSeek-V3.2 indexer) or "interleaved" (pairs (2j, 2j+1): MLA, the GLM-5 indexer). Per pair:
    angle = f32(pos) * inv_freq[j]; a' = a cos - b sin, b' = a sin + b cos in f32, no FMA. Returns
    f32 of x's shape (not rounded: the module rounds it to bf16 next)."""
    a = _f32(x, "x")
    if a.ndim < 2:
        raise ValueError(f"x: expected rank >= 2 [S, ..., rope_dim], got shape {list(a.shape)}")
    S = a.shape[0]
    if isinstance(positions, (int, np.integer)):
        pos = np.arange(int(positions), int(positions) + S, dtype=I64)
    else:
        pos = np.ascontiguousarray(A.to_numpy(positions, "positions")).astype(I64)
        if pos.shape != (S,):
            raise ValueError(f"positions: expected shape [{S}] (one per row of x), got {list(pos.shape)}")
    f = A.arg(inv_freq, "inv_freq", [F32], 1, "rope_dim / 2")
    r = core().apply_rope(a.reshape(S, -1, a.shape[-1]), pos, f, layout).reshape(a.shape)
    return A.out(r, _torch(x, positions, inv_freq))


def hadamard_transform(x):
    """The Hadamard rotation (ref/module_ops.h; DeepSeek's ``rotate_activation`` before its bf16
    rounding) over the last dim n (a power of two) of x f32: out = (x H_n) * f32(n^-0.5), H_n the
    Sylvester matrix, by the f32 butterfly of the header. Returns f32 of x's shape."""
    return A.out(core().hadamard_transform(_f32(x, "x")), _torch(x))


def layer_norm(x, weight=None, bias=None, eps: float = 1e-6):
    """LayerNorm over the last dim of x f32 (ref/module_ops.h): two passes in double, biased variance,
    y = f32((x - mean) / sqrt(var + eps) * w + b); weight / bias f32 [n] or None (1 / 0). Returns f32
    (the indexer's k_norm is this rounded to bf16)."""
    w = None if weight is None else _f32(weight, "weight", 1, "n")
    b = None if bias is None else _f32(bias, "bias", 1, "n")
    return A.out(core().layer_norm(_f32(x, "x"), w, b, float(eps)), _torch(x, weight, bias))


def rms_norm(x, weight=None, eps: float = 1e-6):
    """RMSNorm over the last dim of x f32 (ref/module_ops.h): ms = sum x^2 / n in double,
    y = f32(x / sqrt(ms + eps) * w); weight f32 [n] or None. Returns f32."""
    w = None if weight is None else _f32(weight, "weight", 1, "n")
    return A.out(core().rms_norm(_f32(x, "x"), w, float(eps)), _torch(x, weight))


def linear(x, w, *, round_bf16: bool = False, impl: str = "simd"):
    """y = x W^T (ref/module_ops.h ``linear``; torch nn.Linear layout): x f32 [rows, in], w f32
    [out, in]; y[r, o] = f32(sum_k ascending double(x[r, k]) * double(w[o, k])), exact products, one
    rounding. ``round_bf16=True``: then rounded to bf16 values (``linear_bf16``: every projection of
    the module). Returns f32 [rows, out]."""
    r = core().linear(_f32(x, "x", 2, "rows, in"), _f32(w, "w", 2, "out, in"), bool(round_bf16), _impl(impl))
    return A.out(r, _torch(x, w))


def quantize(x, block: int, rule: str):
    """FP8 block quantization (ref/numerics.h ``quantize``; DeepSeek's ``act_quant``): one scale per
    ``block`` consecutive values of the last dim, rule "deepseek_ue8m0", "flashmla_pow2" or
    "fp32_amax" (the header gives each formula); code = e4m3(clamp(x / s, -448, 448)). x f32 of any
    rank. Returns (codes float8_e4m3fn of x's shape, scales f32 [..., ceil(last / block)])."""
    codes, scales = core().quantize(_f32(x, "x"), int(block), str(rule))
    t = _torch(x)
    return A.out(codes, t, A.E4M3), A.out(scales, t)


def dequantize(codes, scales, block: int):
    """The inverse of :func:`quantize`: value = e4m3_to_f32(code) * scale in f32 (ref/numerics.h).
    codes float8_e4m3fn, scales f32 [..., ceil(last / block)]. Returns f32 of codes' shape."""
    c = A.to_numpy(codes, "codes")
    if c.dtype != A.E4M3:
        raise TypeError(f"codes: expected dtype float8_e4m3fn, got {A.dtype_name(c.dtype)}")
    s = A.to_numpy(scales, "scales")
    if s.dtype != np.dtype(F32):
        raise TypeError(f"scales: expected dtype float32, got {A.dtype_name(s.dtype)}")
    r = core().dequantize(np.ascontiguousarray(c).view(np.uint8), np.ascontiguousarray(s), int(block))
    return A.out(r, _torch(codes, scales))


# ---- the indexer and MLA of one layer (ref/module.h) --------------------------------------------

def indexer_module(model: str, weights, x, qr, *, start_pos: int = 0, variant: str = "deepseek_fp8",
                   impl: str = "simd") -> dict:
    """The indexer of one Full layer for the rows of x (ref/module.h ``indexer_module``; positions
    start_pos + t): x [S, dim] (the layer input after attn_norm) and qr [S, q_lora] (MLA's
    RMSNorm(wq_a x), :func:`mla_query`), bf16 values; weights: a mapping with wq_b [H*D, q_lora],
    wk [D, dim], k_norm_w [D], k_norm_b [D], weights_proj [H, dim] (:func:`weights_of`). variant
    "deepseek_fp8" (Hadamard + FP8, DeepGEMM's inputs) or "hf_bf16" (the HF transformers indexer).
    Returns a dict of every intermediate, named as a model= golden set's ``layers.{l}.indexer.*``:
    q_proj, q_rope, q_hadamard [S, H, D], k_proj, k_norm, k_rope, k_hadamard [S, D] (bf16 values;
    the Hadamard ones deepseek_fp8 only), q8 [S, H, D] / k8 [S, D] float8_e4m3fn codes (deepseek_fp8:
    the kernel's q and k), q_scale [S, H], k_scale [S], weights [S, H] f32 (all scales folded in:
    the kernel's weights), q [S, H, D], k [S, D] (f32: hf_bf16's kernel inputs)."""
    w = _weights(weights, INDEXER_WEIGHTS, "weights")
    d = core().indexer_module(str(model), w, _f32(x, "x", 2, "S, dim"), _f32(qr, "qr", 2, "S, q_lora"), int(start_pos),
                              str(variant), _impl(impl))
    t = _torch(x, qr, *dict(weights).values())
    return {n: A.out(v, t, A.E4M3 if n in ("q8", "k8") else None) for n, v in d.items()}


class MlaQuery(NamedTuple):
    """Outputs of :func:`mla_query` (ref/module.h ``MlaQuery``)."""
    qr: object      # [S, q_lora] bf16 values: RMSNorm(wq_a x), shared with the indexer
    q_nope: object  # [S, n_heads, nope] bf16 values: the nope slice before absorption
    q: object       # bf16 [S, n_heads, kv_lora + rope]: [q_abs | q_pe], sparse_attention's q


def _mla(weights):
    return _weights(weights, MLA_WEIGHTS, "weights")


def mla_query(model: str, weights, x, *, start_pos: int = 0, impl: str = "simd") -> MlaQuery:
    """MLA's queries in the absorbed form for the rows of x [S, dim] (ref/module.h ``mla_query``):
    qr = bf16(RMSNorm(linear_bf16(x, wq_a))); [q_nope | q_pe] = linear_bf16(qr, wq_b); q_pe rotated
    (interleaved RoPE, positions start_pos + t); q_abs = q_nope absorbed through W_uk (from wkv_b,
    double sums, then bf16). weights: a mapping with wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo
    (:func:`weights_of`). Returns :class:`MlaQuery` (qr, q_nope, q)."""
    w = _mla(weights)
    qr, q_nope, q = core().mla_query(str(model), w, _f32(x, "x", 2, "S, dim"), int(start_pos), _impl(impl))
    t = _torch(x, *dict(weights).values())
    return MlaQuery(A.out(qr, t), A.out(q_nope, t), A.out(q, t, A.BF16))


def mla_kv(model: str, weights, x, *, start_pos: int = 0, fp8_roundtrip: bool = False, impl: str = "simd"):
    """The absorbed MQA key/value rows of x [S, dim] (ref/module.h ``mla_kv``): [latent | k_pe] with
    latent = bf16(RMSNorm(kv[:kv_lora], kv_norm)) of kv = linear_bf16(x, wkv_a) and k_pe its rope
    slice rotated (interleaved, positions start_pos + t); ``fp8_roundtrip``: the latent through FP8
    and back (DeepSeek's FP8 KV cache). Returns bf16 [S, 1, kv_lora + rope]: sparse_attention's kv."""
    r = core().mla_kv(str(model), _mla(weights), _f32(x, "x", 2, "S, dim"), int(start_pos), bool(fp8_roundtrip),
                      _impl(impl))
    return A.out(r, _torch(x, *dict(weights).values()), A.BF16)


def mla_value_up(model: str, weights, o_lat, *, impl: str = "simd"):
    """The value up-projection (ref/module.h ``mla_value_up``): o_lat f32 [S, n_heads, kv_lora] (the
    attention's ``out``) -> [S, n_heads, v] bf16 values, o[t,h,j] = bf16(f32(sum_c bf16(o_lat[t,h,c])
    * W_uv[h][j][c])) in double, W_uv from wkv_b."""
    r = core().mla_value_up(str(model), _mla(weights), _f32(o_lat, "o_lat", 3, "S, n_heads, kv_lora"), _impl(impl))
    return A.out(r, _torch(o_lat, *dict(weights).values()))


def mla_output(model: str, weights, o_lat, *, impl: str = "simd"):
    """The layer's attention output (ref/module.h ``mla_output``): linear_bf16(mla_value_up(o_lat)
    viewed [S, n_heads * v], wo) -> [S, dim] bf16 values (a model= set's ``layers.{l}.out``)."""
    r = core().mla_output(str(model), _mla(weights), _f32(o_lat, "o_lat", 3, "S, n_heads, kv_lora"), _impl(impl))
    return A.out(r, _torch(o_lat, *dict(weights).values()))
