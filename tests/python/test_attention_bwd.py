"""The sparse attention backward (ref/train/attention_bwd.h) against torch float64 autograd through a
gather-based forward with a sink, written here: FlashMLA sparse prefill semantics (-1 and out-of-range
indices and slots past topk_length masked, duplicates gathered twice, the sink as an extra logit
out of the softmax denominator). Also simd == ref bit for bit, and TileLang's similarity
1 - 2 sum(x y) / sum(x^2 + y^2) of the low-precision emulation against the truth.
Run: .venv/bin/python -m pytest -s tests/python/test_attention_bwd.py (prints the errors)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import indexshare  # noqa: E402
from indexshare.kernels import sparse_attention_backward  # noqa: E402

S_Q, H_Q, S_KV, D_QK, D_V, TOPK = 24, 16, 160, 576, 512, 64


def inputs(seed, sink=True, lengths=True):
    rng = np.random.default_rng(seed)
    q = torch.tensor(rng.standard_normal((S_Q, H_Q, D_QK)) * 0.5, dtype=torch.bfloat16)
    kv = torch.tensor(rng.standard_normal((S_KV, 1, D_QK)), dtype=torch.bfloat16)
    d_out = torch.tensor(rng.standard_normal((S_Q, H_Q, D_V)), dtype=torch.bfloat16)
    # Duplicates (64 draws from 165 values), -1 and indices >= S_KV among them.
    idx = torch.tensor(rng.integers(-1, S_KV + 4, size=(S_Q, 1, TOPK)), dtype=torch.int32)
    length = torch.tensor(rng.integers(TOPK // 2, TOPK + 1, size=S_Q), dtype=torch.int32) if lengths else None
    s = torch.tensor(rng.standard_normal(H_Q), dtype=torch.float32) if sink else None
    return q, kv, idx, d_out, length, s


def torch_forward(q, kv, idx, sm_scale, d_v, sink, length):
    """out [s_q, h, d_v] and P per slot, float64, differentiable in q, kv and sink."""
    ind = idx[:, 0, :].long()
    valid = (ind >= 0) & (ind < kv.shape[0])
    if length is not None:
        valid &= torch.arange(ind.shape[1])[None, :] < length[:, None].long()
    k = kv[:, 0, :][torch.where(valid, ind, 0)]                       # [s_q, topk, d_qk], duplicates twice
    s = torch.einsum("thd,tkd->thk", q, k) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    z = torch.logsumexp(s, dim=-1)                                      # natural lse, without the sink
    if sink is not None:
        z = torch.logaddexp(z, sink[None, :])                           # the sink joins the denominator
    z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))          # empty rows: P = 0
    p = torch.exp(s - z[..., None])
    return torch.einsum("thk,tkc->thc", p, k[..., :d_v]), p


def truth(q, kv, idx, d_out, length, sink, sm_scale):
    q64 = q.double().requires_grad_()
    kv64 = kv.double().requires_grad_()
    sink64 = sink.double().requires_grad_() if sink is not None else None
    out, p = torch_forward(q64, kv64, idx, sm_scale, D_V, sink64, length)
    (out * d_out.double()).sum().backward()
    delta = (out.detach() * d_out.double()).sum(-1)
    return dict(dq=q64.grad, dkv=kv64.grad, d_sink=None if sink is None else sink64.grad, delta=delta,
                p=p.detach(), out=out.detach())


def max_rel(ours, want):
    """max |ours - want| / max |want| over the tensor."""
    return float((ours.double() - want).abs().max() / want.abs().max())


def similarity(x, y):
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


@pytest.mark.parametrize("sink,lengths", [(True, True), (False, False), (True, False)])
def test_backward_matches_torch_float64_autograd(sink, lengths):
    q, kv, idx, d_out, length, s = inputs(7, sink, lengths)
    sm = float(np.float32(D_QK ** -0.5))  # the kernel takes sm_scale as f32: the truth uses the same value
    r = sparse_attention_backward(q, kv, idx, sm, D_V, d_out, topk_length=length, sink=s, impl="ref")
    t = truth(q, kv, idx, d_out, length, s, sm)
    errs = {name: max_rel(getattr(r, name), t[name]) for name in ("dq", "dkv", "delta", "p")}
    if sink:
        errs["d_sink"] = max_rel(r.d_sink, t["d_sink"])
    print(f"\nsink={sink} topk_length={lengths}: max |ours - torch f64| / max |torch f64|: "
          + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    # Each output is the double result rounded once to f32: within 2^-24 of each element, so within 2^-24 of
    # the largest (the double arithmetic's own error is ~1e-15 here).
    for name, e in errs.items():
        assert e <= 2.0 ** -24 * 1.001, (name, e)
        want = t[name]
        slack = (getattr(r, name).double() - want).abs() - 2.0 ** -24 * want.abs()
        assert float(slack.max()) <= 1e-13 * float(want.abs().max()), name   # element by element too
    assert torch.equal(r.dq_bf16, r.dq.to(torch.bfloat16)) and torch.equal(r.dkv_bf16, r.dkv.to(torch.bfloat16))
    assert r.d_sink.shape == ((H_Q,) if sink else (0,))
    # The forward's lse, bit for bit (the backward does not form O).
    f = indexshare.sparse_attention(q, kv, idx, sm, D_V, topk_length=length, sink=s, impl="ref")
    assert torch.equal(r.lse, f.lse)
    # A faulty gradient (Delta from the bf16 out, as a kernel bug would) is visibly off in dq.
    if sink:
        delta_bf16 = (f.out_bf16.double() * d_out.double()).sum(-1)
        assert float((delta_bf16 - t["delta"]).abs().max()) > 1e-4 * float(t["delta"].abs().max())


def test_simd_equals_ref_bit_for_bit():
    q, kv, idx, d_out, length, s = inputs(11)
    a = sparse_attention_backward(q, kv, idx, 0.05, D_V, d_out, topk_length=length, sink=s, impl="ref")
    b = sparse_attention_backward(q, kv, idx, 0.05, D_V, d_out, topk_length=length, sink=s, impl="simd")
    for name in a._fields:
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_lowp_emulation_similarity():
    q, kv, idx, d_out, length, s = inputs(13)
    sm = D_QK ** -0.5
    exact = sparse_attention_backward(q, kv, idx, sm, D_V, d_out, topk_length=length, sink=s, impl="ref")
    lowp = sparse_attention_backward(q, kv, idx, sm, D_V, d_out, topk_length=length, sink=s, lowp=True)
    sims = {n: similarity(getattr(lowp, n), getattr(exact, n)) for n in ("dq", "dkv", "d_sink")}
    bf16 = {n: similarity(getattr(exact, n + "_bf16").float(), getattr(exact, n)) for n in ("dq", "dkv")}
    print("\nTileLang similarity 1 - 2 sum(xy) / sum(x^2 + y^2), emulation vs truth: "
          + ", ".join(f"{k} {v:.2e}" for k, v in sims.items())
          + "; bf16(truth) vs truth: " + ", ".join(f"{k} {v:.2e}" for k, v in bf16.items()))
    assert 0 < sims["dq"] <= 1e-4 and 0 < sims["dkv"] <= 1e-4  # TileLang's pass mark
    # A fault: dkv without its V part (a kernel that forgot P^T dO), the V part scattered here from P per slot.
    ind = idx[:, 0, :].long()
    v_part = torch.zeros(S_KV + 1, D_V, dtype=torch.float64)
    for t in range(S_Q):
        rows = torch.where(exact.p[t, 0] != 0, ind[t], S_KV)            # ignored slots land in a spare row
        v_part.index_add_(0, rows, exact.p[t].double().T @ d_out[t].double())
    fault = exact.dkv.double().clone()
    fault[:, 0, :D_V] -= v_part[:S_KV]
    print(f"fault (no V part): dkv similarity {similarity(fault, exact.dkv):.2e}")
    assert similarity(fault, exact.dkv) > 1e-2
