"""indexshare.module: the indexer and MLA of a layer, whole and step by step, against what the C++ toy model
stored in module-level golden sets (ref/model.h computes them with ref::indexer_module / mla_*): the whole
functions must give the stored intermediates, and the steps composed in numpy (an independent path through
other C++ functions) must give them too. ref and simd, numpy and torch; bad inputs raise naming the argument."""
import ml_dtypes
import numpy as np
import pytest
import torch

import indexshare
from indexshare import _arrays
from indexshare import module as M

BF16 = ml_dtypes.bfloat16


def np_(x):
    return _arrays.to_numpy(x, "x") if isinstance(x, torch.Tensor) else np.asarray(x)


def same(a, b):
    a, b = np_(a), np_(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def bf16(x):
    return np_(x).astype(BF16)


@pytest.fixture(scope="module")
def glm(root):
    return indexshare.load_golden(root / "golden" / "module-tiny-glm")


@pytest.fixture(scope="module")
def deepseek():  # half-split indexer RoPE, YaRN frequencies
    return indexshare.golden(model="tiny-deepseek", layers=1, seq=48)


@pytest.fixture(scope="module")
def hf():  # the HF transformers indexer: no Hadamard, no FP8
    return indexshare.golden(model="tiny-glm", layers=1, seq=40, variant="hf_bf16")


def model_of(g):
    return g.manifest["problem"].split()[0].split("=")[1]


def check_layer(g, variant, impl, fw, l=0):
    t = g.tensors
    model = model_of(g)
    conv = (lambda a: a) if fw == "numpy" else (lambda a: _arrays.out(np.array(a), True))
    p = f"layers.{l}."
    iw = {n: conv(v) for n, v in M.weights_of(g, l, "indexer").items()}
    mw = {n: conv(v) for n, v in M.weights_of(g, l, "mla").items()}
    x, qr = conv(t[p + "attn.x"]), conv(t[p + "mla.qr"])
    d = M.indexer_module(model, iw, x, qr, variant=variant, impl=impl)
    assert all(isinstance(v, torch.Tensor) == (fw == "torch") for v in d.values())
    names = ["q_proj", "q_rope", "k_proj", "k_norm", "k_rope"]
    if variant == "deepseek_fp8":
        names += ["q_hadamard", "k_hadamard"]
        assert same(d["q8"], t[p + "indexer.q"]) and same(d["k8"], t[p + "indexer.k"])
    else:
        assert "q8" not in d and "q_hadamard" not in d
        assert same(bf16(d["q"]), t[p + "indexer.q"]) and same(bf16(d["k"]), t[p + "indexer.k"])
    for n in names:
        assert same(bf16(d[n]), t[p + "indexer." + n]), n
    for n in ("k_scale", "q_scale", "weights"):
        assert same(d[n], t[p + "indexer." + n]), n
    q = M.mla_query(model, mw, x, impl=impl)
    assert same(bf16(q.qr), t[p + "mla.qr"]) and same(q.q, t[p + "attn.q"])
    assert same(M.mla_kv(model, mw, x, impl=impl), t[p + "attn.kv"])  # one prefill chunk: the cache is these rows
    assert same(bf16(M.mla_output(model, mw, conv(t[p + "attn.out"]), impl=impl)), t[p + "out"])


@pytest.mark.parametrize("impl", ["ref", "simd"])
@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_module_functions_give_the_golden_intermediates(glm, deepseek, hf, impl, fw):
    check_layer(glm, "deepseek_fp8", impl, fw)
    check_layer(deepseek, "deepseek_fp8", impl, fw)
    check_layer(hf, "hf_bf16", impl, fw)


@pytest.mark.parametrize("which", ["glm", "deepseek"])
def test_the_steps_compose_to_the_module(which, glm, deepseek):
    """Every step of ref/module.h's indexer and MLA query, composed here in numpy, gives the golden's
    intermediates: linear (bf16 and f32 outputs), LayerNorm, RMSNorm, RoPE (both layouts, YaRN), the
    Hadamard rotation, FP8 quantize / dequantize, the head weights' scale folding."""
    g = {"glm": glm, "deepseek": deepseek}[which]
    model, t, p = model_of(g), g.tensors, "layers.0."
    cfg = M.model_config(model)
    H, D, rope = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    assert cfg["indexer_rope"] == {"glm": "interleaved", "deepseek": "half_split"}[which]
    iw, mw = M.weights_of(g, 0, "indexer"), M.weights_of(g, 0, "mla")
    x = t[p + "attn.x"]
    S = x.shape[0]
    # MLA's qr = bf16(RMSNorm(linear_bf16(x, wq_a), q_norm))
    qr = bf16(M.rms_norm(M.linear(x, mw["wq_a"], round_bf16=True), mw["q_norm"], cfg["rms_eps"]))
    assert same(qr, t[p + "mla.qr"])
    # keys: linear_bf16, LayerNorm, RoPE on the first `rope` dims (pe first), Hadamard, FP8
    k_proj = M.linear(x, iw["wk"], round_bf16=True)
    assert same(bf16(k_proj), t[p + "indexer.k_proj"])
    k = bf16(M.layer_norm(k_proj, iw["k_norm_w"], iw["k_norm_b"], cfg["index_norm_eps"]))
    assert same(k, t[p + "indexer.k_norm"])
    freq = M.rope_inv_freq(model=model)
    if which == "glm":
        assert same(freq, M.rope_inv_freq(rope, cfg["rope_theta"]))  # no YaRN
    else:
        assert not same(freq, M.rope_inv_freq(rope, cfg["rope_theta"]))  # YaRN-corrected
    k = k.astype(np.float32)
    k[:, :rope] = bf16(M.apply_rope(k[:, None, :rope], 0, freq, cfg["indexer_rope"])[:, 0]).astype(np.float32)
    assert same(bf16(k), t[p + "indexer.k_rope"])
    k_had = bf16(M.hadamard_transform(k))
    assert same(k_had, t[p + "indexer.k_hadamard"])
    codes, scales = M.quantize(k_had, D, cfg["index_scale_rule"])
    assert same(codes, t[p + "indexer.k"]) and same(scales[:, 0], t[p + "indexer.k_scale"])
    back = M.dequantize(codes, scales, D)
    assert same(back, (codes.astype(np.float32) * scales).astype(np.float32))
    # queries: linear_bf16(qr, wq_b) as [S, H, D], RoPE per head with explicit positions, Hadamard, FP8
    q = bf16(M.linear(qr, iw["wq_b"], round_bf16=True)).reshape(S, H, D).astype(np.float32)
    assert same(bf16(q), t[p + "indexer.q_proj"])
    q[:, :, :rope] = bf16(M.apply_rope(q[:, :, :rope], np.arange(S), freq, cfg["indexer_rope"])).astype(np.float32)
    assert same(bf16(q), t[p + "indexer.q_rope"])
    q_had = bf16(M.hadamard_transform(q))
    assert same(q_had, t[p + "indexer.q_hadamard"])
    q8, q_scale = M.quantize(q_had, D, cfg["index_scale_rule"])
    assert same(q8, t[p + "indexer.q"]) and same(q_scale[..., 0], t[p + "indexer.q_scale"])
    # weights = ((weights_proj(x) * f32(H^-0.5)) * q_scale) * f32(D^-0.5), f32 left to right
    wp = M.linear(x, iw["weights_proj"])
    w = (wp * np.float32(H ** -0.5)) * q_scale[..., 0] * np.float32(D ** -0.5)
    assert same(w.astype(np.float32), t[p + "indexer.weights"])
    # MLA output = linear_bf16(value_up(o_lat) viewed [S, n_heads * v], wo)
    up = M.mla_value_up(model, mw, t[p + "attn.out"])
    out = M.linear(up.reshape(S, -1), mw["wo"], round_bf16=True)
    assert same(bf16(out), t[p + "out"])


def test_steps_on_torch_and_positions():
    x = torch.randn(3, 2, 8)
    f = M.rope_inv_freq(8, 10000.0)
    a = M.apply_rope(x, 5, f, "interleaved")
    assert isinstance(a, torch.Tensor) and a.shape == x.shape
    b = M.apply_rope(x.numpy(), np.array([5, 6, 7]), f, "interleaved")
    assert same(a, b)
    assert not same(a, M.apply_rope(x, 0, f, "interleaved"))
    assert same(M.apply_rope(x, 0, f, "half_split")[0], x[0])  # position 0 is the identity
    h = M.hadamard_transform(torch.eye(4))
    assert np.allclose(np_(h) @ np_(h).T, np.eye(4), atol=1e-6)


def test_module_bad_inputs_raise_naming_the_argument(glm):
    t = glm.tensors
    iw, mw = M.weights_of(glm, 0, "indexer"), M.weights_of(glm, 0, "mla")
    x, qr = t["layers.0.attn.x"], t["layers.0.mla.qr"]
    with pytest.raises(ValueError, match="weights: missing wk"):
        M.indexer_module("tiny-glm", {k: v for k, v in iw.items() if k != "wk"}, x, qr)
    with pytest.raises(ValueError, match="wk: expected shape"):
        M.indexer_module("tiny-glm", dict(iw, wk=iw["wk"][:, :-1]), x, qr)
    with pytest.raises(TypeError, match="x: expected dtype float32 or bfloat16, got int32"):
        M.mla_kv("tiny-glm", mw, np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="x: expected rank 2"):
        M.mla_query("tiny-glm", mw, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="unknown|bogus"):
        M.mla_kv("bogus-model", mw, x)
    with pytest.raises(ValueError, match="start_pos"):
        M.mla_kv("tiny-glm", mw, x, start_pos=-1)
    with pytest.raises(ValueError, match="variant|nonsense"):
        M.indexer_module("tiny-glm", iw, x, qr, variant="nonsense")
    with pytest.raises(ValueError, match="power of two|Hadamard"):
        M.hadamard_transform(np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="positions: expected shape"):
        M.apply_rope(np.zeros((3, 1, 8), np.float32), np.arange(2), M.rope_inv_freq(8, 1e4), "interleaved")
    with pytest.raises(ValueError, match="inv_freq"):
        M.apply_rope(np.zeros((3, 1, 8), np.float32), 0, M.rope_inv_freq(4, 1e4), "interleaved")
    with pytest.raises(ValueError, match="layout|sideways"):
        M.apply_rope(np.zeros((3, 1, 8), np.float32), 0, M.rope_inv_freq(8, 1e4), "sideways")
    with pytest.raises(ValueError, match="rule|bogus"):
        M.quantize(np.zeros((2, 8), np.float32), 8, "bogus")
    with pytest.raises(ValueError, match="weight: expected shape"):
        M.rms_norm(np.zeros((2, 8), np.float32), np.ones(7, np.float32))
    with pytest.raises(ValueError, match="part"):
        M.weights_of(glm, 0, "ffn")
    with pytest.raises(TypeError, match="codes: expected dtype float8_e4m3fn"):
        M.dequantize(np.zeros((2, 8), np.float32), np.ones((2, 1), np.float32), 8)
