"""The transformers bridge (tools/python/indexshare/dump.py) end to end, on tiny random models.

Each model is built here from a config (no download, CPU, bf16), dumped with
indexshare.dump, then handed to the CLI (env INDEXSHARE_CLI, the built `indexshare` binary):
`golden --from` builds the golden set from the dumped inputs and `diff` judges the model's own
top-k (carried in the dump) against it. Expected values come from the model (its own top-k,
captured by this file's hooks or by the dump) and from formulas written here (YaRN's mscale),
never from the code under test.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest

import torch  # the project venv has them (tools/setup.sh): a missing one fails, never skips
import transformers
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from indexshare import dump as D  # noqa: E402
from cli_run import run  # noqa: E402

S = 48  # tokens: rows 8..47 choose among more keys than top-k
K = 8


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


MLA = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8,
           v_head_dim=16, qk_nope_head_dim=16)
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
              num_experts_per_tok=2, index_topk=K, index_head_dim=16, index_n_heads=4, first_k_dense_replace=1,
              max_position_embeddings=256, **MLA)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def peaked(model):
    """Random init gives MLA logits of rms 0.02 (uniform attention, where a wrong softmax scale is
    invisible); q_b_proj, kv_b_proj and kv_a_proj x 10 give logits of rms ~2, peaked like a trained
    model's (the latent c is normalised, so k_nope, v and k_rope grow x 10, q x 10)."""
    with torch.no_grad():
        for layer in model.model.layers:
            for lin in (layer.self_attn.q_b_proj, layer.self_attn.kv_b_proj, layer.self_attn.kv_a_proj_with_mqa):
                lin.weight.mul_(10)
    return model


def glm_model(pattern="FFSFS", seed=0, attn="sdpa"):
    cfg = transformers.GlmMoeDsaConfig(num_hidden_layers=len(pattern), index_topk_pattern=pattern, **COMMON)
    torch.manual_seed(seed)
    # dtype at construction, as from_pretrained(dtype=bfloat16) loads: inv_freq and the router stay f32
    return peaked(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=attn).eval())


def v32_model(layers=3, seed=1):
    cfg = transformers.DeepseekV32Config(num_hidden_layers=layers, rope_parameters=dict(YARN), n_group=1, topk_group=1,
                                         **COMMON)
    torch.manual_seed(seed)
    return peaked(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval())


