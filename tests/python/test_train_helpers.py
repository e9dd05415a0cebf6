"""indexshare.train: the loss and backward on numpy and torch, and the pytest helpers that judge a torch
training function against a training golden set.

The torch functions below are this test's own, written from the math (f32, torch autograd): a sparse MLA
forward with -1 / out-of-range / topk_length masking, duplicates counted per occurrence and a sink, and
Megatron-LM's indexer KL loss. Correct ones must PASS the judge; each planted bug must FAIL by name.

Run: .venv/bin/python -m pytest tests/python/test_train_helpers.py (about 10 s).
"""
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import indexshare  # noqa: E402
import indexshare.train as T  # noqa: E402

PROBLEM = "sq24 skv24 hq4 dqk64 dv48 ih2 id32 k8 seed5 nl3 sched=FSF indexer=bf16 sink=random"


@pytest.fixture(scope="module")
def edges():
    return indexshare.golden(problem=PROBLEM, kind="train", train={"edges": True}, framework="torch")


@pytest.fixture(scope="module")
def served():
    return indexshare.golden(problem=PROBLEM, kind="train", train={"target": "served-layers", "loss_coeff": 0.5},
                             framework="torch")


def sparse_mla(q, kv, indices, sm_scale, d_v, topk_length, sink, *, v_part=True, dtype=torch.float32):
    """f32 sparse attention: row t attends its valid slots (index in [0, s_kv), slot < topk_length), each
    occurrence of a duplicate one softmax term; the sink is one more logit with a zero value."""
    s_q, h_q, _ = q.shape
    s_kv, K = kv.shape[0], indices.shape[-1]
    idx = indices[:, 0, :].long()
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(K)[None, :] < topk_length[:, None].long()
    g = kv[:, 0, :].to(dtype)[torch.where(valid, idx, 0)]  # [s_q, K, d_qk]
    logits = torch.einsum("thd,tkd->thk", q.to(dtype), g) * sm_scale
    logits = logits.masked_fill(~valid[:, None, :], -1e30)
    if sink is not None:
        logits = torch.cat([logits, sink.to(dtype)[None, :, None].expand(s_q, h_q, 1)], -1)
    p = torch.softmax(logits, -1)[..., :K] * valid[:, None, :]
    v = g[..., :d_v] if v_part else g[..., :d_v].detach()
    return torch.einsum("thk,tkc->thc", p, v)


def indexer_kl(q, k, w, ks, ke, topk, teachers, loss_coeff, *, rows="valid", dtype=torch.float32):
    """Megatron-LM's indexer loss in f32: ReLU head scores weighted and summed, the teacher the summed
    per-head attention softmax L1-normalized (the mean over teachers), KL(p || softmax(I)) per row over
    the support, summed over rows / N (the rows with a valid key)."""
    s_q, s_kv = q.shape[0], k.shape[0]
    q, k, w = q.to(dtype), k.to(dtype), w.to(dtype)
    I = (torch.relu(torch.einsum("thd,sd->ths", q, k)) * w[:, :, None]).sum(1)
    cols = torch.arange(s_kv)[None, :]
    valid = (cols >= ks[:, None].long()) & (cols < ke[:, None].long())
    support = valid.clone()
    if topk is not None:
        sel = torch.zeros_like(valid)
        pos = topk.long()
        for t in range(s_q):
            ok = pos[t] >= 0
            sel[t, ks[t].long() + pos[t][ok]] = True
        support &= sel
    ps = []
    for aq, akv, sm in teachers:
        lg = torch.einsum("thd,sd->ths", aq.to(dtype), akv[:, 0, :].to(dtype)) * sm
        pp = (torch.softmax(lg.masked_fill(~support[:, None, :], -1e30), -1) * support[:, None, :]).sum(1)
        ps.append(pp / pp.sum(-1, keepdim=True).clamp_min(1e-10))
    p = torch.stack(ps).mean(0)
    logq = torch.log_softmax(I.masked_fill(~support, -1e30), -1)
    term = p * (torch.log(p.clamp_min(1e-300 if dtype == torch.float64 else 1e-38)) - logq)
    kl = torch.where(support & (p > 0), term, torch.zeros_like(term)).sum(-1)
    n = s_q if rows == "all" else max(int(valid.any(-1).sum()), 1)
    return loss_coeff * kl.sum() / n


def test_indexer_loss_numpy_and_torch_equal_the_golden(served):
    t = served.tensors
    p = "layers.0."
    teachers = [T.Teacher(t[f"layers.{m}.attn.q"], t[f"layers.{m}.attn.kv"], served.config["sm_scale"]) for m in (0, 1)]
    args = (t[p + "indexer.q"], t[p + "indexer.k"], t[p + "indexer.weights"], t[p + "indexer.ks"], t[p + "indexer.ke"], teachers)
    for impl in ("ref", "simd"):
        r = T.indexer_loss(*args, topk=t[p + "indexer.topk"], loss_coeff=0.5, target="served-layers", impl=impl)
        assert isinstance(r.dq, torch.Tensor)
        for n in ("p", "log_q", "kl", "d_scores", "dq", "dk", "dw"):
            assert torch.equal(getattr(r, n), t[p + "indexer_loss." + n]), n
        assert np.float32(r.loss) == t[p + "indexer_loss.loss"][0].item()
    def np_(x):  # the same values as numpy (bf16 through ml_dtypes)
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 else x.numpy()
    n = T.indexer_loss(*[np_(x) for x in args[:5]], [T.Teacher(np_(a), np_(b), s) for a, b, s, _ in teachers],
                       topk=np_(t[p + "indexer.topk"]), loss_coeff=0.5, target="served-layers")
    assert isinstance(n.dk, np.ndarray)
    assert np.array_equal(np.asarray(n.dk), t[p + "indexer_loss.dk"].numpy())


