"""The indexer's distillation loss (ref/train/indexer_loss.h) against torch float64 autograd of a
transcription of Megatron-LM's loss code.

The transcription follows Megatron's `_compute_index_scores` (einsum, optional ReLU, times the head
weights, head sum), `compute_dsa_indexer_loss` (teacher scores `bmm(q, k) * softmax_scale`, the
varlen window mask, the top-k scattered into an index mask for the sparse loss,
`masked_softmax` / `masked_log_softmax` with `finfo.min` fills, the head sum, the L1 normalization
`p / max(sum p, 1e-10)`, `indexer_loss_from_target` with `query_valid_rows`), the
`non_compressed_lse` teacher (`_compute_indexer_teacher_probabilities`: conditional probabilities
times `exp(lse_R - logaddexp(L, lse_R))`, normalized without a floor) and, for served-layers, the
IndexCache definition `L = 1/(m+1) sum_j KL(p_j || q)`: written from those definitions, in float64,
not from our C++ code. torch autograd gives dq, dk, dw'; the C++ outputs (f32, rounded once from
double) must agree to a relative error (max |ours - torch| / max |torch| per tensor) of 1e-6, the
loss (a double) to 1e-12. The measured errors are printed (pytest -s).

Run: .venv/bin/python -m pytest tests/python/test_indexer_loss_torch.py (about 2 s).
"""
import numpy as np
import pytest
import torch

from indexshare._core_loader import core

EPS = 1e-10
F64 = torch.float64


# ---- the transcription (b = 1 throughout; [sq, b, ...] layouts as Megatron's) ----------------------

def compute_index_scores(q, weights, k, use_relu):
    s = torch.einsum("sbhd,tbd->sbht", q, k)
    if use_relu:
        s = torch.relu(s)
    s = s * weights.unsqueeze(-1)
    return s.sum(dim=2).transpose(0, 1)  # [b, sq, sk]


