"""Candidates from real GPU arithmetic, for judging the judge on a GPU (opt-in; not in ctest).

    python tests/gpu/torch_arithmetic.py GOLDEN_SET OUT_DIR      (needs CUDA torch >= 2.8, Hopper or newer)
    indexshare diff --golden GOLDEN_SET --candidate OUT_DIR/NAME.safetensors [--precision logits=f32]

For a stack golden set with FP8 indexer logits (layer 0), it writes one candidate per arithmetic:
    fp8_fastaccum1 / 0   logits from torch._scaled_mm on the FP8 codes (the tensor core's FP8 MMA,
                         cuBLASLt fast accumulation on and off), top-k by torch.topk: must PASS the
                         default contract (fp8mma) and FAIL --precision logits=f32, named fp8mma
    fp8_bf16scores       the same logits stored in bf16: must FAIL, named bf16
    attn_flash_pbf16     attention as FlashMLA computes it (bf16 q.k GEMM with f32 output, f32
                         softmax, P rounded to bf16, bf16 P.V GEMM with f32 accumulation): must PASS
    attn_f32             the same with P in f32: must PASS
    attn_bf16_logits     the q.k logits rounded to bf16 before the softmax: must FAIL, named bf16-logits
"""
import os, sys, time, torch
from safetensors.torch import load_file, save_file
if len(sys.argv) != 3:
    sys.exit(__doc__)
out = sys.argv[2]
os.makedirs(out, exist_ok=True)
g = load_file(sys.argv[1] + "/tensors.safetensors")
dev = "cuda"
print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
torch.backends.cuda.matmul.allow_tf32 = False
L = "layers.0."
q = g[L + "indexer.q"].to(dev)            # e4m3 [sq, H, D]
k = g[L + "indexer.k"].to(dev)            # e4m3 [skv, D]
ks_ = g[L + "indexer.k_scale"].to(dev)
w = g[L + "indexer.weights"].to(dev)
kst, ke = g[L + "indexer.ks"].to(dev).long(), g[L + "indexer.ke"].to(dev).long()
sq, H, D = q.shape; skv = k.shape[0]
topk = g[L + "indexer.topk"].shape[1]
one = torch.ones((), device=dev)
def logits_from(S):  # S [sq*H, skv] f32 of q.k codes
    S = S.view(sq, H, skv)
    lg = (torch.relu(S) * w[:, :, None]).sum(1) * ks_[None, :]
    pos = torch.arange(skv, device=dev)[None, :]
    return torch.where((pos >= kst[:, None]) & (pos < ke[:, None]), lg, torch.full_like(lg, float("-inf")))
res = {}
for fast in (True, False):
    S = torch._scaled_mm(q.reshape(sq * H, D), k.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
    lg = logits_from(S)
    tk = torch.topk(lg, topk, dim=1).indices.int()
    res[f"fp8_fastaccum{int(fast)}"] = {L + "indexer.logits": lg, L + "indexer.topk": tk}
# bf16-rounded logits (a kernel that stores its scores in bf16): must fail
lg = res["fp8_fastaccum1"][L + "indexer.logits"].bfloat16().float()
res["fp8_bf16scores"] = {L + "indexer.logits": lg, L + "indexer.topk": torch.topk(lg, topk, dim=1).indices.int()}
# attention over the golden's indices
aq = g[L + "attn.q"].to(dev); kv = g[L + "attn.kv"].to(dev)[:, 0, :]; idx = g[L + "attn.indices"].to(dev)[:, 0, :].long()
sm = float(__import__("json").load(open(sys.argv[1] + "/manifest.json"))["config"]["sm_scale"])
dv = 512
valid = (idx >= 0) & (idx < kv.shape[0])
Kg = kv[idx.clamp(0, kv.shape[0] - 1)]       # [sq, topk, 576] bf16
def mm32(a, b):  # bf16 x bf16 -> f32 tensor-core GEMM, f32 accumulate
    try:
        return torch.bmm(a, b, out_dtype=torch.float32)
    except Exception as e:
        print("bmm out_dtype unavailable:", e); return torch.bmm(a.float(), b.float())
def attention(s_bf16, p_bf16):
    S = mm32(aq, Kg.transpose(1, 2)) * sm                     # [sq, h, topk] f32
    if s_bf16: S = S.bfloat16().float()
    S = torch.where(valid[:, None, :], S, torch.full_like(S, float("-inf")))
    m = S.amax(-1, keepdim=True)
    p = torch.exp(S - m)
    l = p.sum(-1, keepdim=True)
    pb = p.bfloat16() if p_bf16 else p
    o = mm32(pb, Kg[:, :, :dv].contiguous()) if p_bf16 else torch.bmm(p, Kg[:, :, :dv].float())
    o = o / l
    lse = (m + torch.log(l))[..., 0]
    return {L + "attn.out": o.bfloat16(), L + "attn.lse": lse, L + "attn.max_logits": m[..., 0]}
res["attn_flash_pbf16"] = attention(False, True)
res["attn_f32"] = attention(False, False)
res["attn_bf16_logits"] = attention(True, True)
torch.cuda.synchronize()
for name, t in res.items():
    save_file({k2: v.contiguous().cpu() for k2, v in t.items()}, f"{out}/{name}.safetensors")
    print("wrote", name, flush=True)
