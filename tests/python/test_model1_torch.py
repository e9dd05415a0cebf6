"""FlashMLA's own MODEL1 test reference, re-implemented in torch, accepts our decode-model1 golden sets.

The references are written here from the semantics of FlashMLA's tests (tests/quant.py
`dequantize_k_cache` for MODEL1_FP8Sparse, tests/ref.py `ref_sparse_attn_decode` with its two KV
scopes), not from our C++ code:
  - the cache is read through the kernel's strided view [num_blocks, B, 1, 584] with byte strides
    (block_bytes, 584, 584, 1), exactly as quant.py slices it: per block the first 576 B bytes are
    the tokens' [448 e4m3 | 64 bf16], then B footers of 8 bytes (7 e8m0 scales, 1 pad);
    value = bf16(e4m3) * bf16(e8m0);
  - the decode gathers both scopes, sets NaN to 0, masks -1 and slots >= topk_length with -inf,
    takes ONE f32 logsumexp, multiplies out by 1 / (1 + exp(sink - lse)), empty rows out 0 / lse +inf.
The comparator is FlashMLA's check_is_allclose with its decode tolerances: inf / NaN positions equal;
out |err| < 1e-3 or |err| / (|ref| + 1e-6) < 2.01/128 per element and cos_diff <= 5e-6; lse 1e-6 or
8.01/65536. Planted faults (a scale one exponent off, two tiles' scales swapped, the unpadded block
stride) must be rejected by the same comparator and by `indexshare diff`.

Needs torch, safetensors and INDEXSHARE_CLI (the built `indexshare`). About 25 s on 2 cores (diff
of the h_q 128 x top-1152 set is most of it).
"""
import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

SPECS = [
    "model1 b2 nextn2 hq64 len1024 win128 blk256 ek512 eblk64 elen640 seed31",   # FlashMLA's decode config, 2 sequences
    "model1 b2 nextn1 hq128 len700 win128 blk256 ek1024 eblk2 elen1100 seed32",  # FlashMLA's other MODEL1 config
]


def cli():
    path = os.environ.get("INDEXSHARE_CLI", "")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("INDEXSHARE_CLI must name the built indexshare binary (e.g. build/indexshare); got '" + path + "'")
    return path


def run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, " ".join(args) + "\n" + r.stdout + r.stderr
    return r.stdout


# ---- FlashMLA's test reference, MODEL1 ----------------------------------------------------------

D_NOPE, D_ROPE, TILE, N_TILES = 448, 64, 64, 7


def kernel_view(cache, view):
    """The real bytes U8 [num_blocks, block_bytes] -> the kernel's strided view [num_blocks, B, 1, 584]."""
    return torch.as_strided(cache, view["shape"], view["strides_bytes"])


def dequantize_model1(k_cache, scale_exp_offset=0, swap_tiles=None):
    """quant.py dequantize_k_cache (MODEL1): [num_blocks, B, 1, 584] view -> bf16 [num_blocks * B, 512].
    scale_exp_offset / swap_tiles plant a decoder fault (None: the correct decoder)."""
    nb, B = k_cache.shape[0], k_cache.shape[1]
    flat = k_cache.reshape(nb, -1)                                               # [nb, 584 B]: the view's bytes
    nope_rope = flat[:, :B * (D_NOPE + 2 * D_ROPE)].reshape(nb, B, D_NOPE + 2 * D_ROPE)
    nope = nope_rope[:, :, :D_NOPE].contiguous().view(torch.float8_e4m3fn)
    rope = nope_rope[:, :, D_NOPE:].contiguous().view(torch.bfloat16)
    scale_bytes = flat[:, B * (D_NOPE + 2 * D_ROPE):].reshape(nb, B, 8)[:, :, :N_TILES].contiguous()
    if scale_exp_offset:
        scale_bytes = (scale_bytes.int() + scale_exp_offset).to(torch.uint8)
    if swap_tiles is not None:
        a, b = swap_tiles
        scale_bytes[:, :, [a, b]] = scale_bytes[:, :, [b, a]]
    scales = scale_bytes.view(torch.float8_e8m0fnu)
    out = torch.empty(nb, B, D_NOPE + D_ROPE, dtype=torch.bfloat16, device=k_cache.device)
    out[..., D_NOPE:] = rope
    for t in range(N_TILES):
        out[..., t * TILE:(t + 1) * TILE] = nope[..., t * TILE:(t + 1) * TILE].to(torch.bfloat16) * \
            scales[:, :, t].to(torch.bfloat16).unsqueeze(-1)
    return out.reshape(nb * B, D_NOPE + D_ROPE)