def test_attention_backward_helper_passes_a_correct_torch_function(edges):
    r = T.assert_attention_backward(sparse_mla, edges)
    judged = {(x["layer"], x["tensor"]) for x in r.tensors}
    assert {(0, "attn_bwd.dq"), (0, "attn_bwd.dkv"), (1, "attn_bwd.d_sink"), (2, "attn_bwd.dkv")} <= judged


def test_attention_backward_helper_names_a_missing_v_part(edges):
    with pytest.raises(AssertionError) as e:
        T.assert_attention_backward(lambda *a: sparse_mla(*a, v_part=False), edges)
    assert "misses the V part" in str(e.value)


def test_attention_backward_helper_names_duplicates_counted_once(edges):
    def once(q, kv, indices, sm, d_v, tl, sink):
        ind = indices.clone()
        K = ind.shape[-1]
        for t in range(ind.shape[0]):  # later occurrences of a row dropped
            seen = set()
            for j in range(K if tl is None else int(tl[t])):
                v = int(ind[t, 0, j])
                if v in seen:
                    ind[t, 0, j] = -1
                seen.add(v)
        return sparse_mla(q, kv, ind, sm, d_v, tl, sink)
    with pytest.raises(AssertionError) as e:
        T.assert_attention_backward(once, edges)
    assert "duplicates counted once" in str(e.value)


def test_indexer_loss_helper_passes_megatron_and_names_all_rows(edges, served):
    T.assert_indexer_loss_backward(indexer_kl, served)
    T.assert_indexer_loss_backward(indexer_kl, edges)
    with pytest.raises(AssertionError) as e:
        T.assert_indexer_loss_backward(lambda *a: indexer_kl(*a, rows="all"), edges)
    assert "normalised by all rows" in str(e.value)


def test_helpers_refuse_bad_functions_and_sets(edges):
    with pytest.raises(ValueError, match=r"out of shape \[24, 4, 47\]"):
        T.attention_backward_candidate(lambda *a: sparse_mla(*a)[..., :47], edges)
    with pytest.raises(ValueError, match="kv: the function's output does not depend on it"):
        T.attention_backward_candidate(lambda q, kv, *a: q.float()[..., :48] * 1.0, edges)
    stack = indexshare.golden(problem="sq16 skv16 hq2 dqk32 dv16 ih2 id16 k4", framework="torch")
    with pytest.raises(ValueError, match="holds no attn.d_out"):
        T.attention_backward_candidate(sparse_mla, stack)
    with pytest.raises(ValueError, match=r"layers \[1\]: the golden set holds no indexer_loss.loss"):
        T.indexer_loss_candidate(indexer_kl, edges, layer_list=[1])
    with pytest.raises(ValueError, match="d_out"):
        t = edges.tensors
        T.sparse_attention_backward(t["layers.0.attn.q"], t["layers.0.attn.kv"], t["layers.0.attn.indices"], 0.125, 48,
                                    t["layers.0.attn.d_out"][:, :, :40])
    with pytest.raises(TypeError, match="d_out: expected dtype bfloat16"):
        t = edges.tensors
        T.sparse_attention_backward(t["layers.0.attn.q"], t["layers.0.attn.kv"], t["layers.0.attn.indices"], 0.125, 48,
                                    t["layers.0.attn.d_out"].float())
    with pytest.raises(ValueError, match="loss_layers"):
        indexshare.golden(problem=PROBLEM, kind="train", train={"loss_layers": 1})
    with pytest.raises(ValueError, match="layer 1 is Shared"):
        indexshare.golden(problem=PROBLEM, kind="train", train={"loss_layers": [1]})


@pytest.mark.parametrize("preset", ["tilelang-sparse-mla-bwd", "megatron-dsa-indexer-loss"])
def test_checked_in_training_sets_equal_torch_float64_autograd(preset):
    """Every checked-in training set (the kernel presets, regenerated): each gradient within f32 rounding
    of torch float64 autograd through this file's forward (an element's error at most 2^-24 of the
    tensor's largest value plus its own f32 half ulp)."""
    g = indexshare.golden(preset=preset, framework="torch")
    f64 = torch.float64
    want = {}
    want.update({k: v.double() for k, v in T.attention_backward_candidate(
        lambda *a: sparse_mla(*a, dtype=f64), g, dtype=f64).items()})
    want.update({k: v.double() for k, v in T.indexer_loss_candidate(
        lambda *a: indexer_kl(*a, dtype=f64), g, dtype=f64).items()})
    assert any("attn_bwd.dq" in k for k in want) and any("indexer_loss.dk" in k for k in want)
    for name, ref in want.items():
        ours = g.tensors[name].double()
        tol = 2.0 ** -24 * ref.abs().max().item() + 2.0 ** -24 * ref.abs()
        err = (ours - ref).abs()
        assert bool((err <= tol).all()), f"{name}: max err {err.max().item():.3g}, largest value {ref.abs().max().item():.3g}"