def tokens(seed=0):
    return torch.randint(0, 256, (1, S), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("dump")


@pytest.fixture(scope="module")
def glm(work):
    model = glm_model()
    ids = tokens()
    # The model's raw top-k, straight from its own indexers and attentions (not through the bridge).
    raw = {}
    handles = []
    for i, layer in enumerate(model.model.layers):
        if layer.self_attn.indexer is not None:
            handles.append(layer.self_attn.indexer.register_forward_hook(
                lambda m, a, o, i=i: raw.__setitem__(("own", i), o[0].clone())))
        handles.append(layer.self_attn.register_forward_hook(
            lambda m, a, o, i=i: raw.__setitem__(("used", i), o[2][0].clone())))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in handles:
        h.remove()
    out = work / "glm.safetensors"
    meta = D.dump(model, ids, str(out))
    gold = work / "glm-golden"
    run("golden", "--from", out, "--out", gold, expect=0)
    return dict(model=model, ids=ids, dump=out, meta=meta, golden=gold, raw=raw)


@pytest.fixture(scope="module")
def v32(work):
    model = v32_model()
    out = work / "v32.safetensors"
    meta = D.dump(model, tokens(1), str(out))
    gold = work / "v32-golden"
    run("golden", "--from", out, "--out", gold, expect=0)
    return dict(model=model, dump=out, meta=meta, golden=gold)


def judged(text: str) -> dict[tuple[int, str], str]:
    """(layer, tensor) -> PASS/FAIL/MISTRUSTED from diff's per-layer lines."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "layer" and parts[2] in ("PASS", "FAIL", "MISTRUSTED"):
            out[(int(parts[1]), parts[3])] = parts[2]
    return out


def diff_json(golden, candidate, tmp_path, expect):
    report = tmp_path / "report.json"
    r = run("diff", "--golden", golden, "--candidate", candidate, "--json", report, expect=expect)
    return r, json.loads(report.read_text())


def statuses(rep) -> dict[tuple[int, str], str]:
    return {(t["layer"], t["tensor"]): t["verdict"] for t in rep["tensors"]}


# --- GLM-5 (glm_moe_dsa): interleaved indexer RoPE, sharing ----------------------------------------

def test_glm_dump_metadata(glm):
    m = glm["meta"]
    assert m["format"] == "indexshare-dump" and m["model_type"] == "glm_moe_dsa"
    assert m["schedule"] == "FFSFS" and m["tokens"] == str(S) and m["self_check"] == "pass"
    # 16 nope + 8 rope: qk_head_dim^-0.5, no YaRN
    # sm in its shortest round-trip form: f32(24^-0.5) = 0.204124153..., and 0.20412415 reads back as it
    assert m["problem"] == f"k{K} dv32 sm=0.20412415 indexer=bf16 sched=FFSFS"
    assert f32(0.20412415) == f32(24 ** -0.5) and f32(0.2041241) != f32(24 ** -0.5)
    assert m["indexer_rope"] == "interleave"


def test_glm_model_topk_passes_diff(glm, tmp_path):
    r, rep = diff_json(glm["golden"], glm["dump"], tmp_path, expect=0)
    st = statuses(rep)
    for layer in (0, 1, 3):  # Full layers: own top-k, own logits
        assert st[(layer, "indexer.topk")] == "PASS"
        assert st[(layer, "indexer.logits")] == "PASS"
    for layer in range(5):
        assert st[(layer, "attn.indices")] == "PASS"
        assert st[(layer, "attn.model_out")] == "PASS"  # the model's own attention (sdpa), Shared layers included


def test_masked_future_slots_become_minus_one(glm):
    dumped = load_file(str(glm["dump"]))
    for layer in (0, 1, 3):
        raw = glm["raw"][("own", layer)].long()
        got = dumped[f"layers.{layer}.indexer.topk"].long()
        assert raw.shape == (S, K)
        for t in range(S):
            valid = raw[t][raw[t] <= t]
            n = min(t + 1, K)
            assert valid.numel() == n  # HF keeps K slots, future ones among them for t + 1 < K
            assert torch.equal(got[t, :n], valid) and bool((got[t, n:] == -1).all())
        assert bool((raw[: K - 1] > torch.arange(K - 1).unsqueeze(1)).any())  # there were future slots


def test_shared_layers_used_their_source_positions(glm):
    dumped = load_file(str(glm["dump"]))
    sources = {2: 1, 4: 3}
    for shared, src in sources.items():
        # what the model's Shared layer attended over is exactly its source layer's own top-k
        assert torch.equal(glm["raw"][("used", shared)], glm["raw"][("own", src)])
        assert torch.equal(dumped[f"layers.{shared}.attn.indices"][:, 0], dumped[f"layers.{src}.indexer.topk"])
    manifest = json.loads((glm["golden"] / "manifest.json").read_text())
    roles = [(x["kind"], x["source"]) for x in manifest["layers"]]
    assert [r for r, _ in roles] == ["full", "full", "shared", "full", "shared"]
    assert roles[2][1] == 1 and roles[4][1] == 3


def test_shared_layer_with_wrong_positions_fails(glm, tmp_path):
    """Fault injection: a Shared layer handed another Full layer's positions fails diff."""
    t = load_file(str(glm["dump"]))
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    t["layers.4.attn.indices"] = t["layers.0.indexer.topk"].unsqueeze(1).clone()
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=meta)
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    assert statuses(rep)[(4, "attn.indices")] == "FAIL"
    assert "layer 0" in r.stdout or "Full layer" in r.stdout


