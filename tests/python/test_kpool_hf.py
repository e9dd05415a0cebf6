"""GLM-5.3's pooled indexer (ref/kpool/) against transformers' own `Glm5NextTextIndexer` (glm5_next).

The HF module is driven with our tensors: a tiny random config in f32 whose projections are identity
slices, so that with hidden = [k | g | w] and q_resid = q
    wk(hidden) = k,   F.linear(hidden, index_kpool_compress_gate) = g,   weights_proj(hidden) = w,
    wq_b(q_resid) = q
exactly (one nonzero product per output), and `index_kpool_compress_ape` = our ape. The key LayerNorm
(`k_norm`) is replaced by the identity: our k is the LayerNorm's output. The real forward then gives the
index lists; its pooled keys come from the module's own `get_pooled_states`, its scores from the
forward's lines re-run on them (HF does not return them).

Tolerances: pooled keys and scores are f32 computations in torch and double-then-f32 in ref: within
1e-6 and 2e-6 of max(|value|, 1) (measured: about 2.4e-7 and 3e-7). The index lists are compared as
sets per row (torch.topk's tie order is unspecified, and SGLang places the tail elsewhere). The
data are normal draws, but the ReLU makes exact ties at 0 common (a pool whose every head's dot
product is negative scores exactly 0): a row may differ only by pools tied exactly with its lowest
selected score (tie_only), and such rows are counted. The bf16 model's pooling (probabilities cast to bf16, bf16 products) is
compared with the `hf-bf16` rounding within one bf16 ulp. A generated layer (our generator's
streams) goes through transformers' whole path, the indexer, `build_attention_mask_from_topk` and
`eager_attention_forward`, against our list and sparse attention (within 2e-5; measured 6e-7), and
the same attention without the tail departs (a planted fault)."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig  # noqa: E402
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer  # noqa: E402

from indexshare._core_loader import core  # noqa: E402

H, D = 4, 32


def hf_indexer(P, topk, tail=True, H=H, D=D):
    cfg = Glm5NextTextConfig(hidden_size=2 * D + H, q_lora_rank=H * D, index_n_heads=H, index_head_dim=D,
                             index_topk=topk, index_kpool=P, index_kpool_always_select_tail=tail,
                             num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, vocab_size=16,
                             intermediate_size=8, moe_intermediate_size=8, n_routed_experts=4,
                             num_experts_per_tok=2, pad_token_id=0)
    ix = Glm5NextTextIndexer(cfg, 3).float().eval()
    with torch.no_grad():
        eye = torch.eye(2 * D + H)
        ix.wk.weight.copy_(eye[:D])
        ix.index_kpool_compress_gate.copy_(eye[D:2 * D])
        ix.weights_proj.weight.copy_(eye[2 * D:])
        ix.wq_b.weight.copy_(torch.eye(H * D))
    ix.k_norm = torch.nn.Identity()
    return ix


def draw(S, P, seed):
    g = torch.Generator().manual_seed(seed)
    bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).float()  # noqa: E731
    return dict(q=bf(S, H, D), k=bf(S, D), g=bf(S, D), ape=0.5 * torch.randn(P, D, generator=g),
                w=torch.randn(S, H, generator=g))


def ours(t, P, topk, tail=True, rounding="f32"):
    weights = (t["w"] * np.float32(H ** -0.5)).numpy().astype(np.float32)  # one f32 multiply, as HF
    arr = lambda x: np.ascontiguousarray(x.numpy(), dtype=np.float32)  # noqa: E731
    return core().kpool_indexer(arr(t["q"]), arr(t["k"]), arr(t["g"]), arr(t["ape"]), weights, topk, tail, rounding,
                                core().Impl.ref)


def hf_run(ix, t):
    S = t["k"].shape[0]
    hidden = torch.cat([t["k"], t["g"], t["w"]], dim=-1)[None]
    q_resid = t["q"].reshape(1, S, -1)
    mask = torch.ones(1, S, dtype=torch.bool)
    with torch.no_grad():
        ix.index_kpool_compress_ape.copy_(t["ape"])
        idx = ix(hidden_states=hidden, q_resid=q_resid, attention_mask=mask, cache=None)[0]
        packed = torch.cat([t["k"], t["g"], torch.ones(S, 1)], dim=-1)[None]
        pool_keys, pool_indices, _ = ix.get_pooled_states(packed_states=packed)
        # The forward's score lines on the module's own pooled keys.
        scores = torch.nn.functional.relu(torch.matmul(t["q"][None].float(), pool_keys.transpose(-1, -2).float()
                                                       .unsqueeze(1)) * ix.softmax_scale)
        weights = ix.weights_proj(hidden).float() * (ix.n_heads ** -0.5)
        index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)[0]
    return idx.numpy(), pool_keys[0].numpy(), index_scores.numpy()


def candidate(scores, p):
    return p < len(scores) and np.isfinite(scores[p])


def tie_only(a, b, scores, P):
    """Two token sets of one row differ only by pools whose scores tie exactly with the lowest
    selected score: the selection is the same up to the order of ties."""
    pa = {x // P for x in a if candidate(scores, x // P)}  # the tail's pool is not a candidate
    pb = {x // P for x in b if candidate(scores, x // P)}
    diff = pa ^ pb
    if len(pa) != len(pb) or not diff:
        return False
    kth = min(scores[p] for p in pb)
    return all(scores[p] == kth for p in diff)


@pytest.mark.parametrize("P,topk,S", [(4, 16, 64), (1, 8, 40), (16, 32, 96), (2, 8, 37), (4, 64, 48)])
def test_kpool_matches_transformers(P, topk, S):
    t = draw(S, P, seed=100 * P + S)
    r = ours(t, P, topk)
    idx, kbar_hf, scores_hf = hf_run(hf_indexer(P, topk), t)
    n = S // P
    assert r["kbar"].shape == kbar_hf.shape == (n, D)
    kerr = np.max(np.abs(r["kbar"] - kbar_hf) / np.maximum(np.abs(kbar_hf), 1.0))
    assert kerr < 1e-6, kerr  # f32 softmax and sum in torch: a few f32 ulps of the O(1) terms
    # Scores: ours -inf exactly where the pool's last token is not visible.
    vis = np.array([[p * P + P - 1 <= tq for p in range(n)] for tq in range(S)])
    assert np.all(np.isneginf(r["scores"]) == ~vis)
    serr = np.max(np.abs(r["scores"][vis] - scores_hf[vis]) / np.maximum(np.abs(scores_hf[vis]), 1.0))
    assert serr < 2e-6, serr
    # Index lists as sets per row (judged against our scores, which equal HF's within serr).
    assert idx.shape == r["indices"].shape == (S, topk + P - 1)
    tied = 0
    for tq in range(S):
        a, b = set(idx[tq][idx[tq] >= 0]), set(r["indices"][tq][r["indices"][tq] >= 0])
        if a != b:
            assert all(candidate(r["scores"][tq], x // P) for x in a ^ b)  # the tails agree
            tied += 1
            assert tie_only(a, b, r["scores"][tq], P), (tq, sorted(a ^ b))
    # ReLU makes exact ties common (a pool scores exactly 0 when every head's dot product is
    # negative, 1 in 2^H): the rows where torch.topk broke a tie otherwise are counted, not failed.
    assert tied <= S // 4, tied
    # The layout too (history in score order, the tail after select_k * P columns, -1 padding):
    # column for column on rows whose selected scores are distinct from each other and from the best
    # unselected one by more than the tolerance.
    same_layout = 0
    for tq in range(S):
        chosen = {p for p in r["pools"][tq] if p >= 0}
        sel = sorted(r["scores"][tq][p] for p in chosen)
        rest = [r["scores"][tq][p] for p in range(n) if p not in chosen and candidate(r["scores"][tq], p)]
        if all(y - x > 1e-5 for x, y in zip(sel, sel[1:])) and (not rest or not sel or sel[0] - max(rest) > 1e-5):
            assert np.array_equal(idx[tq], r["indices"][tq]), tq
            same_layout += 1
    assert same_layout >= S // 2, same_layout
    print(f"P={P} topk={topk} S={S}: kbar err {kerr:.2e}, score err {serr:.2e}, rows differing by exact ties {tied}")
    if S <= topk:  # short sequence: every token, dense causal
        for tq in range(S):
            assert set(r["indices"][tq][r["indices"][tq] >= 0]) == set(range(tq + 1))


def test_tie_only_catches_a_planted_pool():
    """The set comparison is not vacuous: a list with a pool that does not tie is refused."""
    scores = np.array([0.5, 0.0, 0.0, 0.3, -np.inf], dtype=np.float32)
    P = 2
    ok = {0, 1, 2, 3, 8}  # pools 0 and 1 (score 0.5, 0.0) and the tail 8
    assert tie_only(ok, {0, 1, 4, 5, 8}, scores, P)  # pool 2 for pool 1: tied at 0.0
    assert not tie_only(ok, {0, 1, 6, 7, 8}, scores, P)  # pool 3 (0.3) for pool 1: not a tie
    assert not tie_only({0, 1, 6, 7, 8}, ok, scores, P)  # and the other way round


def test_kpool_without_tail_matches_transformers():
    P, topk, S = 4, 16, 64
    t = draw(S, P, seed=5)
    r = ours(t, P, topk, tail=False)
    idx, _, _ = hf_run(hf_indexer(P, topk, tail=False), t)
    assert idx.shape == r["indices"].shape == (S, topk)
    for tq in range(S):
        a, b = set(idx[tq][idx[tq] >= 0]), set(r["indices"][tq][r["indices"][tq] >= 0])
        assert a == b or tie_only(a, b, r["scores"][tq], P), tq


def test_kpool_bf16_pooling_matches_transformers_bf16_within_one_ulp():
    """A bf16 model: k and g bf16, ape f32; HF casts the f32 softmax to bf16 and sums bf16 products."""
    P, S = 4, 64
    t = draw(S, P, seed=9)
    ix = hf_indexer(P, 16)
    with torch.no_grad():
        ix.index_kpool_compress_ape.copy_(t["ape"])
        packed = torch.cat([t["k"], t["g"], torch.ones(S, 1)], dim=-1)[None].to(torch.bfloat16)
        kbar_hf = ix.get_pooled_states(packed_states=packed)[0][0].float().numpy()
    ours_bf = ours(t, P, 16, rounding="hf-bf16")["kbar"]
    ours_f32 = ours(t, P, 16)["kbar"]
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(kbar_hf), 1e-30))) - 7)
    assert np.all(np.abs(ours_bf - kbar_hf) <= ulp)
    same = np.mean(ours_bf == kbar_hf)
    assert same > 0.95, same  # mostly bit-equal; a probability at a bf16 boundary moves one ulp
    assert np.any(ours_f32 != kbar_hf)  # the f32 spec is not what a bf16 model computes


def bf16_to_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def test_generated_layer_against_transformers_indexer_mask_and_attention():
    """Our generator's layer (ref/kpool/layer.h) through transformers' whole path: the indexer's
    forward, `build_attention_mask_from_topk` (the union of the list, duplicates collapsed) and
    `eager_attention_forward` on our attention q and latent kv (NoPE MLA absorbed: one kv head of 512
    dims, V = the same 512 dims, scale 256^-1/2), against our index list and sparse attention.
    H = 4 makes H^-1/2 = 0.5 exact, so HF's weights_proj input is our weights times 2, exactly."""
    from types import SimpleNamespace
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextAttention, eager_attention_forward

    P, topk, S, h_q = 4, 16, 64, 2
    L = core().kpool_layer(S, S, heads=H, dim=D, pool=P, index_topk=topk, h_q=h_q, seed=3)
    t = {n: torch.from_numpy(L[n].copy()) for n in ("q", "k", "g", "ape")}
    t["w"] = torch.from_numpy(L["weights"] * np.float32(2.0))
    idx, kbar_hf, scores_hf = hf_run(hf_indexer(P, topk), t)
    assert np.max(np.abs(L["kbar"] - kbar_hf) / np.maximum(np.abs(kbar_hf), 1.0)) < 1e-6
    vis = L["valid"].astype(bool)
    assert np.all(np.isneginf(L["scores"]) == ~vis)
    assert np.max(np.abs(L["scores"][vis] - scores_hf[vis]) / np.maximum(np.abs(scores_hf[vis]), 1.0)) < 2e-6
    agree = []
    for tq in range(S):
        a, b = set(idx[tq][idx[tq] >= 0]), set(L["indices"][tq][L["indices"][tq] >= 0])
        assert len(b) == int(np.sum(L["indices"][tq] >= 0))  # no duplicates in our list
        assert a == b or tie_only(a, b, L["scores"][tq], P), tq
        agree.append(a == b)
    assert sum(agree) >= S - S // 4
    q = torch.from_numpy(bf16_to_f32(L["attn_q"])).permute(1, 0, 2)[None]  # [1, h_q, S, 512]
    kv = torch.from_numpy(bf16_to_f32(L["attn_kv"]))[:, 0][None, None]      # [1, 1, S, 512]
    attn = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    mask = Glm5NextTextAttention.build_attention_mask_from_topk(attn, torch.from_numpy(idx)[None], q, S)
    module = SimpleNamespace(num_key_value_groups=h_q, training=False)
    with torch.no_grad():
        out_hf = eager_attention_forward(module, q, kv, kv, mask, scaling=0.0625)[0][0].numpy()  # [S, h_q, 512]
    err = np.abs(L["out"] - out_hf)[np.array(agree)]
    print(f"attention: max |out - HF eager| {err.max():.2e} over {sum(agree)} rows with equal lists")
    assert err.max() < 2e-5
    # A planted fault: the same attention without the tail columns departs far beyond the tolerance.
    cut = idx.copy()
    cut[:, L["select_k"] * P:] = -1
    mask_cut = Glm5NextTextAttention.build_attention_mask_from_topk(attn, torch.from_numpy(cut)[None], q, S)
    with torch.no_grad():
        out_cut = eager_attention_forward(module, q, kv, kv, mask_cut, scaling=0.0625)[0][0].numpy()
    assert np.abs(L["out"] - out_cut)[np.array(agree)].max() > 1e-2