def ref_sparse_attn_decode(q, scopes, sm_scale, attn_sink):
    """ref.py ref_sparse_attn_decode: q [b, s_q, h_q, 512]; scopes: [(kv [slots, 512] bf16, indices
    [b, s_q, topk], topk_length [b] or None)]. Returns out [b, s_q, h_q, 512] bf16, lse [b, h_q, s_q]."""
    b, s_q, h_q, d = q.shape
    gathered, invalid = [], []
    for kv, idx, topk_length in scopes:
        topk = idx.shape[-1]
        g = kv.index_select(0, idx.clamp(min=0).reshape(-1).long()).reshape(b, s_q, topk, d)
        bad = idx == -1
        if topk_length is not None:
            bad |= torch.arange(topk, device=idx.device).reshape(1, 1, topk) >= topk_length.reshape(b, 1, 1)
        gathered.append(g)
        invalid.append(bad)
    kv = torch.cat(gathered, dim=2).reshape(b * s_q, -1, d).float()
    kv = kv.masked_fill(kv != kv, 0.0)
    mask = torch.cat(invalid, dim=2).reshape(b * s_q, 1, -1)
    w = (q.float().reshape(b * s_q, h_q, d) @ kv.transpose(-1, -2)) * sm_scale
    w = w.masked_fill(mask.expand_as(w), float("-inf"))
    lse = w.logsumexp(dim=-1)
    out = torch.exp(w - lse.unsqueeze(-1)) @ kv
    out = out.reshape(b, s_q, h_q, d)
    lse = lse.reshape(b, s_q, h_q)
    out = out * (1.0 / (1.0 + torch.exp(attn_sink.reshape(1, 1, h_q) - lse))).unsqueeze(-1)
    lonely = lse == float("-inf")
    out[lonely.unsqueeze(-1).expand_as(out)] = 0.0
    lse[lonely] = float("inf")
    return out.to(torch.bfloat16), lse.transpose(1, 2)


def check_is_allclose(ans, ref, abs_tol, rel_tol, cos_diff_tol=None):
    """FlashMLA's comparator. Returns (ok, max_abs, cos_diff)."""
    ans, ref = ans.double(), ref.double()
    for cls in (lambda x: x == float("inf"), lambda x: x == float("-inf"), torch.isnan):
        if not torch.equal(cls(ans), cls(ref)):
            return False, float("inf"), float("inf")
    special = ~torch.isfinite(ref)
    ans, ref = ans.masked_fill(special, 0), ref.masked_fill(special, 0)
    err = (ans - ref).abs()
    ok = bool(((err < abs_tol) | (err / (ref.abs() + 1e-6) < rel_tol)).all())
    cos = 0.0
    if cos_diff_tol is not None and float((ref * ref).sum()) >= 1e-12:
        cos = float(1 - 2 * (ans * ref).sum() / (ans * ans + ref * ref).sum())
        ok = ok and cos <= cos_diff_tol
    return ok, float(err.max()), cos


# ---- the harness ------------------------------------------------------------------------------

def make_set(tmp_path, spec):
    d = str(tmp_path / "set")
    run([cli(), "golden", "--problem", spec, "--for", "flashmla-sparse-decode-model1", "--out", d])
    m = json.load(open(os.path.join(d, "manifest.json")))
    return d, m, load_file(os.path.join(d, "tensors.safetensors"))


