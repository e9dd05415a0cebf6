"""The kernels on arbitrary inputs, with the bits of the CLI (ref/ specifies them; simd/ returns the same).

Arrays: numpy (bf16 and e4m3 as ``ml_dtypes.bfloat16`` / ``ml_dtypes.float8_e4m3fn``) or torch CPU
tensors (``torch.bfloat16``, ``torch.float8_e4m3fn``); results come back in the framework of the
inputs (torch if any input is a torch tensor). A C-contiguous input is read by C++ in place, without a
copy (ref/tensor.h BorrowedTensor); a non-contiguous one is copied once first. ``impl``: "ref" (the
readable scalar specification)
or "simd" (Highway + OpenMP, bit-identical). The GIL is released while C++ computes; the OpenMP
thread count is :func:`set_num_threads` (it never changes a bit). A CUDA tensor, a wrong dtype or rank
raises TypeError / ValueError naming the argument; a shape that does not fit the others raises
ValueError with ref/'s message naming the tensor. :func:`topk` (a short kernel, where a call's fixed
cost shows) hands arrays that need no checking or conversion straight to C++ (its fast path).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _arrays as A
from ._core_loader import core

F32, I32 = np.float32, np.int32


def _impl(impl: str):
    """The extension's Impl for "ref" or "simd" (C++ takes the path as that value; tools/lib/impl.h)."""
    if impl not in ("ref", "simd"):
        raise ValueError(f"impl: expected 'ref' or 'simd', got {impl!r}")
    return core().Impl[impl]


def set_num_threads(n: int) -> None:
    """OpenMP threads of the simd kernels called from this thread (results do not depend on it)."""
    core().set_num_threads(int(n))


def get_num_threads() -> int:
    return core().get_num_threads()


def indexer_logits(q, k, k_scale, weights, ks, ke, *, impl: str = "simd"):
    """The indexer's logits (ref/indexer.h; DeepGEMM ``fp8_mqa_logits``):

        logits[t, s] = k_scale[s] * sum_h weights[t, h] * ReLU(q[t, h, :] . k[s, :])   ks[t] <= s < ke[t]
        logits[t, s] = -inf                                                            otherwise

    q [s_q, H, D] and k [s_kv, D]: float8_e4m3fn (FP8 mode, exact) or float32 (the unquantized HF
    mode; bf16 values widened); k_scale [s_kv] f32; weights [s_q, H] f32 (the q scale, D^-0.5 and
    H^-0.5 folded in); ks, ke [s_q] int32 (half-open key window of each row). Returns f32 [s_q, s_kv].
    """
    qa = A.arg(q, "q", [A.E4M3, F32], 3, "s_q, H, D")
    fp8 = qa.dtype == np.uint8
    ka = A.arg(k, "k", [A.E4M3] if fp8 else [F32], 2, "s_kv, D")
    args = (qa, ka, A.arg(k_scale, "k_scale", [F32], 1, "s_kv"), A.arg(weights, "weights", [F32], 2, "s_q, H"),
            A.arg(ks, "ks", [I32], 1, "s_q"), A.arg(ke, "ke", [I32], 1, "s_q"), _impl(impl))
    r = core().indexer_logits_fp8(*args) if fp8 else core().indexer_logits_f32(*args)
    return A.out(r, A.wants_torch(q, k, k_scale, weights, ks, ke))


def fp4_quantize(x, rule: str = "toward-zero"):
    """The FP4 indexer's quantizer (ref/fp4.h; DeepGEMM ``fp8_fp4_mqa_logits``): x [..., D] f32 (D a
    multiple of 32) -> (codes uint8 [..., D/2], the even element in the low nibble; ue8m0 scale bytes
    uint8 [..., D/32], one per 32 values). rule: "toward-zero" (DeepGEMM's quantizer), "nearest-even"
    (transformers' and cvt.rn, the sign of zero kept as code 0x8) or "aiter" (ties toward -inf)."""
    xa = A.to_numpy(x, "x")
    codes, scales = core().fp4_quantize(A.arg(xa, "x", [F32], max(xa.ndim, 1), "..., D"), str(rule))
    return codes, scales