def test_glm_dropped_winner_fails(glm, tmp_path):
    """Fault injection: one selected position swapped for a losing one fails indexer.topk."""
    t = load_file(str(glm["dump"]))
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    topk = t["layers.1.indexer.topk"].clone()
    row = S - 1
    logits = t["layers.1.indexer.logits"][row]
    losers = [s for s in torch.argsort(logits).tolist() if s not in topk[row].tolist() and logits[s] > -math.inf]
    topk[row, 0] = losers[0]
    t["layers.1.indexer.topk"] = topk
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=meta)
    _, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    assert statuses(rep)[(1, "indexer.topk")] == "FAIL"


def test_negative_control_swapped_indexer_rope_fails_with_diagnosis(glm, work, tmp_path):
    out = work / "glm-half.safetensors"
    meta = D.dump(glm["model"], glm["ids"], str(out), indexer_rope="half")
    assert meta["indexer_rope"] == "half" and meta["model_indexer_rope"] == "interleave"
    gold = work / "glm-half-golden"
    run("golden", "--from", out, "--out", gold, expect=0)
    r, rep = diff_json(gold, out, tmp_path, expect=1)
    st = statuses(rep)
    # the model's logits disagree with the golden's beyond every bound, and so do the positions its
    # attention used (indexer.topk alone passes: it is the right top-k of the model's own logits)
    for layer in (0, 1, 3):
        assert st[(layer, "indexer.logits")] == "FAIL" and st[(layer, "attn.indices")] == "FAIL"
    assert "RoPE layout swapped (interleaved)" in r.stdout, r.stdout


def test_partial_problem_keeps_the_dumps_schedule_scale_and_dtype(glm, v32, tmp_path):
    # A partial --problem completes the recorded problem: the set is byte for byte the one written
    # without --problem (GLM's Shared layers, V3.2's YaRN scale, the bf16 indexer kept).
    for name, d in (("glm", glm), ("v32", v32)):
        own = (d["golden"] / "tensors.safetensors").read_bytes()
        for partial in (f"k{K} dv32", "dv32", f"k{K}"):
            out = tmp_path / f"{name}-{partial.replace(' ', '-')}"
            run("golden", "--from", d["dump"], "--problem", partial, "--out", out, expect=0)
            assert (out / "tensors.safetensors").read_bytes() == own, (name, partial)
            m = json.loads((out / "manifest.json").read_text())
            assert m["config"]["indexer"] == "bf16"
            assert f32(m["config"]["sm_scale"]) == f32(float(d["meta"]["problem"].split("sm=")[1].split()[0]))
        assert json.loads((out / "manifest.json").read_text())["problem"].endswith("sched=" + d["meta"]["schedule"])
    # A field that contradicts the dump is refused with both values; nothing is written.
    sm = glm["meta"]["problem"].split("sm=")[1].split()[0]
    for given, want in (("k32 sm=0.125", f"--problem gives 'k32' but the dump {glm['dump']} records 'k{K}'"),
                        ("sm=0.125", f"--problem gives 'sm=0.125' but the dump {glm['dump']} records 'sm={sm}'"),
                        ("sched=FFFFF", "records 'sched=FFSFS'"),
                        ("indexer=fp8", "has 'indexer=bf16' (from its tensors)"),
                        (f"sq{S + 1}", f"has 'sq{S}' (from its tensors)")):
        r = run("golden", "--from", glm["dump"], "--problem", given, "--out", tmp_path / "refused", expect=2)
        assert want in r.stderr + r.stdout, (given, r.stderr)
        assert not (tmp_path / "refused").exists()


def test_overlap_and_search_run_on_the_dump(glm, v32, tmp_path):
    js = tmp_path / "overlap.json"
    run("overlap", "--from", glm["dump"], "--json", js, expect=0)
    o = json.loads(js.read_text())
    assert o  # numbers for the model's layers
    js2 = tmp_path / "search.json"
    run("search", "--from", v32["dump"], "--full-layers", 2, "--json", js2, expect=0)
    s = json.loads(js2.read_text())
    assert s
    # GLM's Shared layers have no indexer: nothing to search, said so
    r = run("search", "--from", glm["dump"], "--full-layers", 2, expect=2)
    assert "cannot be searched" in r.stderr + r.stdout


