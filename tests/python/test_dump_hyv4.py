"""The transformers bridge on Hunyuan HY V4 (tools/python/indexshare/_hyv4.py) end to end.

A tiny random hy_v4 model (f32, CPU, no download; 6 layers F F S S S F, transformers' default
indexer_types) is dumped with indexshare.dump; `golden --from` builds a hyv4 golden set from the dumped
inputs and `diff` judges the model's own choices carried in the dump: its indexer's k_norm, roped q / k,
head weights, scores and top-k, and the indices every layer's attention used (a Shared layer's its
source's), each against the set's bounds and tie rule. Planted mistakes, spliced into the clean dump: the
model's indexer RoPE moved to the leading dims (transformers' own rotation on the other slice), and a
Shared layer handed another Full layer's top-k; each fails and is named. Bad dumps exit 2 naming the
tensor, nothing written."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
M = pytest.importorskip("transformers.models.hy_v4.modeling_hy_v4")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from indexshare import dump as D  # noqa: E402
from cli_run import diff_verdicts, model_dump, run  # noqa: E402
from indexshare import _hyv4  # noqa: E402

S = 24
CONFIG = dict(model_type="hy_v4", vocab_size=64, hidden_size=64, num_hidden_layers=6, num_attention_heads=2, q_lora_rank=32,
              kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, index_n_heads=4, index_head_dim=32,
              index_topk=8, intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.fixture(scope="module")
def hy(tmp_path_factory):
    return model_dump(tmp_path_factory.mktemp("hyv4"), CONFIG, S, eager=True)


def diff(hy, candidate, expect):
    return diff_verdicts(hy["golden"], candidate, hy["work"] / "diff.json", expect)


def test_the_models_own_choices_pass(hy):
    assert hy["meta"]["kind"] == "hyv4"
    assert "sched=FFSSSF" in hy["meta"]["problem"] and "sink=random" in hy["meta"]["problem"]
    r, verdicts = diff(hy, hy["dump"], expect=0)
    names = {n for _, n in verdicts}
    assert {"indexer.k_norm", "indexer.q_rope", "indexer.k_rope", "indexer.weights", "indexer.scores", "indexer.topk",
            "attn.indices"} <= names
    assert all(v == "PASS" for v in verdicts.values()), r.stdout
    assert sum(1 for (layer, n) in verdicts if n == "attn.indices") == 6
    # The set's Shared layers attend over their source's top-k, which the model's own top-k passed.
    g, _ = read(hy["golden"] / "tensors.safetensors")
    for layer in (2, 3, 4):
        assert torch.equal(g[f"layers.{layer}.attn.indices"], g["layers.1.attn.indices"])
    # The replay line rebuilds the same bytes.
    again = hy["work"] / "again"
    run("golden", "--from", hy["dump"], "--out", again, expect=0)
    assert (again / "tensors.safetensors").read_bytes() == (hy["golden"] / "tensors.safetensors").read_bytes()


def test_planted_mistakes_fail_and_are_named(hy):
    t, meta = read(hy["dump"])
    # The indexer's RoPE on the leading dims of layer 0, by transformers' own rotation (as the model would).
    r = CONFIG["qk_rope_head_dim"]
    cos, sin = M.HYV4RotaryEmbedding(hy["model"].config)(t["layers.0.indexer.q"][None], torch.arange(S)[None])
    q, k = t["layers.0.indexer.q"], t["layers.0.indexer.k_norm"]
    q_rot, k_rot = M.apply_rotary_pos_emb_interleave(q[None, ..., :r], k[None, :, None, :r], cos, sin, unsqueeze_dim=2)
    bad = dict(t)
    bad["layers.0.indexer.q_rope"] = torch.cat([_hyv4._in_place(q_rot[0], r), q[..., r:]], dim=-1).contiguous()
    bad["layers.0.indexer.k_rope"] = torch.cat([_hyv4._in_place(k_rot[0, :, 0], r), k[..., r:]], dim=-1).contiguous()
    # A Shared layer handed layer 0's top-k in place of its source layer 1's.
    bad["layers.3.attn.indices"] = t["layers.0.indexer.topk"][:, None].clone()
    assert not torch.equal(t["layers.0.indexer.topk"], t["layers.1.indexer.topk"])
    path = hy["work"] / "bad.safetensors"
    save_file(bad, str(path), metadata=meta)
    res, verdicts = diff(hy, path, expect=1)
    assert verdicts[(0, "indexer.q_rope")] == "FAIL" and verdicts[(0, "indexer.k_rope")] == "FAIL"
    assert verdicts[(3, "attn.indices")] == "FAIL"
    assert "layer 0: indexer.k_rope, indexer.q_rope match the indexer with its RoPE on the leading 16 dims" in res.stdout
    assert "layer 3 (Shared from 1): attn.indices are layer 0's top-k, not its source layer 1's" in res.stdout


def test_bad_dumps_exit_2_and_write_nothing(hy):
    t, meta = read(hy["dump"])
    bad = dict(t)
    bad["layers.2.attn.gate"] = t["layers.2.attn.gate"].clone()
    bad["layers.2.attn.gate"][3, 1, 0] = float("nan")
    path = hy["work"] / "nan.safetensors"
    save_file(bad, str(path), metadata=meta)
    out = hy["work"] / "nan-golden"
    r = run("golden", "--from", path, "--out", out, expect=2)
    assert "tensor 'layers.2.attn.gate': element [3,1,0] is not finite" in r.stderr + r.stdout
    assert not out.exists()
    del bad["layers.2.attn.gate"]
    save_file(bad, str(path), metadata=meta)
    r = run("golden", "--from", path, "--out", out, expect=2)
    assert "tensor 'layers.2.attn.gate' is missing" in r.stderr + r.stdout
    assert not out.exists()
    with pytest.raises(D.DumpError, match="every layer"):
        D.dump(hy["model"], hy["ids"], str(hy["work"] / "x.safetensors"), layers=[0, 1])


def test_overlap_of_dump_and_set(hy, tmp_path):
    """overlap compares the Full layers' own top-k of a hy_v4 dump and of its set (the same inputs, so the
    same matrix); search needs every layer's indexer, which a model with Shared layers does not run."""
    import json

    out = {}
    for flag, src in (("--from", hy["dump"]), ("--golden", hy["golden"])):
        j = tmp_path / "o.json"
        run("overlap", flag, src, "--json", j, expect=0)
        out[flag] = json.loads(j.read_text())
    assert out["--from"]["matrix"] == out["--golden"]["matrix"]
    assert out["--from"]["n_layers"] == len(out["--from"]["schedule"])
    if "S" in out["--from"]["schedule"]:
        r = run("search", "--from", hy["dump"], "--full-layers", "1", expect=2)
        assert "has no indexer inputs" in r.stderr + r.stdout