def fp4_logits(q_codes, q_scales, k_codes, k_scales, weights, ks, ke, *, logits: str = "f32", impl: str = "simd"):
    """The FP4 indexer's logits (ref/fp4.h): sum_h weights[t, h] * ReLU(dq(q)[t, h] . dq(k)[s]) over each
    row's window [ks, ke), -inf elsewhere; the weights carry only D^-1/2 H^-1/2 (the kernel applies both
    scales). q: codes [s_q, H, D/2] and scales [s_q, H, D/32] (uint8); k: [s_kv, D/2] and [s_kv, D/32];
    logits "f32" or "bf16" (rounded once; returned widened to f32)."""
    if logits not in ("f32", "bf16"):
        raise ValueError(f"fp4_logits: logits must be 'f32' or 'bf16', got {logits!r}")
    U8 = np.dtype(np.uint8)
    args = (A.arg(q_codes, "q_codes", [U8], 3, "s_q, H, D/2"), A.arg(q_scales, "q_scales", [U8], 3, "s_q, H, D/32"),
            A.arg(k_codes, "k_codes", [U8], 2, "s_kv, D/2"), A.arg(k_scales, "k_scales", [U8], 2, "s_kv, D/32"),
            A.arg(weights, "weights", [F32], 2, "s_q, H"), A.arg(ks, "ks", [I32], 1, "s_q"), A.arg(ke, "ke", [I32], 1, "s_q"),
            logits == "bf16", _impl(impl))
    return core().fp4_logits(*args)


def topk(logits, ks, ke, k: int, *, impl: str = "simd"):
    """Top-k per query row (ref/topk.h): among the columns [ks[t], ke[t]) the min(k, ke - ks) best by
    (score descending, index ascending), as sequence-local positions s - ks[t], -1 padded.
    logits f32 [s_q, s_kv]; ks, ke int32 [s_q]. Returns int32 [s_q, k]."""
    # Fast path for the common call (C-contiguous CPU arrays of the right dtypes and ranks, all numpy or all
    # torch): the caller's arrays go to C++ as they are, whose typed arguments check them without converting
    # (torch tensors through DLPack's C exchange API, the result back the same way). Whatever they refuse
    # (TypeError) takes the checked path below, whose errors name the argument. Same kernel, same bits;
    # only less Python runs, and after a 2 ms kernel it runs with cold caches (bench_overhead.py).
    if impl in ("ref", "simd"):
        fast = A.fast_kind(logits, ks, ke)
        if fast is not None:
            try:
                return (core().topk if fast == "numpy" else core().topk_torch)(logits, ks, ke, int(k), _impl(impl))
            except TypeError:
                pass
    r = core().topk(A.arg(logits, "logits", [F32], 2, "s_q, s_kv"), A.arg(ks, "ks", [I32], 1, "s_q"),
                    A.arg(ke, "ke", [I32], 1, "s_q"), int(k), _impl(impl))
    return A.out(r, A.wants_torch(logits, ks, ke))


def indexer_topk(q, k, k_scale, weights, ks, ke, topk: int, *, impl: str = "simd"):
    """``topk(indexer_logits(q, k, k_scale, weights, ks, ke), ks, ke, topk)`` (ref/indexer.h, ref/topk.h).
    FP8 mode with impl="simd" streams (simd/simd.h ``indexer_topk_fp8``: the [s_q, s_kv] logits are
    never held); the same positions either way. Returns int32 [s_q, topk]."""
    qa = A.arg(q, "q", [A.E4M3, F32], 3, "s_q, H, D")
    if qa.dtype == np.uint8:
        r = core().indexer_topk_fp8(qa, A.arg(k, "k", [A.E4M3], 2, "s_kv, D"),
                                    A.arg(k_scale, "k_scale", [F32], 1, "s_kv"),
                                    A.arg(weights, "weights", [F32], 2, "s_q, H"), A.arg(ks, "ks", [I32], 1, "s_q"),
                                    A.arg(ke, "ke", [I32], 1, "s_q"), int(topk), _impl(impl))
        return A.out(r, A.wants_torch(q, k, k_scale, weights, ks, ke))
    return globals()["topk"](indexer_logits(q, k, k_scale, weights, ks, ke, impl=impl), ks, ke, topk, impl=impl)