def test_checkpoint_folder_gives_the_same_dump(glm, tmp_path):
    """--model DIR with weights loads them (from_pretrained, bf16) and dumps the same bytes."""
    ckpt = tmp_path / "ckpt"
    glm["model"].save_pretrained(ckpt)
    out = tmp_path / "ckpt.safetensors"
    assert D.main(["--model", str(ckpt), "--tokens", str(S), "--seed", "0", "--out", str(out)]) == 0
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["weights"] == "checkpoint"
    a, b = load_file(str(out)), load_file(str(glm["dump"]))
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


# --- DeepSeek-V3.2: half-split indexer RoPE, YaRN, every layer Full ----------------------------------

def test_v32_dump_passes_diff_with_yarn_scale(v32, tmp_path):
    m = v32["meta"]
    assert m["model_type"] == "deepseek_v32" and m["schedule"] == "FFF" and m["indexer_rope"] == "half"
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert m["problem"] == f"k{K} dv32 sm=0.3824989 indexer=bf16 sched=FFF"  # the shortest form of the f32
    assert f32(0.3824989) == f32(24 ** -0.5 * mscale * mscale) and f32(0.382499) != f32(24 ** -0.5 * mscale * mscale)
    _, rep = diff_json(v32["golden"], v32["dump"], tmp_path, expect=0)
    st = statuses(rep)
    for layer in range(3):
        assert st[(layer, "indexer.topk")] == "PASS" and st[(layer, "attn.indices")] == "PASS"
        assert st[(layer, "attn.model_out")] == "PASS"


def test_v32_swapped_rope_fails_topk_with_diagnosis(v32, work, tmp_path):
    """Without the model's logits in the dump, the swapped layout fails indexer.topk itself."""
    out = work / "v32-interleave.safetensors"
    D.dump(v32["model"], tokens(1), str(out), indexer_rope="interleave", with_logits=False)
    gold = work / "v32-interleave-golden"
    run("golden", "--from", out, "--out", gold, expect=0)
    r, rep = diff_json(gold, out, tmp_path, expect=1)
    st = statuses(rep)
    assert all(st[(layer, "indexer.topk")] == "FAIL" for layer in range(3))
    assert "indexer.topk is the top-k of the dump's indexer inputs with the RoPE layout swapped (half-split)" in r.stdout


# --- options and bad input ------------------------------------------------------------------------

def test_layers_subset_renumbers_and_needs_sources(glm, tmp_path):
    out = tmp_path / "sub.safetensors"
    meta = D.dump(glm["model"], glm["ids"], str(out), layers=[0, 3, 4], with_logits=False)
    assert meta["schedule"] == "FFS" and json.loads(meta["layers"]) == [0, 3, 4]
    full = load_file(str(glm["dump"]))
    sub = load_file(str(out))
    assert torch.equal(sub["layers.1.indexer.q"], full["layers.3.indexer.q"])
    assert "layers.0.indexer.logits" not in sub
    # the forward stops after the last dumped layer; what came before is unchanged
    early = tmp_path / "early.safetensors"
    assert D.dump(glm["model"], glm["ids"], str(early), layers=[0, 1])["schedule"] == "FF"
    e = load_file(str(early))
    assert sorted(e) == sorted(n for n in full if n.startswith(("layers.0.", "layers.1.")))
    assert all(torch.equal(e[n], full[n]) for n in e)
    with pytest.raises(D.DumpError, match="Shared layer 4 reuses Full layer 3"):
        D.dump(glm["model"], glm["ids"], str(tmp_path / "x.safetensors"), layers=[0, 1, 4])
    assert not (tmp_path / "x.safetensors").exists()


