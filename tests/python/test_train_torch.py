"""Training sets against torch: gradients computed by torch autograd in float32 (a correct kernel with
other arithmetic than ours: torch's own sum orders, its exp, f32 throughout) must pass `diff` on a
`golden --kind train` set, and planted faults in the same torch code must fail. The forward is written
from the semantics in tools/lib/golden_train.h (FlashMLA's sparse attention with a sink; Megatron's
indexer KL loss), not from our code.

Also: the Python package writes the CLI's bytes for a training set."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import indexshare  # noqa: E402

PROBLEM = "sq32 skv40 hq4 dqk64 dv48 ih2 id32 k8 seed9 nl3 sched=FSF indexer=bf16 sink=random"


def _t(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32).copy())


def attention_backward_torch(q, kv, ind, sink, d_out, sm, d_v, dtype=torch.float32, v_part=True):
    """dq, dkv, delta by autograd through a gather-based sparse attention with a sink (f32)."""
    q = q.to(dtype).requires_grad_(True)
    kv = kv.to(dtype).requires_grad_(True)
    idx = ind[:, 0, :].long()
    valid = (idx >= 0) & (idx < kv.shape[0])
    K = kv[:, 0, :][idx.clamp(0, kv.shape[0] - 1)]                     # [s_q, k, d_qk]
    s = torch.einsum("thd,tkd->thk", q, K) * sm
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                    # without the sink
    p = torch.exp(s - lse[..., None])
    V = K[..., :d_v] if v_part else K[..., :d_v].detach()
    o = torch.einsum("thk,tkc->thc", p, V)
    f = torch.sigmoid(lse - sink.to(dtype)[None, :])                    # 1 / (1 + exp(sink - lse))
    out = o * f[..., None]
    out.backward(d_out.to(dtype))
    delta = (out.detach() * d_out.to(dtype)).sum(-1)
    return q.grad, kv.grad, delta


def indexer_loss_torch(iq, ik, w, ks, ke, topk, tq, tkv, sm, coeff=1.0):
    """Megatron's indexer KL loss (sparse support, own-layer teacher, ReLU) in f32, by autograd."""
    iq = iq.clone().requires_grad_(True)
    ik = ik.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    s_q, s_kv = iq.shape[0], ik.shape[0]
    pos = torch.arange(s_kv)[None, :]
    window = (pos >= ks[:, None]) & (pos < ke[:, None])
    mask = torch.zeros(s_q, s_kv, dtype=torch.bool)
    for t in range(s_q):
        for j in topk[t].tolist():
            if 0 <= j < int(ke[t] - ks[t]):
                mask[t, int(ks[t]) + j] = True
    mask &= window
    scores = torch.einsum("thd,sd->ths", iq, ik)
    I = (torch.relu(scores) * w[:, :, None]).sum(1)
    with torch.no_grad():
        logits = torch.einsum("thd,sd->ths", tq, tkv[:, 0, :]) * sm
        a = torch.softmax(logits.masked_fill(~mask[:, None, :], float("-inf")), dim=-1)
        p = a.sum(1)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-10)
    log_q = torch.log_softmax(I.masked_fill(~mask, float("-inf")), dim=-1).masked_fill(~mask, 0.0)
    kl = (p * (torch.log(p.clamp_min(1e-10)) - log_q)).masked_fill(~mask, 0.0).sum(-1)
    n = max(int((ke > ks).sum()), 1)
    loss = coeff * kl.sum() / n
    loss.backward()
    return dict(dq=iq.grad, dk=ik.grad, dw=w.grad, kl=kl.detach(), loss=loss.detach().reshape(1), p=p, log_q=log_q.detach())


@pytest.fixture(scope="module")
def train_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("train") / "set"
    indexshare.golden(PROBLEM, kind="train").save(str(d))
    return indexshare.load_golden(str(d))


def _gradients(g, fault=None):
    m = g.manifest
    sm, d_v = m["config"]["sm_scale"], m["config"]["d_v"]
    T = {k: np.array(v) for k, v in g.tensors.items()}
    f32 = lambda n: torch.from_numpy(np.asarray(T[n], dtype=np.float32).copy())
    cand = {}
    for l in range(3):
        P = f"layers.{l}."
        dq, dkv, delta = attention_backward_torch(f32(P + "attn.q"), f32(P + "attn.kv"), torch.from_numpy(np.asarray(T[P + "attn.indices"])),
                                                  f32(P + "attn.sink"), f32(P + "attn.d_out"), sm, d_v,
                                                  v_part=fault != "no_v_part")
        if fault == "scale_twice":
            dq = dq * sm
        cand[P + "attn_bwd.dq"] = dq.numpy()
        cand[P + "attn_bwd.dkv"] = dkv.numpy()
        cand[P + "attn_bwd.delta"] = delta.numpy()
        if m["layers"][l]["kind"] == "full":
            r = indexer_loss_torch(f32(P + "indexer.q"), f32(P + "indexer.k"), f32(P + "indexer.weights"),
                                   torch.from_numpy(np.asarray(T[P + "indexer.ks"])).long(),
                                   torch.from_numpy(np.asarray(T[P + "indexer.ke"])).long(),
                                   torch.from_numpy(np.asarray(T[P + "indexer.topk"])), f32(P + "attn.q"), f32(P + "attn.kv"), sm,
                                   coeff=2.0 if fault == "coeff" else 1.0)
            for n in ("dq", "dk", "dw", "kl", "loss", "p", "log_q"):
                cand[P + "indexer_loss." + n] = r[n].numpy()
    return cand


def test_torch_float32_gradients_pass(train_set):
    r = indexshare.diff(train_set, _gradients(train_set))
    assert r.passed, str(r)


@pytest.mark.parametrize("fault,tensor,needle", [
    ("no_v_part", "attn_bwd.dkv", "misses the V part"),
    ("scale_twice", "attn_bwd.dq", "the softmax scale applied twice"),
    ("coeff", "indexer_loss.dk", "scale error"),
])
def test_torch_planted_faults_fail(train_set, fault, tensor, needle):
    r = indexshare.diff(train_set, _gradients(train_set, fault))
    assert not r.passed
    assert r.status(0, tensor) == "FAIL"
    assert needle in str(r), str(r)


def test_package_writes_the_cli_bytes(tmp_path, cli):
    indexshare.golden(PROBLEM, kind="train", train={"loss": "dense"}).save(str(tmp_path / "py"))
    cli("golden", "--problem", PROBLEM, "--kind", "train", "--loss", "dense", "--out", tmp_path / "cli")
    for f in ("manifest.json", "tensors.safetensors"):
        a, b = (tmp_path / "py" / f).read_bytes(), (tmp_path / "cli" / f).read_bytes()
        if f == "manifest.json":
            ja, jb = json.loads(a), json.loads(b)
            ja.pop("replay"), jb.pop("replay")
            assert ja == jb
        else:
            assert a == b
    with pytest.raises(ValueError, match="indexer=bf16"):
        indexshare.golden("sq8 skv8 hq2 dqk16 dv8 ih2 id16 k4", kind="train")