class Attention(NamedTuple):
    """Outputs of the attention kernels (ref/attention.h)."""
    out: object         # f32 [s_q, h_q, d_v], from double math rounded once
    out_bf16: object    # bf16 [s_q, h_q, d_v] = bf16(out), round to nearest even
    max_logits: object  # f32 [s_q, h_q]
    lse: object         # f32 [s_q, h_q], natural log, without the sink


def _attention(r, torch: bool) -> Attention:
    out, out_bf16, max_logits, lse = r
    return Attention(A.out(out, torch), A.out(out_bf16, torch, A.BF16), A.out(max_logits, torch), A.out(lse, torch))


def sparse_attention(q, kv, indices, sm_scale: float, d_v: int = 512, *, topk_length=None, sink=None,
                     impl: str = "simd") -> Attention:
    """Sparse attention with FlashMLA ``flash_mla_sparse_fwd`` semantics (ref/attention.h).

    q bf16 [s_q, h_q, d_qk]; kv bf16 [s_kv, 1, d_qk] (V = kv[:, 0, :d_v]); indices int32
    [s_q, 1, topk] (rows of kv; any index outside [0, s_kv) is ignored); topk_length int32 [s_q]
    (row t uses its first topk_length[t] slots); sink f32 [h_q] (out *= 1 / (1 + exp(sink - lse))).
    P = (q . kv) * sm_scale; max_logits = max P; lse = ln sum exp P (natural log, without the sink);
    out = softmax(P) . V; an empty row gives out 0, lse +inf, max_logits -inf. Returns
    :class:`Attention` (out, out_bf16, max_logits, lse).
    """
    r = core().sparse_attention(A.arg(q, "q", [A.BF16], 3, "s_q, h_q, d_qk"), A.arg(kv, "kv", [A.BF16], 3, "s_kv, 1, d_qk"),
                                A.arg(indices, "indices", [I32], 3, "s_q, 1, topk"), float(sm_scale), int(d_v),
                                A.optional_arg(topk_length, "topk_length", [I32], 1, "s_q"),
                                A.optional_arg(sink, "sink", [F32], 1, "h_q"), _impl(impl))
    return _attention(r, A.wants_torch(q, kv, indices, topk_length, sink))


def dense_attention(q, kv, sm_scale: float, d_v: int, ks, ke, *, sink=None, impl: str = "simd") -> Attention:
    """Dense attention (ref/attention.h): row t attends to every kv row in [ks[t], ke[t]), with the
    outputs and rules of :func:`sparse_attention` (equal to it bit for bit when every key is selected).
    q bf16 [s_q, h_q, d_qk]; kv bf16 [s_kv, 1, d_qk]; ks, ke int32 [s_q]; sink f32 [h_q]."""
    r = core().dense_attention(A.arg(q, "q", [A.BF16], 3, "s_q, h_q, d_qk"), A.arg(kv, "kv", [A.BF16], 3, "s_kv, 1, d_qk"),
                               float(sm_scale), int(d_v), A.arg(ks, "ks", [I32], 1, "s_q"), A.arg(ke, "ke", [I32], 1, "s_q"),
                               A.optional_arg(sink, "sink", [F32], 1, "h_q"), _impl(impl))
    return _attention(r, A.wants_torch(q, kv, ks, ke, sink))


class AttentionBackward(NamedTuple):
    """Outputs of :func:`sparse_attention_backward` (ref/train/attention_bwd.h)."""
    lse: object       # f32 [s_q, h_q], the forward's lse (natural log, without the sink)
    delta: object     # f32 [s_q, h_q], sum_i P_i dP_i (= sum_c O_c dO_c from the exact O)
    p: object         # f32 [s_q, h_q, topk], P of each slot with the sink folded in (0 on ignored slots)
    ds: object        # f32 [s_q, h_q, topk], dS = P (dP - delta), w.r.t. the scaled logit
    dq: object        # f32 [s_q, h_q, d_qk]
    dq_bf16: object   # bf16 [s_q, h_q, d_qk]
    dkv: object       # f32 [s_kv, 1, d_qk]: the K part on every column, plus the V part on the first d_v
    dkv_bf16: object  # bf16 [s_kv, 1, d_qk]
    d_sink: object    # f32 [h_q] with a sink, else [0]