def test_cli_config_file_and_errors(tmp_path, capsys):
    cfg = dict(COMMON, model_type="glm_moe_dsa", num_hidden_layers=2, index_topk_pattern="FS")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "d.safetensors"
    assert D.main(["--model", str(path), "--tokens", "20", "--out", str(out)]) == 0
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["schedule"] == "FS"
    run("golden", "--from", out, "--out", tmp_path / "g", expect=0)
    run("diff", "--golden", tmp_path / "g", "--candidate", out, expect=0)
    # bad input: exit 2 and no output
    assert D.main(["--model", str(tmp_path / "none.json"), "--tokens", "4", "--out", str(tmp_path / "n")]) == 2
    assert D.main(["--model", str(path), "--out", str(tmp_path / "n")]) == 2
    assert D.main(["--model", str(path), "--tokens", "4", "--layer-list", "1", "--out", str(tmp_path / "n")]) == 2
    capsys.readouterr()
    # --layers, the old name of --layer-list: the same refusal, after a one-line notice
    assert D.main(["--model", str(path), "--tokens", "4", "--layers", "1", "--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("indexshare.dump: --layers is now --layer-list; the old name works for this release\n")
    assert "--layer-list: Shared layer 1" in err
    assert not (tmp_path / "n").exists()
    other = tmp_path / "llama.json"
    other.write_text(json.dumps({"model_type": "llama"}))
    assert D.main(["--model", str(other), "--tokens", "4", "--out", str(tmp_path / "n")]) == 2


def test_atomic_write_leaves_nothing_on_failure(glm, tmp_path, monkeypatch):
    import safetensors.torch as st

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", boom)
    with pytest.raises(OSError):
        D.dump(glm["model"], glm["ids"], str(tmp_path / "a.safetensors"))
    assert list(tmp_path.iterdir()) == []


def test_prompt_file_uses_the_checkpoint_tokenizer(glm, tmp_path):
    """--prompt-file tokenises with the checkpoint's tokenizer (a word-level one built here)."""
    import tokenizers
    ckpt = tmp_path / "ckpt"
    glm["model"].save_pretrained(ckpt)
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 256)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(ckpt)
    ids = tokens()[0].tolist()
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(" ".join(f"w{i}" if i else "[UNK]" for i in ids))
    out = tmp_path / "p.safetensors"
    assert D.main(["--model", str(ckpt), "--prompt-file", str(prompt), "--out", str(out)]) == 0
    # the same tokens as the in-memory dump: the same bytes
    a, b = load_file(str(out)), load_file(str(glm["dump"]))
    assert all(torch.equal(a[n], b[n]) for n in b)
    # --tokens N with a prompt keeps its first N; a config file has no tokenizer
    short = tmp_path / "short.safetensors"
    assert D.main(["--model", str(ckpt), "--prompt-file", str(prompt), "--tokens", "12", "--out", str(short)]) == 0
    with safe_open(str(short), "pt") as f:
        assert f.metadata()["tokens"] == "12"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(dict(COMMON, model_type="glm_moe_dsa", num_hidden_layers=1)))
    assert D.main(["--model", str(cfg), "--prompt-file", str(prompt), "--out", str(tmp_path / "n")]) == 2


def test_eager_attention_dump_passes(glm, tmp_path):
    """Eager attention hands the indexer a float mask (finfo.min added, not -inf): the self-check
    still holds, layer 0 (before any attention output) is the SDPA dump's to the bit, reference
    logits keep the future at -inf, and the dump passes diff. (Later layers differ from SDPA's:
    the two attentions round differently.)"""
    model = glm_model(attn="eager")
    out = tmp_path / "eager.safetensors"
    assert D.dump(model, glm["ids"], str(out))["self_check"] == "pass"
    a, b = load_file(str(out)), load_file(str(glm["dump"]))
    assert all(torch.equal(a[n], b[n]) for n in b if n.startswith("layers.0.") and n != "layers.0.attn.model_out")
    assert bool(torch.isneginf(a["layers.3.indexer.logits"].triu(1)[torch.ones(S, S).triu(1).bool()]).all())
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["attn_implementation"] == "eager" and f.metadata()["dtype"] == "bfloat16"
    gold = tmp_path / "g"
    run("golden", "--from", out, "--out", gold, expect=0)
    _, rep = diff_json(gold, out, tmp_path, expect=0)
    assert all(statuses(rep)[(layer, "attn.model_out")] == "PASS" for layer in range(5))