def test_kpool_indexer_simd_path_gives_ref_bits():
    P, topk, S = 4, 16, 64
    t = draw(S, P, seed=11)
    arr = lambda x: np.ascontiguousarray(x.numpy(), dtype=np.float32)  # noqa: E731
    args = (arr(t["q"]), arr(t["k"]), arr(t["g"]), arr(t["ape"]), arr(t["w"]) * np.float32(0.5), topk, True, "f32")
    a, b = core().kpool_indexer(*args, core().Impl.ref), core().kpool_indexer(*args, core().Impl.simd)
    for name in ("z", "kbar", "scores", "pools", "history", "tail", "indices"):
        assert a[name].tobytes() == b[name].tobytes(), name


def test_checked_in_kpool_tiny_through_transformers_and_diff():
    """golden/kpool-tiny's Full layers (H 4, D 16) through transformers' indexer: the set's pooled keys
    and scores within the tolerances above, its union lists as sets (up to exact ties); transformers'
    lists (its tail after select_k * P columns) and its eager attention over them, as a candidate,
    pass `indexshare.diff`; the same lists cut before the tail fail with "the tail left out" named."""
    import pathlib
    from types import SimpleNamespace

    import indexshare
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextAttention, eager_attention_forward

    gdir = pathlib.Path(__file__).resolve().parents[2] / "golden" / "kpool-tiny"
    g = indexshare.load_golden(gdir)
    P, topk, S = 4, 16, 30
    good, cut = {}, {}
    for l in (3, 11):
        p = f"layers.{l}.indexer."
        t = {n: torch.from_numpy(np.array(g[p + m], dtype=np.float32)) for n, m in (("q", "q"), ("k", "k"), ("g", "gate"), ("ape", "ape"))}
        t["w"] = torch.from_numpy(np.array(g[p + "weights"], dtype=np.float32) * np.float32(2.0))  # H^-1/2 = 0.5: exact
        idx, kbar_hf, scores_hf = hf_run(hf_indexer(P, topk, H=4, D=16), t)
        kbar, scores, lst = np.array(g[p + "pool_keys"]), np.array(g[p + "scores"]), np.array(g[p + "indices"])
        assert np.max(np.abs(kbar - kbar_hf) / np.maximum(np.abs(kbar_hf), 1.0)) < 1e-6
        vis = np.isfinite(scores)
        assert np.max(np.abs(scores[vis] - scores_hf[vis]) / np.maximum(np.abs(scores_hf[vis]), 1.0)) < 2e-6
        for tq in range(S):
            a, b = set(idx[tq][idx[tq] >= 0]), set(lst[tq][lst[tq] >= 0])
            assert a == b or tie_only(a, b, scores[tq], P), tq
        good[p + "indices"] = idx.astype(np.int32)
        cut[p + "indices"] = np.where(np.arange(idx.shape[1]) < 16, idx, -1).astype(np.int32)
    # transformers' eager attention of layer 3 over its own list (V: the first d_v = 32 latent dims).
    q = torch.from_numpy(np.array(g["layers.3.attn.q"]).astype(np.float32)).permute(1, 0, 2)[None]  # [1, h_q, S, 64]
    kv = torch.from_numpy(np.array(g["layers.3.attn.kv"]).astype(np.float32))[:, 0][None, None]       # [1, 1, S, 64]
    attn = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    mask = Glm5NextTextAttention.build_attention_mask_from_topk(attn, torch.from_numpy(good["layers.3.indexer.indices"]).long()[None], q, S)
    with torch.no_grad():
        out = eager_attention_forward(SimpleNamespace(num_key_value_groups=2, training=False), q, kv, kv, mask, scaling=0.0625)[0][0]
    good["layers.3.attn.out"] = np.ascontiguousarray(out.numpy()[:, :, :32], dtype=np.float32)
    r = indexshare.diff(gdir, good)
    assert r.passed, str(r)
    assert r.status(3, "attn.out") == "PASS"
    r = indexshare.diff(gdir, cut)
    assert not r.passed
    assert any("the tail left out" in d for d in r.diagnoses), r.diagnoses