def masked_softmax(x, valid):
    masked = x.masked_fill(~valid, torch.finfo(x.dtype).min)
    has = valid.any(dim=-1, keepdim=True)
    row_max = torch.where(has, masked.max(dim=-1, keepdim=True).values, torch.zeros_like(masked[..., :1]))
    probs = torch.exp(masked - row_max).masked_fill(~valid, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(EPS)
    return probs.masked_fill(~valid, 0.0)


def masked_log_softmax(x, valid):
    masked = x.masked_fill(~valid, torch.finfo(x.dtype).min)
    has = valid.any(dim=-1, keepdim=True)
    safe = torch.where(has, masked, torch.zeros_like(masked))
    return torch.log_softmax(safe, dim=-1).masked_fill(~valid, 0.0)


def teacher_with_lse(scores, valid, lse):
    """_compute_indexer_teacher_probabilities with non_compressed_lse [b, heads, sq]."""
    masked = scores.masked_fill(~valid, float("-inf"))
    comp = torch.logsumexp(masked, dim=-1)
    has = valid.any(dim=-1)
    safe = torch.where(has, comp, torch.zeros_like(comp))
    cond = torch.exp(masked - safe.unsqueeze(-1))
    full = torch.logaddexp(lse, comp)
    log_mass = (comp - full).masked_fill(~has, float("-inf"))
    return cond * torch.exp(log_mass).unsqueeze(-1)


def teacher_target(query, key, scale, valid, lse=None):
    """p over the support: query [sq, b, np, hn], key [sk, b, 1, hn] -> [b, sq, sk]."""
    sq, b, nh, hn = query.shape
    sk = key.shape[0]
    qq = query.permute(1, 2, 0, 3).reshape(b * nh, sq, hn)
    kk = key.expand(sk, b, nh, hn).permute(1, 2, 3, 0).reshape(b * nh, hn, sk)
    att = (torch.bmm(qq, kk) * scale).reshape(b, nh, sq, sk)
    v = valid.unsqueeze(1).expand(b, nh, sq, sk)
    probs = masked_softmax(att, v) if lse is None else teacher_with_lse(att, v, lse)
    p = probs.sum(dim=1)
    if lse is None:
        return p / p.sum(dim=-1, keepdim=True).clamp_min(EPS)
    mass = p.sum(dim=-1, keepdim=True)
    return p / torch.where(mass > 0, mass, torch.ones_like(mass))


def kl_loss(target, log_q, valid, row_valid, coeff):
    """indexer_loss_from_target (the valid mask zeroes off-support terms, query_valid_rows)."""
    kl = (target * (torch.log(target.clamp_min(EPS)) - log_q)).masked_fill(~valid, 0.0).sum(dim=-1)
    rows = row_valid.to(F64)
    return (kl * rows).sum() / rows.sum().clamp_min(1.0) * coeff, kl


def megatron_loss(x, case, relu, sparse, coeff, layers, lse=False, mean_of_kl=False):
    q, k, w = x
    I = compute_index_scores(q.unsqueeze(1), w.unsqueeze(1), k.unsqueeze(1), relu)[0]  # [sq, sk]
    sq, sk = I.shape
    pos = torch.arange(sk)
    window = (pos[None, :] >= case["ks"][:, None]) & (pos[None, :] < case["ke"][:, None])
    valid = window
    if sparse:
        picked = torch.zeros_like(window)
        for t in range(sq):
            for j in case["topk"][t].tolist():
                if 0 <= j < int(case["ke"][t] - case["ks"][t]):
                    picked[t, int(case["ks"][t]) + j] = True
        valid = window & picked
    log_q = masked_log_softmax(I.masked_fill(~window, float("-inf")), valid)
    row_valid = case["ke"] > case["ks"]
    ps = []
    for j in range(layers):
        aq, akv, l = case["teachers"][j]
        ps.append(teacher_target(aq.unsqueeze(1), akv.unsqueeze(1), case["scale"], valid.unsqueeze(0),
                                 l.T.unsqueeze(0) if lse else None)[0])
    if mean_of_kl:
        loss = sum(kl_loss(p, log_q, valid, row_valid, coeff)[0] for p in ps) / layers
    else:
        loss = kl_loss(sum(ps) / layers, log_q, valid, row_valid, coeff)[0]
    return loss, I, sum(ps) / layers, log_q, valid


# ---- inputs ---------------------------------------------------------------------------------------

def bf16_codes(x):
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def make_case(seed, layers=1):
    g = torch.Generator().manual_seed(seed)
    s_q, s_kv, H, D, h_q, d_qk = 24, 40, 4, 16, 4, 32
    # Two sequences of 20 keys, 12 query rows each (a prefill chunk at the end), row 5 without keys.
    ks = torch.tensor([0] * 12 + [20] * 12, dtype=torch.int32)
    ke = torch.tensor([9 + t for t in range(12)] + [29 + t for t in range(12)], dtype=torch.int32)
    ke[5] = ks[5]
    case = {"ks": ks, "ke": ke, "scale": float(np.float32(0.3)),
            "q": torch.randn(s_q, H, D, generator=g).float(), "k": torch.randn(s_kv, D, generator=g).float(),
            "w": (torch.rand(s_q, H, generator=g) - 0.3).float(), "teachers": []}
    for _ in range(layers):
        aq = torch.randn(s_q, h_q, d_qk, generator=g).to(torch.bfloat16)
        akv = torch.randn(s_kv, 1, d_qk, generator=g).to(torch.bfloat16)
        lse = (torch.randn(s_q, h_q, generator=g) * 2).float()
        case["teachers"].append((aq.to(F64), akv.to(F64), lse.to(F64)))
        case.setdefault("raw", []).append((bf16_codes(aq), bf16_codes(akv), float(case["scale"]), lse.numpy()))
    return case


def ours(case, relu, sparse, coeff, layers, target, impl, lse=False, topk=None):
    c = core()
    teachers = [(a, kv, s, (l if lse else None)) for a, kv, s, l in case["raw"][:layers]]
    return c.indexer_loss(case["q"].numpy(), case["k"].numpy(), case["w"].numpy(), case["ks"].numpy(),
                          case["ke"].numpy(), topk, teachers, relu, sparse, coeff, False, False, 1.0, target,
                          getattr(c.Impl, impl))


def rel(a, b):
    a = torch.as_tensor(np.asarray(a), dtype=F64)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


CASES = [  # name, relu, sparse, layers, target, lse, mean_of_kl
    ("dense-relu", True, False, 1, "own-layer", False, False),
    ("dense-glm5-no-relu", False, False, 1, "own-layer", False, False),
    ("sparse-top8", True, True, 1, "own-layer", False, False),
    ("served-layers-3", True, False, 3, "served-layers", False, True),
    ("non-compressed-lse", True, False, 1, "own-layer", True, False),
]


@pytest.mark.parametrize("impl", ["ref", "simd"])
@pytest.mark.parametrize("name,relu,sparse,layers,target,lse,mean_of_kl", CASES)
def test_indexer_loss_matches_megatron_autograd(name, relu, sparse, layers, target, lse, mean_of_kl, impl):
    case = make_case(7, layers)
    coeff = 0.25
    topk = None
    if sparse:
        dense = ours(case, relu, False, coeff, 1, "own-layer", impl)
        topk = core().topk(dense["scores"], case["ks"].numpy(), case["ke"].numpy(), 8, core().Impl.ref)
        case["topk"] = torch.from_numpy(topk)
    out = ours(case, relu, sparse, coeff, layers, target, impl, lse, topk)

    x = [case["q"].to(F64).requires_grad_(), case["k"].to(F64).requires_grad_(), case["w"].to(F64).requires_grad_()]
    loss, I, p, log_q, valid = megatron_loss(x, case, relu, sparse, coeff, layers, lse, mean_of_kl)
    loss.backward()
    window = torch.isfinite(torch.from_numpy(out["scores"]))
    errs = {
        "I": rel(np.where(window.numpy(), out["scores"], 0), I.detach().masked_fill(~window, 0)),
        "p": rel(out["p"], p.detach()), "log_q": rel(out["log_q"], log_q.detach()),
        "dq": rel(out["dq"], x[0].grad), "dk": rel(out["dk"], x[1].grad), "dw": rel(out["dw"], x[2].grad),
    }
    print(f"\n{name} [{impl}]: max rel errors " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    assert out["n_rows"] == 23
    assert all(v < 1e-6 for v in errs.values()), errs
    assert not valid[5].any() and np.all(out["kl"][5] == 0)
    if mean_of_kl:
        # Our loss is KL(p-bar || q): below the defined mean of KLs by the Jensen gap (no gradient).
        want = megatron_loss([t.detach() for t in x], case, relu, sparse, coeff, layers, lse, False)[0]
        assert out["loss"] < loss.item()
        assert abs(out["loss"] - want.item()) <= 1e-12 * abs(want.item())
    else:
        assert abs(out["loss"] - loss.item()) <= 1e-12 * abs(loss.item()), (out["loss"], loss.item())


def test_a_fault_is_caught():
    """The comparison fails for a teacher with another softmax scale (the check is not vacuous)."""
    case = make_case(8)
    out = ours(case, True, False, 1.0, 1, "own-layer", "ref")
    case["scale"] = float(np.float32(0.31))
    x = [case["q"].to(F64).requires_grad_(), case["k"].to(F64).requires_grad_(), case["w"].to(F64).requires_grad_()]
    loss = megatron_loss(x, case, True, False, 1.0, 1)[0]
    loss.backward()
    assert rel(out["dq"], x[0].grad) > 1e-3
    assert abs(out["loss"] - loss.item()) > 1e-6 * abs(loss.item())