def test_memory_per_token_and_layer_matches_the_dump(glm):
    """tools/python/README.md's bytes per token and layer (dump.bytes_per_token_layer) against the tensors."""
    t = load_file(str(glm["dump"]))
    cfg = glm["model"].config
    for layer, full in enumerate([True, True, False, True, False]):
        n = sum(v.numel() * v.element_size() for name, v in t.items() if name.startswith(f"layers.{layer}."))
        assert n == S * D.bytes_per_token_layer(cfg, full, S) + D.bytes_per_layer(cfg), layer
    # tools/python/README.md's GLM-5 and DeepSeek-V3.2 figures
    glm5 = transformers.GlmMoeDsaConfig()
    assert (D.bytes_per_token_layer(glm5, False, 0), D.bytes_per_token_layer(glm5, True, 0, False)) == (140416, 157196)
    assert D.bytes_per_layer(glm5) == 29360128
    v32 = transformers.DeepseekV32Config()
    assert (D.bytes_per_token_layer(v32, False, 0), D.bytes_per_token_layer(v32, True, 0, False)) == (222336, 247436)
    assert D.bytes_per_layer(v32) == 33554432


# --- the model's own attention (attn.model_out): faults injected into the model's forward ---------

def model_out_fault(glm, tmp_path, layer, hooks):
    """The clean GLM dump with layer `layer`'s attn.model_out taken from a forward with `hooks`
    (module -> forward pre-hook with kwargs) on the model: the layers before it and the layer's own
    inputs are unchanged, so only the model's attention output of that layer carries the fault."""
    model = glm["model"]
    handles = [m.register_forward_pre_hook(h, with_kwargs=True) for m, h in hooks.items()]
    try:
        faulty = tmp_path / "faulty.safetensors"
        D.dump(model, glm["ids"], str(faulty), layers=list(range(layer + 1)), with_logits=False)
    finally:
        for h in handles:
            h.remove()
    t = load_file(str(glm["dump"]))
    name = f"layers.{layer}.attn.model_out"
    bad_out = load_file(str(faulty))[name]
    assert not torch.equal(bad_out, t[name])  # the fault reached the output
    t[name] = bad_out
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=meta)
    return bad


def test_model_attention_softmax_scale_off_fails(glm, tmp_path):
    attn = glm["model"].model.layers[3].self_attn
    sm = attn.scaling

    def scale(mod, args, kwargs):
        mod.scaling = sm * 1.01

    try:
        bad = model_out_fault(glm, tmp_path, 3, {attn: scale})
    finally:
        attn.scaling = sm
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    st = statuses(rep)
    assert st[(3, "attn.model_out")] == "FAIL"
    assert all(st[(layer, "attn.model_out")] == "PASS" for layer in (0, 1, 2, 4))
    assert re.search(r"attn.model_out matches a softmax scale off by \+(0\.9|1\.0)", r.stdout), r.stdout


def test_model_attention_shared_layer_over_another_layers_positions_fails(glm, tmp_path):
    topk0 = glm["raw"][("own", 0)].unsqueeze(0)

    def other(mod, args, kwargs):
        kwargs["prev_topk_indices"] = topk0  # layer 4 (Shared, source 3) handed layer 0's positions
        return args, kwargs

    bad = model_out_fault(glm, tmp_path, 4, {glm["model"].model.layers[4].self_attn: other})
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    assert statuses(rep)[(4, "attn.model_out")] == "FAIL"
    assert "attn.model_out is the model's attention over Full layer 0's positions instead of layer 3's" in r.stdout, r.stdout