def sparse_attention_backward(q, kv, indices, sm_scale: float, d_v: int, d_out, *, topk_length=None, sink=None,
                              impl: str = "simd", lowp: bool = False) -> AttentionBackward:
    """The gradients of :func:`sparse_attention` (ref/train/attention_bwd.h) for the upstream gradient
    d_out bf16 [s_q, h_q, d_v]; the forward's arguments and rules (-1 and out-of-range indices ignored,
    a duplicate counts once per occurrence, empty rows give zero gradients). Exact (double, each output
    rounded once); ``lowp=True``: the TileLang-like low-precision emulation instead (ref only)."""
    r = core().sparse_attention_backward(
        A.arg(q, "q", [A.BF16], 3, "s_q, h_q, d_qk"), A.arg(kv, "kv", [A.BF16], 3, "s_kv, 1, d_qk"),
        A.arg(indices, "indices", [I32], 3, "s_q, 1, topk"), float(sm_scale), int(d_v),
        A.arg(d_out, "d_out", [A.BF16], 3, "s_q, h_q, d_v"), A.optional_arg(topk_length, "topk_length", [I32], 1, "s_q"),
        A.optional_arg(sink, "sink", [F32], 1, "h_q"), _impl(impl), bool(lowp))
    torch = A.wants_torch(q, kv, indices, d_out, topk_length, sink)
    return AttentionBackward(*(A.out(x, torch, A.BF16 if i in (5, 7) else None) for i, x in enumerate(r)))


def run_stack(problem, *, inputs=None, rows=None, impl: str = "auto", keep_logits: bool = False,
              framework: str | None = None) -> list[dict]:
    """A stack of DSA layers with cross-layer index sharing (ref/stack.h): per layer, Full layers run
    the indexer and top-k, Shared layers reuse the positions of the previous Full layer, and every
    layer runs its own sparse attention over them.

    problem  a descriptor (ref/problem.h); its inputs are generated (``indexshare run``), or
    inputs   a dict (or a golden set's ``.tensors``) of per-layer kernel inputs under the golden tensor
             names, layers.{l}.indexer.{q,k,k_scale,weights,ks,ke} and layers.{l}.attn.{q,kv[,sink]}:
             their shapes replace the problem's (top-k, d_v, sm and sched= come from the problem);
             they are copied (read as a golden set's tensors are), unlike the kernels' arguments
    rows     sampled query rows (generated inputs only), e.g. "last:2,0,16-18"
    impl     "ref", "simd" or "auto" (the same bits)
    Returns one dict per layer: layer, kind ("full" / "shared"), source, problem, used_topk int32
    [s_q, topk], own_topk (Full layers, and Shared ones with indexer inputs), indices int32
    [s_q, 1, topk], out, out_bf16, max_logits, lse, and logits f32 [s_q, s_kv] with keep_logits.
    ``framework``: "numpy" or "torch" (default: torch when inputs are torch tensors).
    """
    raws = None
    torch = framework == "torch"
    if inputs is not None:
        torch = torch or (framework is None and A.wants_torch(*inputs.values()))
        raws = [A.to_raw(str(n), v) for n, v in inputs.items()]
    from ._golden import Problem
    canonical, layers = core().run_stack(str(Problem(problem)), None if rows is None else str(rows) if isinstance(rows, str)
                                         else ",".join(str(int(r)) for r in rows), raws, impl, bool(keep_logits))
    result = []
    for d in layers:
        d = dict(d)
        for key, v in list(d.items()):
            if isinstance(v, np.ndarray):
                d[key] = A.out(v, torch, A.BF16 if key == "out_bf16" else None)
        d["problem"] = canonical
        result.append(d)
    return result
