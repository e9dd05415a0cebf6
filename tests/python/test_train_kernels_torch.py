"""The training kernels' blocks (tools/lib/kernel_registry.h, kind train) used as a GPU user would:
TileLang's sparse_mla_bwd algorithm, written here in torch f32 from its example (P from the base-2
lse, Delta from the bf16 out, dS = sm_scale P (dP - Delta), dKV scattered per occurrence; the causal
mask index <= query row), fed the set's tensors as the block's conventions say (lse * log2(e), -1
replaced by s_kv), must meet TileLang's similarity criterion (1e-4) on attn_bwd.dq / dkv; skipping
either convention must fail it. Also: Python's golden(preset=) writes the checked-in manifest's
hashes, and for_kernel= refuses a problem that breaks a constraint."""
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import indexshare  # noqa: E402

KERNEL = "tilelang-sparse-mla-bwd"


def similarity_gap(x, y):
    """TileLang's utils.py assert_tensors_similar: 1 - 2 sum(x y) / sum(x^2 + y^2) (f64 here)."""
    x, y = x.double(), y.double()
    return 1.0 - 2.0 * (x * y).sum().item() / (x * x + y * y).sum().item()


def tilelang_bwd(q, kv, o, do, indices, lse2, sm):
    """sparse_mla_bwd on B = 1, kv_group 1, D = 512, in f32: returns dq [S, H, 576], dkv [S_kv, 1, 576]."""
    S, H, DQK = q.shape
    SKV = kv.shape[0]
    kvp = torch.cat([kv[:, 0, :], torch.zeros(1, DQK)])                 # row S_kv: the padding row
    delta = (o * do).sum(-1)                                            # [S, H]
    dq = torch.zeros(S, H, DQK)
    dkv = torch.zeros(SKV + 1, DQK)
    for s in range(S):
        idx = indices[s, 0].long()                                     # [topk]
        mask = idx <= s                                                # the kernel's only test: -1 passes
        idx = torch.where(idx < 0, idx + SKV, idx)                     # a -1 reads some other key (here the last)
        K = kvp[idx]
        acc = q[s] @ K.T                                               # [H, topk]
        p = torch.exp2(acc * sm * math.log2(math.e) - lse2[s][:, None])
        p = torch.where(mask[None, :], p, torch.zeros(()))
        dp = do[s] @ K[:, :512].T
        ds = p * (dp - delta[s][:, None]) * sm
        dq[s] = ds @ K
        contrib = ds.T @ q[s]                                          # [topk, 576]
        contrib[:, :512] += p.T @ do[s]
        dkv.index_add_(0, idx, contrib)                                # per occurrence, as the atomics
    return dq, dkv[:SKV, None, :]


@pytest.fixture(scope="module")
def tset():
    g = indexshare.golden("sq64 skv64 hq64 dqk576 dv512 ih8 id32 k64 seed5 indexer=bf16", for_kernel=KERNEL, framework="torch")
    return g


def run_block(g, convert_lse=True, pad_minus_one=True):
    m, t = g.manifest, g.tensors
    block = m["kernel"]
    assert block["name"] == KERNEL and m["kind"] == "train"
    args = {a["name"]: t[a["tensor"].replace("{l}", "0")] for a in block["args"]}
    f = lambda x: x.float()  # noqa: E731
    ind = args["indices"].clone()
    s_kv = args["kv"].shape[0]
    if pad_minus_one:
        ind[ind == -1] = s_kv
    lse = f(args["lse"]) * (math.log2(math.e) if convert_lse else 1.0)
    return tilelang_bwd(f(args["q"]), f(args["kv"]), f(args["o"]), f(args["do"]), ind, lse, block["kwargs"]["sm_scale"])


def test_tilelang_block_meets_its_similarity(tset):
    dq, dkv = run_block(tset)
    t = tset.tensors
    gq, gkv = similarity_gap(dq, t["layers.0.attn_bwd.dq"]), similarity_gap(dkv, t["layers.0.attn_bwd.dkv"])
    print(f"tilelang emulation: dq gap {gq:.2e}, dkv gap {gkv:.2e}")
    assert gq <= 1e-4 and gkv <= 1e-4
    assert "--for " + KERNEL in tset.manifest["replay"]


@pytest.mark.parametrize("fault", ["natural-lse", "minus-one-as-key"])
def test_tilelang_block_conventions_matter(tset, fault):
    dq, dkv = run_block(tset, convert_lse=fault != "natural-lse", pad_minus_one=fault != "minus-one-as-key")
    t = tset.tensors
    worst = max(similarity_gap(dq, t["layers.0.attn_bwd.dq"]), similarity_gap(dkv, t["layers.0.attn_bwd.dkv"]))
    print(f"{fault}: worst gap {worst:.2e}")
    assert worst > 1e-4, worst


@pytest.mark.parametrize("name", ["tilelang-sparse-mla-bwd", "megatron-dsa-indexer-loss"])
def test_python_train_preset_writes_the_checked_in_hashes(name, root, tmp_path):
    want = json.load(open(root / "golden" / "kernels" / name / "manifest.json"))
    g = indexshare.golden(preset=name)
    g.save(str(tmp_path / "set"))
    got = json.load(open(tmp_path / "set" / "manifest.json"))
    assert {e["name"]: e["sha256"] for e in got["tensors"]} == {e["name"]: e["sha256"] for e in want["tensors"]}
    assert got["kernel"] == want["kernel"]
    assert got["replay"].split(" --out ")[0] == want["replay"].split(" --out ")[0]


def test_python_for_kernel_refuses_broken_constraints():
    with pytest.raises(ValueError, match=r"h_q 16: tilelang-sparse-mla-bwd takes 64 or 128.*q_offset 32"):
        indexshare.golden("sq32 skv64 hq16 dqk576 dv512 ih8 id32 k64 indexer=bf16", for_kernel=KERNEL)
    with pytest.raises(ValueError, match=r"indexer=fp8: megatron-dsa-indexer-loss takes the bf16 indexer"):
        indexshare.golden("sq32 skv32 hq4 dqk576 dv512 ih8 id32 k16", for_kernel="megatron-dsa-indexer-loss")