def test_model_attention_dropped_position_fails(glm, tmp_path):
    row = S - 1
    topk = glm["raw"][("own", 1)].clone()
    dropped = int(topk[row, 0])
    topk[row, 0] = topk[row, 1]  # a duplicate: the mask loses one position of the last row
    topk = topk.unsqueeze(0)

    def drop(mod, args, kwargs):
        kwargs["prev_topk_indices"] = topk  # layer 2 (Shared, source 1)
        return args, kwargs

    bad = model_out_fault(glm, tmp_path, 2, {glm["model"].model.layers[2].self_attn: drop})
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    st = statuses(rep)
    assert st[(2, "attn.model_out")] == "FAIL" and st[(2, "attn.indices")] == "PASS"
    failed = next(t for t in rep["tensors"] if (t["layer"], t["tensor"]) == (2, "attn.model_out"))
    assert failed["stats"]["failed"] <= failed["stats"]["n"] // S  # that row's elements only
    assert f"attn.model_out row {row} is the model's attention without position {dropped}" in r.stdout, r.stdout


def test_model_attention_wrong_head_w_uv_fails(glm, tmp_path):
    t = load_file(str(glm["dump"]))
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    w = t["layers.0.attn.w_uv"]
    t["layers.0.attn.w_uv"] = w[[1, 0, 2, 3]].contiguous()  # heads 0 and 1 swapped: V of the wrong head
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=meta)
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    assert statuses(rep)[(0, "attn.model_out")] == "FAIL"
    assert "attn.model_out head 0 is its latent output mapped through head 1's W_uv" in r.stdout, r.stdout


def test_model_attention_small_systematic_error_fails(glm, tmp_path):
    """Sharpness: the model's output 0.2% too large on one layer, inside every element's bound,
    fails by the structure tests' scale test (floor 2^-11 = 0.05%)."""
    t = load_file(str(glm["dump"]))
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    t["layers.1.attn.model_out"] = t["layers.1.attn.model_out"].float() * 1.002
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=meta)
    r, rep = diff_json(glm["golden"], bad, tmp_path, expect=1)
    res = next(x for x in rep["tensors"] if (x["layer"], x["tensor"]) == (1, "attn.model_out"))
    assert res["verdict"] == "FAIL" and res["stats"]["failed"] == 0  # no element beyond its bound
    assert res["structure"]["flagged"], res
    assert re.search(r"attn.model_out scale error 1.00(1[5-9]|2[0-5])", r.stdout), r.stdout


def test_model_attention_bound_is_not_loose(glm, tmp_path):
    """The per-element bound against the model's real rounding: used, not vacuous (the model's
    error reaches a tenth of it somewhere), on every layer."""
    _, rep = diff_json(glm["golden"], glm["dump"], tmp_path, expect=0)
    for x in rep["tensors"]:
        if x["tensor"] == "attn.model_out":
            assert 0.05 < x["stats"]["max_err_over_bound"] < 1, x


def test_model_attention_bad_input_is_refused(glm, tmp_path):
    """An attention implementation or dtype the bound is not derived for, or a mis-shaped W_uv:
    exit 2 naming the file, tensor and field."""
    t = load_file(str(glm["dump"]))
    with safe_open(str(glm["dump"]), "pt") as f:
        meta = f.metadata()
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad), metadata=dict(meta, attn_implementation="flash_attention_2"))
    r = run("diff", "--golden", glm["golden"], "--candidate", bad, expect=2)
    assert "attn_implementation is 'flash_attention_2'" in r.stderr
    t["layers.0.attn.w_uv"] = t["layers.0.attn.w_uv"][:, :-1].contiguous()
    save_file(t, str(bad), metadata=meta)
    r = run("diff", "--golden", glm["golden"], "--candidate", bad, expect=2)
    assert "layers.0.attn.w_uv" in r.stderr
    with pytest.raises(D.DumpError, match="bf16 models"):
        D.dump(glm_model().float(), glm["ids"], str(tmp_path / "f32.safetensors"))
