"""The training side: the indexer's distillation loss and the sparse attention backward, exact, on numpy
or torch CPU arrays, and pytest helpers that judge a torch training kernel against a training golden set.

    import indexshare, indexshare.train as T
    g = indexshare.golden(problem="sq64 skv64 hq16 dqk576 dv512 ih8 id128 k32 indexer=bf16 nl2 sched=FS",
                          kind="train", framework="torch")
    T.assert_attention_backward(MySparseMLA.apply, g)        # q.grad, kv.grad (and sink.grad) vs the golden
    T.assert_indexer_loss_backward(my_indexer_loss, g)       # loss, q.grad, k.grad, weights.grad

The exact values are the specification's (ref/train/indexer_loss.h, ref/train/attention_bwd.h): double
arithmetic in a fixed order, each output rounded to f32 once; ``impl="simd"`` gives the same bits faster.
The helpers run the caller's function on the golden set's inputs, backpropagate the set's own upstream
gradient, and hand the gradients to :func:`indexshare.diff` (the CLI's judge: per-element bounds for a kernel
with bf16 P and dS and f32 accumulation, structure tests, and the usual backward bugs named).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from . import _arrays as A
from ._core_loader import core
from ._diff import Report
from ._golden import _renamed
from .kernels import AttentionBackward, _impl, sparse_attention_backward
from .testing import assert_matches

F32, I32 = np.float32, np.int32

__all__ = ["Teacher", "IndexerLoss", "indexer_loss", "AttentionBackward", "sparse_attention_backward",
           "attention_backward_candidate", "assert_attention_backward", "indexer_loss_candidate",
           "assert_indexer_loss_backward"]


class Teacher(NamedTuple):
    """One layer whose main attention teaches the indexer: q bf16 [s_q, h_q, d_qk], kv bf16
    [s_kv, 1, d_qk] (or [s_kv, d_qk]), its softmax scale, and optionally non_compressed_lse f32
    [s_q, h_q] (the mass outside the selected keys, V4's window and sink)."""
    q: object
    kv: object
    sm_scale: float
    lse: object = None


class IndexerLoss(NamedTuple):
    """Outputs of :func:`indexer_loss` (ref/train/indexer_loss.h)."""
    scores: object    # f32 [s_q, s_kv]  the student's scores I (-inf off the window)
    p: object         # f32 [s_q, s_kv]  the target distribution, 0 off the support
    log_q: object     # f32 [s_q, s_kv]  log_softmax(I) over the support, 0 off it
    kl: object        # f32 [s_q]        per-row KL(p || q)
    loss: float       # loss_coeff * sum_t kl_t / N (a double)
    n_rows: int       # N: the rows with at least one valid key (at least 1)
    d_scores: object  # f32 [s_q, s_kv]  dL/dI
    dq: object        # f32 [s_q, H, D]
    dk: object        # f32 [s_kv, D]
    dw: object        # f32 [s_q, H]


def _widen(x, name: str, rank: int, dims: str) -> np.ndarray:
    """bf16 or f32 -> f32 (bf16 values exactly)."""
    a = A.arg(x, name, [A.BF16, F32], rank, dims)
    return (a.astype(np.uint32) << 16).view(F32) if a.dtype == np.uint16 else a


def indexer_loss(q, k, weights, ks, ke, teachers, *, topk=None, relu: bool = True, loss_coeff: float = 1.0,
                 target: str = "own-layer", per_token: bool = False, all_rows: bool = False, grad: float = 1.0,
                 impl: str = "simd") -> IndexerLoss:
    """Megatron-LM's indexer KL loss and its exact gradients (ref/train/indexer_loss.h).

    q [s_q, H, D] and k [s_kv, D]: the indexer's bf16 (or f32) query and key; weights f32 [s_q, H] (H^-1/2
    D^-1/2 folded in); ks, ke int32 [s_q] (row t's keys [ks, ke)); teachers: :class:`Teacher` per layer, the
    Full layer's own first (``target="served-layers"``: the mean of every teacher's normalized attention,
    IndexCache's training-aware rule; "own-layer": the first only); topk int32 [s_q, K] (positions local to
    the row, -1 padded) makes the loss sparse (top-k within the valid keys), None dense. ``relu=False`` for
    GLM-5. ``per_token``: no division by N; ``all_rows``: N = s_q. Returns :class:`IndexerLoss` in the
    inputs' framework.
    """
    if isinstance(teachers, Teacher) or not teachers:
        raise ValueError("teachers: expected a non-empty list of indexshare.train.Teacher (the Full layer's own first)")
    raw = []
    for i, t in enumerate(teachers):
        t = Teacher(*t)
        kv = A.arg(t.kv, f"teachers[{i}].kv", [A.BF16], A.to_numpy(t.kv, f"teachers[{i}].kv").ndim, "s_kv, 1, d_qk")
        if kv.ndim == 2:
            kv = kv.reshape(kv.shape[0], 1, kv.shape[1])
        raw.append((A.arg(t.q, f"teachers[{i}].q", [A.BF16], 3, "s_q, h_q, d_qk"), kv, float(t.sm_scale),
                    A.optional_arg(t.lse, f"teachers[{i}].lse", [F32], 2, "s_q, h_q")))
    r = core().indexer_loss(_widen(q, "q", 3, "s_q, H, D"), _widen(k, "k", 2, "s_kv, D"),
                            A.arg(weights, "weights", [F32], 2, "s_q, H"), A.arg(ks, "ks", [I32], 1, "s_q"),
                            A.arg(ke, "ke", [I32], 1, "s_q"), A.optional_arg(topk, "topk", [I32], 2, "s_q, K"), raw,
                            bool(relu), topk is not None, float(loss_coeff), bool(per_token), bool(all_rows),
                            float(grad), str(target), _impl(impl))
    torch = A.wants_torch(q, k, weights, ks, ke, topk, *[x for t in teachers for x in Teacher(*t)[:2]])
    return IndexerLoss(*(r[n] if n in ("loss", "n_rows") else A.out(r[n], torch) for n in IndexerLoss._fields))


# ---- pytest helpers: a torch function judged against a training golden set ----

def _torch():
    import torch
    return torch


def _layers(golden, layers, has: str) -> list[int]:
    """The layers to run: `layers` or every layer holding tensor `has`."""
    names = golden.tensors
    if layers is None:
        return [l for l in range(len(golden.layers)) if f"layers.{l}.{has}" in names]
    missing = [l for l in layers if f"layers.{l}.{has}" not in names]
    if missing:
        raise ValueError(f"layers {missing}: the golden set holds no {has} there")
    return list(layers)


def _leaf(x, dtype=None):
    torch = _torch()
    t = x.detach().clone() if isinstance(x, torch.Tensor) else A.out(np.array(x, copy=True), True)
    return (t.to(dtype) if dtype is not None else t).requires_grad_(True)


def _const(x):
    torch = _torch()
    return x.detach().clone() if isinstance(x, torch.Tensor) else A.out(np.array(x, copy=True), True)


def _grad(name: str, leaf, want_shape) -> object:
    if leaf.grad is None:
        raise ValueError(f"{name}: the function's output does not depend on it (its .grad is None after backward)")
    if tuple(leaf.grad.shape) != tuple(want_shape):
        raise ValueError(f"{name}: gradient of shape {list(leaf.grad.shape)}, expected {list(want_shape)}")
    return leaf.grad.detach()


def attention_backward_candidate(fn: Callable, golden, *, layer_list=None, dtype=None, layers=None) -> dict:
    """Runs ``fn(q, kv, indices, sm_scale, d_v, topk_length, sink)`` (a differentiable torch function, e.g.
    ``MyFunction.apply``; q bf16 [s_q, h_q, d_qk] and kv bf16 [s_kv, 1, d_qk] require grad, indices int32
    [s_q, 1, topk], topk_length int32 [s_q] or None, sink f32 [h_q] (requires grad) or None; it returns out
    [s_q, h_q, d_v], or a tuple whose first element is out) on each layer of a training golden set, calls
    ``out.backward(layers.{l}.attn.d_out)`` and returns the candidate {layers.{l}.attn_bwd.dq: q.grad,
    .dkv: kv.grad, .d_sink: sink.grad} in the gradients' own dtypes. ``dtype`` (e.g. torch.float64, for a
    reference in higher precision): q, kv and sink are handed to fn in that dtype instead of the set's.
    ``layer_list``: the layers to run (default: every layer holding attn.d_out; ``layers=`` is its old name)."""
    torch = _torch()
    t = golden.tensors
    sm, d_v = float(golden.config["sm_scale"]), int(golden.config["d_v"])
    cand = {}
    layers = _renamed("layers", "layer_list", layers, layer_list)
    for l in _layers(golden, layers, "attn.d_out"):
        p = f"layers.{l}."
        q, kv = _leaf(t[p + "attn.q"], dtype), _leaf(t[p + "attn.kv"], dtype)
        sink = _leaf(t[p + "attn.sink"], dtype) if p + "attn.sink" in t else None
        tl = _const(t[p + "attn.topk_length"]) if p + "attn.topk_length" in t else None
        d_out = _const(t[p + "attn.d_out"])
        with torch.enable_grad():
            out = fn(q, kv, _const(t[p + "attn.indices"]), sm, d_v, tl, sink)
            out = out[0] if isinstance(out, (tuple, list)) else out
            if tuple(out.shape) != tuple(d_out.shape):
                raise ValueError(f"layer {l}: fn returned out of shape {list(out.shape)}, expected {list(d_out.shape)} [s_q, h_q, d_v]")
            out.backward(d_out.to(out.dtype))
        cand[p + "attn_bwd.dq"] = _grad(f"layer {l} q", q, q.shape)
        cand[p + "attn_bwd.dkv"] = _grad(f"layer {l} kv", kv, kv.shape)
        if sink is not None:
            cand[p + "attn_bwd.d_sink"] = _grad(f"layer {l} sink", sink, sink.shape)
    if not cand:
        raise ValueError("attention_backward_candidate: the golden set holds no attn.d_out (give a kind=\"train\" set)")
    return cand


def assert_attention_backward(fn: Callable, golden, *, layer_list=None, impl: str = "auto", layers=None) -> Report:
    """:func:`attention_backward_candidate` judged by :func:`indexshare.testing.assert_matches`: raises
    AssertionError with the CLI's report (its diagnoses name the usual backward bugs) when a gradient FAILs;
    returns the :class:`indexshare.Report` otherwise."""
    layers = _renamed("layers", "layer_list", layers, layer_list)
    return assert_matches(golden, attention_backward_candidate(fn, golden, layer_list=layers), layers, impl=impl)


def indexer_loss_candidate(fn: Callable, golden, *, layer_list=None, dtype=None, layers=None) -> dict:
    """Runs ``fn(q, k, weights, ks, ke, topk, teachers, loss_coeff)`` on each distilled layer of a training
    golden set and backpropagates the scalar it returns. q [s_q, H, D] and k [s_kv, D] (the indexer's bf16
    values as f32) and weights f32 [s_q, H] require grad; ks, ke int32 [s_q]; topk int32 [s_q, K] (row-local,
    -1 padded) for a sparse loss, None for a dense one; teachers: a list of (q bf16 [s_q, h_q, d_qk], kv bf16
    [s_kv, 1, d_qk], sm_scale), the Full layer's own first (more with the served-layers target, whose rule
    fn then implements). Returns {layers.{l}.indexer_loss.loss, .dq, .dk, .dw}. ``dtype``: q, k and weights
    in that dtype (default float32). ``layer_list``: the layers to run (default: every distilled layer;
    ``layers=`` is its old name)."""
    torch = _torch()
    t = golden.tensors
    tr = golden.manifest["train"]
    sm, coeff = float(golden.config["sm_scale"]), float(tr["loss_coeff"])
    teachers_of = {e["layer"]: e["teachers"] for e in tr["indexer_losses"]}
    cand = {}
    layers = _renamed("layers", "layer_list", layers, layer_list)
    for l in _layers(golden, layers, "indexer_loss.loss"):
        p = f"layers.{l}."
        q, k = _leaf(t[p + "indexer.q"], dtype or torch.float32), _leaf(t[p + "indexer.k"], dtype or torch.float32)
        w = _leaf(t[p + "indexer.weights"], dtype)
        topk = _const(t[p + "indexer.topk"]) if tr["loss"] == "sparse" else None
        teachers = [(_const(t[f"layers.{m}.attn.q"]), _const(t[f"layers.{m}.attn.kv"]), sm) for m in teachers_of[l]]
        with torch.enable_grad():
            loss = fn(q, k, w, _const(t[p + "indexer.ks"]), _const(t[p + "indexer.ke"]), topk, teachers, coeff)
            if loss.numel() != 1:
                raise ValueError(f"layer {l}: fn returned a loss of shape {list(loss.shape)}, expected a scalar")
            loss.backward()
        cand[p + "indexer_loss.loss"] = loss.detach().reshape(1).to(dtype or torch.float32)
        cand[p + "indexer_loss.dq"] = _grad(f"layer {l} q", q, q.shape)
        cand[p + "indexer_loss.dk"] = _grad(f"layer {l} k", k, k.shape)
        cand[p + "indexer_loss.dw"] = _grad(f"layer {l} weights", w, w.shape)
    if not cand:
        raise ValueError("indexer_loss_candidate: the golden set holds no indexer loss (give a kind=\"train\" set)")
    return cand


def assert_indexer_loss_backward(fn: Callable, golden, *, layer_list=None, impl: str = "auto", layers=None) -> Report:
    """:func:`indexer_loss_candidate` judged by :func:`indexshare.testing.assert_matches` (AssertionError
    with the CLI's report on a FAIL)."""
    layers = _renamed("layers", "layer_list", layers, layer_list)
    return assert_matches(golden, indexer_loss_candidate(fn, golden, layer_list=layers), layers, impl=impl)