def torch_kernel(m, g, **fault):
    """FlashMLA's reference called with the kernel block's arguments (the cache views included)."""
    block, m1 = m["kernel"], m["model1"]
    args = {a["name"]: g[a["tensor"].replace("{l}", "0")] for a in block["args"]}
    b, next_n = m1["b"], m1["next_n"]
    q = args["q"].reshape(b, next_n, m["config"]["h_q"], 512)
    scopes = []
    for cache, idx, length in (("k_cache", "indices", "topk_length"),
                               ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length")):
        view = kernel_view(args[cache], block["views"][cache])
        if fault.get("unpadded"):  # a kernel that assumes contiguous blocks of 584 B bytes
            view = torch.as_strided(args[cache], view.shape, (view.shape[1] * 584, 584, 584, 1))
        kv = dequantize_model1(view, fault.get("scale_exp_offset", 0), fault.get("swap_tiles"))
        scopes.append((kv, args[idx], args[length]))
    return ref_sparse_attn_decode(q, scopes, block["kwargs"]["softmax_scale"], args["attn_sink"])


def judge(m, g, out, lse):
    s_q, h_q = m["config"]["s_q"], m["config"]["h_q"]
    ok_out, err_out, cos = check_is_allclose(out.reshape(s_q, h_q, 512).float(), g["layers.0.attn.out_bf16"].float(),
                                             1e-3, 2.01 / 128, 5e-6)
    ok_lse, err_lse, _ = check_is_allclose(lse.transpose(1, 2).reshape(s_q, h_q), g["layers.0.attn.lse"], 1e-6, 8.01 / 65536)
    return ok_out and ok_lse, err_out, cos, err_lse


def diff(tmp_path, d, m, out, lse, name):
    s_q, h_q = m["config"]["s_q"], m["config"]["h_q"]
    path = str(tmp_path / (name + ".safetensors"))
    save_file({"layers.0.attn.out": out.reshape(s_q, h_q, 512).contiguous(),
               "layers.0.attn.lse": lse.transpose(1, 2).reshape(s_q, h_q).contiguous()}, path)
    return subprocess.run([cli(), "diff", "--golden", d, "--candidate", path], capture_output=True, text=True)


@pytest.mark.parametrize("spec", SPECS)
def test_flashmla_reference_accepts_the_model1_set(spec, tmp_path):
    d, m, g = make_set(tmp_path, spec)
    assert m["kind"] == "decode-model1" and m["kernel"]["name"] == "flashmla-sparse-decode-model1"
    # The views' strides are the padded block size, and differ from 584 B.
    for name, blk in (("k_cache", m["model1"]["block"]), ("extra_k_cache", m["model1"]["extra_block"])):
        v = m["kernel"]["views"][name]
        assert v["strides_bytes"] == [-(-584 * blk // 576) * 576, 584, 584, 1]
        assert v["shape"][1:] == [blk, 1, 584]
    # The dequantized caches are the golden's attn.kv rows (FlashMLA's dequant, bit for bit; NaN -> 0).
    kvs = [dequantize_model1(kernel_view(g["layers.0.attn.model1." + n], m["kernel"]["views"][n]))
           for n in ("k_cache", "extra_k_cache")]
    cat = torch.cat(kvs)
    cat = cat.masked_fill(cat != cat, 0)
    assert torch.equal(cat.view(torch.int16), g["layers.0.attn.kv"][:, 0, :].view(torch.int16))
    out, lse = torch_kernel(m, g)
    ok, err_out, cos, err_lse = judge(m, g, out, lse)
    print(f"{spec}: out max abs {err_out:.3g}, cos_diff {cos:.3g}, lse max abs {err_lse:.3g}")
    assert ok, (err_out, cos, err_lse)
    assert bool(torch.isinf(g["layers.0.attn.lse"]).sum() == 0)  # every row has valid slots
    r = diff(tmp_path, d, m, out, lse, "torch")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("fault", [{"scale_exp_offset": 1}, {"swap_tiles": (2, 3)}, {"unpadded": True}],
                         ids=["scale-one-exponent-off", "tiles-2-3-scales-swapped", "unpadded-block-stride"])
def test_planted_faults_are_rejected(fault, tmp_path):
    d, m, g = make_set(tmp_path, SPECS[0])
    out, lse = torch_kernel(m, g, **fault)
    ok, err_out, cos, err_lse = judge(m, g, out, lse)
    print(f"{fault}: out max abs {err_out:.3g}, cos_diff {cos:.3g}, lse max abs {err_lse:.3g}")
    assert not ok
    r = diff(tmp_path, d, m, out, lse, "fault")
    assert r.returncode == 1, r.stdout + r.stderr


def test_an_empty_row_and_a_row_beyond_topk_length(tmp_path):
    """attn.indices (the combined list diff judges with) holds -1 exactly where the kernel's slot is -1
    or beyond its (extra_)topk_length, and main_slots + slot for the extra scope; FlashMLA's reference
    gives out 0, lse +inf for a row whose slots are all cut."""
    d, m, g = make_set(tmp_path, SPECS[0])
    m1 = m["model1"]
    b, next_n, W, ek = m1["b"], m1["next_n"], m1["window"], m1["extra_topk"]
    ind = g["layers.0.attn.indices"].reshape(b, next_n, W + ek)
    main, extra = g["layers.0.attn.model1.indices"], g["layers.0.attn.model1.extra_indices"]
    tl, etl = g["layers.0.attn.model1.topk_length"], g["layers.0.attn.model1.extra_topk_length"]
    j = torch.arange(W).reshape(1, 1, W)
    want_main = torch.where((main == -1) | (j >= tl.reshape(b, 1, 1)), -1, main)
    je = torch.arange(ek).reshape(1, 1, ek)
    want_extra = torch.where((extra == -1) | (je >= etl.reshape(b, 1, 1)), -1, extra + m1["main_slots"])
    assert torch.equal(ind[..., :W], want_main)
    assert torch.equal(ind[..., W:], want_extra)
    # The reference with every slot cut: out 0, lse +inf.
    q = g["layers.0.attn.q"].reshape(b, next_n, -1, 512)
    kv = torch.zeros(4, 512, dtype=torch.bfloat16)
    out, lse = ref_sparse_attn_decode(q, [(kv, torch.zeros(b, next_n, 64, dtype=torch.int32), torch.zeros(b, dtype=torch.int32))],
                                      0.1, torch.zeros(q.shape[2]))
    assert bool((out == 0).all()) and bool(torch.isinf(lse).all())
