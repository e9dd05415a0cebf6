"""The FP4 indexer's bytes against the upstream quantizers, each written here in torch from its own
definition (DeepGEMM's ``deep_gemm/utils/math.py``: ``ceil_to_ue8m0`` on the exponent bits,
``torch.bucketize`` over the midpoints, the sign kept for non-zero codes; transformers' DeepSeek-V4.1
``_e2m1_codes``: ties to the even code, the sign from ``signbit``, the scale ``2^ceil(log2(amax *
f32(1/6)))`` on the bits with amax clamped to 6 * 2^-126; aiter's FP4 test: argmin over the grid from -6
to 6, so ties go toward -inf, the scale ``2^ceil(log2(amax / 6))`` in float32 with amax clamped to 1e-8).
Each must reproduce ``indexshare.kernels.fp4_quantize`` byte for byte under its rule, and the logits of
the dequantized values must equal ``fp4_logits`` within f32 (ref and simd bit-identical).

Needs torch and the built package (INDEXSHARE_CLI not needed). About 2 s.
"""
import numpy as np
import pytest
import torch

from indexshare import kernels

MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
TIE_UP = torch.tensor([False, True, False, True, False, True, False])
GRID = torch.tensor([-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def ceil_exponent_bits(y):  # biased exponent of 2^ceil(log2 y), from y's f32 bits, clamped to [1, 254]
    bits = y.float().view(torch.int32)
    return (((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).int()).clamp(1, 254)


def deepgemm(x):
    blocks = x.view(x.shape[0], -1, 32)
    e = ceil_exponent_bits(blocks.abs().amax(-1).clamp_min(1e-4) / 6.0)
    v = blocks * (2.0 ** (127 - e.double())).float().unsqueeze(-1)
    idx = torch.bucketize(v.abs().clamp_max(6.0), MIDS)          # right=False: a tie stays below
    code = idx | (((v < 0) & (idx != 0)).int() << 3)
    return code.view(x.shape), e


def transformers(x):
    blocks = x.view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1).clamp_min(6.0 * 2.0 ** -126)
    e = ceil_exponent_bits(amax * torch.tensor(1.0 / 6.0, dtype=torch.float32))
    v = blocks * (2.0 ** (127 - e.double())).float().unsqueeze(-1)
    mag = v.abs().clamp_max(6.0).unsqueeze(-1)
    code = (mag > MIDS).sum(-1) + ((mag == MIDS) & TIE_UP).sum(-1)
    code = code | (torch.signbit(v).int() << 3)
    return code.view(x.shape), e


def aiter(x):
    blocks = x.view(x.shape[0], -1, 32)
    exp = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp_min(1e-8) / 6.0))
    e = (exp + 127).int()
    v = blocks / torch.exp2(exp).unsqueeze(-1)
    i = (v.unsqueeze(-1) - GRID).abs().argmin(-1)             # the first minimum: the lower grid value
    val = GRID[i]
    code = torch.tensor([MAGS.index(abs(float(t))) for t in GRID])[i]
    code = code | ((val < 0).int() << 3)
    return code.view(x.shape), e


def pack(codes):
    c = codes.to(torch.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).numpy()


def inputs():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024, 128, generator=g).to(torch.bfloat16).float()
    x[0, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * torch.tensor([1.0, -1.0] * 16)  # every tie, both signs
    x[1, :32] = 0.0                                           # a degenerate block
    x[2, :32] = -0.01 * torch.arange(32, dtype=torch.float32)  # values that round to zero, negative
    x[2, 31] = 6.0
    return x


@pytest.mark.parametrize("rule,model", [("toward-zero", deepgemm), ("nearest-even", transformers), ("aiter", aiter)])
def test_upstream_quantizer_bytes(rule, model):
    x = inputs()
    codes, scales = kernels.fp4_quantize(x.numpy(), rule)
    want_codes, want_e = model(x)
    assert np.array_equal(codes, pack(want_codes)), rule
    assert np.array_equal(scales, want_e.to(torch.uint8).numpy()), rule


def test_rules_differ_where_the_references_say():
    x = inputs()
    tz, _ = kernels.fp4_quantize(x.numpy(), "toward-zero")
    ne, _ = kernels.fp4_quantize(x.numpy(), "nearest-even")
    nib = lambda b: np.stack([b & 0xF, b >> 4], -1).reshape(b.shape[0], -1)
    a, b = nib(tz), nib(ne)
    differ = (a != b).mean()
    zero_sign = ((a == 0) & (b == 0x8)).mean()
    # bf16 normal data: about 5.9% of codes differ, nearly all the sign of zero (5.4%), the rest ties
    assert 0.03 < differ < 0.09 and 0.03 < zero_sign <= differ


def test_logits_of_the_dequantized_values():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 8, 64, generator=g)
    k = torch.randn(50, 64, generator=g)
    w = (torch.randn(4, 8, generator=g) / 16).numpy()
    ks = np.array([0, 5, 0, 49], np.int32)
    ke = np.array([50, 30, 0, 50], np.int32)
    qc, qs = kernels.fp4_quantize(q.numpy(), "nearest-even")
    kc, kss = kernels.fp4_quantize(k.numpy(), "nearest-even")
    ref = kernels.fp4_logits(qc, qs, kc, kss, w, ks, ke, impl="ref")
    simd = kernels.fp4_logits(qc, qs, kc, kss, w, ks, ke, impl="simd")
    assert np.array_equal(ref.view(np.uint32), simd.view(np.uint32))
    # dequantize in torch (code value * 2^(e - 127)) and take the dot products in float64
    def deq(c, s):
        lo, hi = c & 0xF, c >> 4
        codes = np.stack([lo, hi], -1).reshape(*c.shape[:-1], -1)
        mag = np.array(MAGS)[codes & 7] * np.where(codes & 8, -1.0, 1.0)
        return mag * np.exp2(np.repeat(s.astype(np.float64) - 127, 32, axis=-1))
    dq, dk = deq(qc, qs), deq(kc, kss)
    dots = np.maximum(np.einsum("thd,sd->ths", dq, dk), 0)
    want = np.einsum("th,ths->ts", w.astype(np.float64), dots)
    for t in range(4):
        for s in range(50):
            if ks[t] <= s < ke[t]:
                assert abs(ref[t, s] - want[t, s]) <= 1e-6 * max(1.0, abs(want[t, s]))
            else:
                assert ref[t, s] == -np.inf
    bf = kernels.fp4_logits(qc, qs, kc, kss, w, ks, ke, logits="bf16")
    assert np.all((bf.view(np.uint32) & 0xFFFF) == 0)
