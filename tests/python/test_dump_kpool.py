"""The transformers bridge on GLM-5.3's KPool-DSA (glm5_next, tools/python/indexshare/_kpool.py) end to end.

A tiny random glm5_next_text model (f32, CPU, no download; 8 layers, GLM-5.3's layout: KDA at i % 4 != 3,
DSA at 3 and 7, both Full) is dumped with indexshare.dump; `golden --from` builds a kpool set from the
dumped inputs and `diff` judges the model's own choices carried in the dump: its pooled keys, pool scores,
pools, history, tail and union list, and the list each DSA layer's attention used. A second model with every
layer DSA (F S F S) has Shared layers, whose list is the one transformers hands them. Planted mistakes,
made by the model itself (its layer 3's pooling or tail changed in its forward) and spliced into the clean
dump (layer 3's inputs are the clean ones, checked): pools by max or by mean instead of the softmax, the
tail left out; each fails and is named. transformers' own limitation (a Shared DSA layer after a KDA layer
raises) gives a clear DumpError, nothing written. Bad dumps exit 2 naming the tensor, nothing written;
overlap / search refuse a kpool dump or set by name."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
M = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from indexshare import dump as D  # noqa: E402
from cli_run import diff_verdicts, model_dump, run  # noqa: E402

S, P = 41, 4
CONFIG = dict(model_type="glm5_next_text", vocab_size=64, hidden_size=64, num_hidden_layers=8, num_attention_heads=2,
              num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=256, v_head_dim=16, index_n_heads=4,
              index_head_dim=16, index_topk=16, index_kpool=P, intermediate_size=32, moe_intermediate_size=16,
              n_routed_experts=4, num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2, pad_token_id=0)
OUTPUTS = ("indexer.pool_keys", "indexer.scores", "indexer.pools", "indexer.history", "indexer.tail", "indexer.indices",
           "attn.indices")


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.fixture(scope="module")
def kp(tmp_path_factory):
    return model_dump(tmp_path_factory.mktemp("kpool"), CONFIG, S)


def diff(kp, candidate, expect):
    return diff_verdicts(kp["golden"], candidate, kp["work"] / "diff.json", expect)


def test_the_models_own_choices_pass(kp):
    assert kp["meta"]["kind"] == "kpool"
    assert kp["meta"]["problem"] == ("sq=41 skv=41 h=4 d=16 pool=4 k=16 tail=yes rounding=f32 hq=2 dqk=32 dv=32 nl=8 "
                                     "dsa=glm53 sched=FF")
    r, verdicts = diff(kp, kp["dump"], expect=0)
    assert set(verdicts) == {(layer, n) for layer in (3, 7) for n in OUTPUTS}, r.stdout
    assert all(v == "PASS" for v in verdicts.values()), r.stdout
    # The selection is exercised: rows with more visible pools than k / P = 4 (41 tokens: 10 pools).
    t, _ = read(kp["dump"])
    scores = t["layers.3.indexer.scores"]
    assert int(torch.isfinite(scores).sum(1).max()) == 10
    assert bool((t["layers.3.indexer.pools"] >= 0).all(1)[-1])
    # The replay line rebuilds the same bytes.
    again = kp["work"] / "again"
    run("golden", "--from", kp["dump"], "--out", again, expect=0)
    assert (again / "tensors.safetensors").read_bytes() == (kp["golden"] / "tensors.safetensors").read_bytes()


def test_shared_layers_pass_where_transformers_runs_them(tmp_path):
    cfg = dict(CONFIG, num_hidden_layers=4, layer_types=["indexed_attention"] * 4, indexer_types=["full", "shared"] * 2)
    d = model_dump(tmp_path, cfg, 24)
    assert "dsa=all sched=FSFS" in d["meta"]["problem"]
    t, _ = read(d["dump"])
    assert torch.equal(t["layers.1.attn.indices"], t["layers.0.attn.indices"])
    assert not torch.equal(t["layers.2.attn.indices"], t["layers.0.attn.indices"])
    r, verdicts = diff_verdicts(d["golden"], d["dump"], tmp_path / "diff.json", expect=0)
    assert verdicts[(1, "attn.indices")] == verdicts[(3, "attn.indices")] == "PASS", r.stdout
    assert all(v == "PASS" for v in verdicts.values()), r.stdout


def faulty_dump(kp, plant, name):
    """The model with layer 3's indexer changed by `plant(indexer)` (undone after), dumped; its layer-3
    outputs spliced into the clean dump (its layer-3 inputs are the clean ones)."""
    ix = kp["model"].layers[3].self_attn.indexer
    plant(ix)
    path = kp["work"] / f"{name}-model.safetensors"
    try:
        D.dump(kp["model"], kp["ids"], str(path))
    finally:
        for attr in ("get_pooled_states", "append_visible_tail"):
            vars(ix).pop(attr, None)
    bad, _ = read(path)
    clean, meta = read(kp["dump"])
    for n in ("indexer.q", "indexer.k", "indexer.gate", "indexer.ape", "indexer.weights", "attn.q", "attn.kv"):
        assert torch.equal(bad["layers.3." + n], clean["layers.3." + n]), n
    spliced = dict(clean)
    for n in OUTPUTS:
        spliced["layers.3." + n] = bad["layers.3." + n]
    out = kp["work"] / f"{name}.safetensors"
    save_file(spliced, str(out), metadata=meta)
    return out, bad, clean


def pooling_by(reduce):
    def plant(ix):
        own = ix.get_pooled_states

        def pooled(packed_states):
            keys, idx, valid = own(packed_states)
            k = packed_states[..., : ix.head_dim]
            n = keys.shape[1]
            slots = k[:, : n * ix.index_kpool].reshape(k.shape[0], n, ix.index_kpool, -1)
            return (slots.max(2).values if reduce == "max" else slots.mean(2)), idx, valid
        ix.get_pooled_states = pooled
    return plant


@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_pools_scored_by_max_or_mean_fail_and_are_named(kp, reduce):
    path, bad, clean = faulty_dump(kp, pooling_by(reduce), reduce)
    assert not torch.equal(bad["layers.3.indexer.pools"], clean["layers.3.indexer.pools"])
    res, verdicts = diff(kp, path, expect=1)
    assert verdicts[(3, "indexer.pool_keys")] == verdicts[(3, "indexer.scores")] == "FAIL"
    assert verdicts[(7, "indexer.pool_keys")] == "PASS"
    assert f"layer 3: indexer.pool_keys: pools scored with {reduce}" in res.stdout, res.stdout
    assert f"layer 3: indexer.scores: pools scored with {reduce}" in res.stdout, res.stdout
    # Its pools fail too: its own scores sit outside their bound, so they explain no near tie (the one
    # top-k rule of every family), and the same hypothesis names the mistake on the pools.
    assert verdicts[(3, "indexer.pools")] == "FAIL"
    assert f"layer 3: indexer.pools: pools scored with {reduce}" in res.stdout, res.stdout
    # Its lists alone are judged against the golden's scores: they fail, and the mistake is named there.
    t, meta = read(path)
    del t["layers.3.indexer.pool_keys"], t["layers.3.indexer.scores"]
    lists = kp["work"] / f"{reduce}-lists.safetensors"
    save_file(t, str(lists), metadata=meta)
    res, verdicts = diff(kp, lists, expect=1)
    assert verdicts[(3, "indexer.pools")] == verdicts[(3, "indexer.indices")] == verdicts[(3, "attn.indices")] == "FAIL"
    assert f"layer 3: indexer.pools: pools scored with {reduce}" in res.stdout, res.stdout


def test_the_tail_left_out_fails_and_is_named(kp):
    def plant(ix):
        ix.append_visible_tail = lambda topk, *_: torch.cat([topk, torch.full_like(topk[..., : P - 1], -1)], dim=-1)
    path, bad, clean = faulty_dump(kp, plant, "no-tail")
    assert bool((bad["layers.3.indexer.tail"] == -1).all()) and bool((clean["layers.3.indexer.tail"] >= 0).any())
    res, verdicts = diff(kp, path, expect=1)
    assert verdicts[(3, "indexer.tail")] == verdicts[(3, "indexer.indices")] == verdicts[(3, "attn.indices")] == "FAIL"
    assert verdicts[(3, "indexer.pools")] == "PASS"
    assert "layer 3: indexer.indices: the tail left out" in res.stdout, res.stdout
    assert "layer 3: attn.indices: the tail left out" in res.stdout, res.stdout


def test_shared_after_kda_is_transformers_limitation(tmp_path):
    cfg = dict(CONFIG, indexer_types=["full"] * 4 + ["shared"] * 4)  # layer 7 Shared, after KDA layer 6
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model, _, _ = D.load_model(str(tmp_path / "config.json"), "cpu", 0)
    ids = torch.arange(16)[None] % 64
    with pytest.raises(ValueError, match="Shared DSA layers require top-k indices"):  # transformers itself
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    out = tmp_path / "x.safetensors"
    with pytest.raises(D.DumpError, match=r"layer 7 is a Shared DSA layer after a linear-attention \(KDA\) layer \(6\): "
                                          "transformers' glm5_next hands the top-k only to the very next decoder layer"):
        D.dump(model, ids, str(out))
    assert not out.exists()
    r = run_dump("--model", tmp_path / "config.json", "--tokens", "16", "--out", out)
    assert r.returncode == 2 and "a transformers limitation" in r.stderr and not out.exists()


def run_dump(*args):
    import os
    import subprocess
    import sys

    from pathlib import Path

    pkg = str(Path(D.__file__).resolve().parents[1])  # the folder that holds indexshare/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "indexshare.dump", *map(str, args)], capture_output=True, text=True,
                          env=env)


def test_configs_the_descriptor_cannot_express_are_refused(tmp_path, kp):
    for extra, needle in ((dict(qk_nope_head_dim=128), "sm_scale 128^-1/2 is not GLM-5.3's 256^-1/2"),
                          (dict(layer_types=["linear_attention", "indexed_attention"] * 4), "config.layer_types")):
        (tmp_path / "config.json").write_text(json.dumps(dict(CONFIG, **extra)))
        model, _, _ = D.load_model(str(tmp_path / "config.json"), "cpu", 0)
        with pytest.raises(D.DumpError, match=needle.replace("^", r"\^")):
            D.dump(model, torch.arange(12)[None], str(tmp_path / "x.safetensors"))
    with pytest.raises(D.DumpError, match="every DSA layer"):
        D.dump(kp["model"], kp["ids"], str(tmp_path / "x.safetensors"), layers=[3])
    assert not (tmp_path / "x.safetensors").exists()


def test_bad_dumps_exit_2_and_write_nothing(kp):
    t, meta = read(kp["dump"])
    out = kp["work"] / "bad-golden"
    path = kp["work"] / "bad.safetensors"

    def refused(tensors, needle, metadata=meta):
        save_file(tensors, str(path), metadata=metadata)
        r = run("golden", "--from", path, "--out", out, expect=2)
        assert needle in r.stderr + r.stdout, r.stderr
        assert not out.exists()

    bad = dict(t)
    bad["layers.7.indexer.gate"] = t["layers.7.indexer.gate"].clone()
    bad["layers.7.indexer.gate"][5, 2] = float("nan")
    refused(bad, "tensor 'layers.7.indexer.gate': element [5,2] is not finite")
    del bad["layers.7.indexer.gate"]
    refused(bad, "tensor 'layers.7.indexer.gate' is missing")
    bad = dict(t, **{"layers.4.indexer.q": t["layers.3.indexer.q"].clone()})
    refused(bad, "tensor 'layers.4.indexer.q': layer 4 is not a DSA layer of the descriptor")
    bad = dict(t, **{"layers.3.attn.kv": t["layers.3.attn.kv"].float()})
    refused(bad, "tensor 'layers.3.attn.kv' is F32 [41,1,32], expected BF16 [41,1,32]")
    refused(t, "metadata 'problem': kpool spec field 'k'", dict(meta, problem=meta["problem"].replace("k=16", "k=15")))
    r = run("golden", "--from", kp["dump"], "--problem", "sq=4", "--out", out, expect=2)
    assert "carries its own descriptor" in r.stderr + r.stdout and not out.exists()


def test_overlap_and_search_on_pools(kp, tmp_path):
    """overlap compares the DSA layers' own pools of a glm5_next dump and of its set (the same pools: the
    same inputs); search runs the greedy IndexCache search over them (an all-Full model: every layer has
    its indexer)."""
    import json

    out = {}
    for src, flag in ((kp["dump"], "--from"), (kp["golden"], "--golden")):
        j = tmp_path / "o.json"
        run("overlap", flag, src, "--json", j, expect=0)
        out[flag] = json.loads(j.read_text())
        assert out[flag]["dsa_layers"] == [3, 7]
    assert out["--from"]["matrix"] == out["--golden"]["matrix"]
    j = tmp_path / "s.json"
    run("search", "--from", kp["dump"], "--full-layers", "1", "--json", j, expect=0)
    s = json.loads(j.read_text())
    assert s["dsa_layers"] == [3, 7] and s["pattern"] == "FS" and s["loss"] == "output" and s["losses"][-1] > 0
