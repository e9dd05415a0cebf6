"""The worked example of tools/README.md "Validate your kernel": a GPU engineer's pytest.

`flash_mla_sparse_fwd` below stands for the kernel under test: a naive torch implementation of
FlashMLA's sparse prefill (flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v); FlashMLA's flash_mla_interface.py) in
the kernel's precision: f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out, lse in
natural log. On a GPU, replace it by the kernel and move the tensors to "cuda" (the results back with
.cpu()). It passes; the same kernel with the LSE in base 2 (FlashMLA's Sept-2025 units) fails, and the
failure names the diagnosis.
"""
import math

import pytest
import torch

import indexshare
from indexshare.testing import assert_matches


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, lse_base2=False):
    """q bf16 [s_q, h_q, d_qk], kv bf16 [s_kv, 1, d_qk], indices int32 [s_q, 1, topk] (-1: none)
    -> out bf16 [s_q, h_q, d_v], max_logits f32 [s_q, h_q], lse f32 [s_q, h_q]."""
    s_kv = kv.shape[0]
    idx = indices[:, 0, :].long()                                    # [s_q, topk]
    valid = (idx >= 0) & (idx < s_kv)
    rows = kv[:, 0, :][idx.clamp(0, s_kv - 1)]                       # [s_q, topk, d_qk] bf16
    logits = torch.einsum("shd,skd->shk", q.float(), rows.float()) * sm_scale      # f32
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    m = logits.amax(-1)                                              # max_logits
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(logits - m_safe[..., None])                        # f32, 0 where invalid
    l = p.sum(-1)
    acc = torch.einsum("shk,skd->shd", p.to(torch.bfloat16).float(), rows[..., :d_v].float())  # bf16 P, f32 acc
    out = torch.where(l[..., None] > 0, acc / l[..., None], torch.zeros_like(acc)).to(torch.bfloat16)
    lse = torch.where(l > 0, m_safe + torch.log(l), torch.full_like(l, float("inf")))
    if lse_base2:
        lse = lse * math.log2(math.e)
    return out, m, lse


# A FlashMLA-shaped problem (h_q 64, d_qk 576, d_v 512, top-k a multiple of 128), one Full and one
# Shared layer; computed in memory (indexshare.golden(...).save(dir) writes it for the CLI). impl="simd"
# computes the golden set and the judge's expectations with the fast kernels: the same bits as "ref".
PROBLEM = "sq32 skv512 hq64 k128 ih8 id64 nl2 sched=FS"


@pytest.fixture(scope="module")
def golden():
    return indexshare.golden(PROBLEM, framework="torch", impl="simd")


def run_kernel(g, **kw):
    cand = {}
    for l in range(len(g.layers)):
        p = f"layers.{l}.attn."
        out, max_logits, lse = flash_mla_sparse_fwd(g[p + "q"], g[p + "kv"], g[p + "indices"],
                                                     g.config["sm_scale"], g.config["d_v"], **kw)
        cand[p + "out"], cand[p + "max_logits"], cand[p + "lse"] = out, max_logits, lse
    return cand


def test_the_naive_kernel_matches(golden):
    report = assert_matches(golden, run_kernel(golden), impl="simd")
    assert all(t["verdict"] == "PASS" for t in report.tensors) and len(report.tensors) == 6


def test_lse_in_base_2_fails_and_says_so(golden):
    with pytest.raises(AssertionError) as e:
        assert_matches(golden, run_kernel(golden, lse_base2=True), impl="simd")
    assert "attn.lse is in base 2" in str(e.value)
    assert e.value.report.status(0, "attn.lse") == "FAIL" and e.value.report.status(0, "attn.out") == "PASS"
