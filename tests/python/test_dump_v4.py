"""The transformers bridge on DeepSeek-V4 (tools/python/indexshare/_v4.py) end to end, and overlap /
search on V4 block indices (ref/v4/sharing.h).

A tiny random deepseek_v4 model (f32, CPU, no download; SWA, C4A, HCA, C4A, C4A layers) is dumped
with indexshare.dump; `golden --from` builds a v4 golden set from the dumped inputs and `diff`
judges the model's own compressor entries, indexer scores and blocks, and attention outputs
(carried in the dump) against it. Planted mistakes come from the model itself: its forward run
again with one fault (the sink left out, the window or the compressed entries masked away, the
inverse RoPE skipped, the blocks off by one) and that layer's outputs spliced into the clean dump.
The overlap and search figures are checked against counts and errors computed here from the set's
own tensors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from indexshare import dump as D
from cli_run import diff_verdicts, model_dump, run

M = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

T = 64
TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention", "compressed_sparse_attention"]
CONFIG = dict(
    model_type="deepseek_v4", vocab_size=64, hidden_size=64, num_hidden_layers=len(TYPES), num_attention_heads=2,
    head_dim=64, q_lora_rank=32, partial_rotary_factor=16 / 64, sliding_window=8, o_groups=1, o_lora_rank=16,
    index_n_heads=4, index_head_dim=32, index_topk=4, layer_types=TYPES,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                     "beta_slow": 1},
    max_position_embeddings=512, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    mlp_layer_types=["moe"] * len(TYPES))
SPEC = "t=64 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 ctx=32 types=SCHCC sched=FFF rot=hf"


def diff(golden, candidate, tmp_path, expect):
    return diff_verdicts(golden, candidate, tmp_path / "diff.json", expect)


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    return model_dump(tmp_path_factory.mktemp("v4"), CONFIG, T)


def splice(v4, tmp_path, layer, names, faulty=None, edit=None):
    """The clean dump with `layer`'s tensors `names` taken from a dump of the faulty model (the layers
    before it, and the layer's own inputs, unchanged) or rewritten by edit(tensors)."""
    t = load_file(str(v4["dump"]))
    if faulty is not None:
        f = tmp_path / "faulty.safetensors"
        D.dump(v4["model"], v4["ids"], str(f), layers=list(range(layer + 1)))
        bad = load_file(str(f))
        for n in names:
            assert not torch.equal(bad[f"layers.{layer}.{n}"], t[f"layers.{layer}.{n}"]), n  # the fault reached it
            t[f"layers.{layer}.{n}"] = bad[f"layers.{layer}.{n}"]
    if edit is not None:
        edit(t)
    with safe_open(str(v4["dump"]), "pt") as f:
        meta = f.metadata()
    out = tmp_path / "bad.safetensors"
    save_file(t, str(out), metadata=meta)
    return out


def test_dump_holds_the_v4_inputs_and_the_models_own_outputs(v4):
    m = v4["meta"]
    assert m["kind"] == "v4" and m["model_type"] == "deepseek_v4" and m["problem"] == SPEC
    assert m["schedule"] == "FFF" and m["dtype"] == "float32"
    t = load_file(str(v4["dump"]))
    assert t["layers.0.attn.q"].dtype == torch.bfloat16 and list(t["layers.0.attn.q"].shape) == [T, 2, 64]
    assert list(t["layers.0.attn.kv"].shape) == [T, 1, 64]
    assert "layers.0.compressor.kv" not in t  # SWA
    assert list(t["layers.1.compressor.kv"].shape) == [T, 128] and list(t["layers.2.compressor.kv"].shape) == [T, 64]
    assert "layers.2.indexer.q" not in t  # HCA: no indexer
    blocks = t["layers.1.indexer.blocks"]
    assert blocks.dtype == torch.int32 and list(blocks.shape) == [T, 4]
    # -1 exactly past each row's causal blocks floor((t + 1) / 4)
    for row in range(T):
        valid = min((row + 1) // 4, 4)
        assert (blocks[row, :valid] >= 0).all() and (blocks[row, valid:] == -1).all(), row
    # the model's scores are -inf exactly on the non-causal blocks
    s = t["layers.3.indexer.scores"]
    future = torch.arange(16)[None, :] >= ((torch.arange(T) + 1) // 4)[:, None]
    assert torch.isneginf(s[future]).all() and torch.isfinite(s[~future]).all()
    # the sinks are random (transformers' init is 0), as the dump's random weights say
    assert (t["layers.0.attn.sink"] != 0).all() and "sinks" in m["weights"]


def test_memory_per_token_and_layer_matches_the_dump(v4):
    """tools/python/README.md's V4 bytes per token and layer (_v4.bytes_per_token_layer) against the tensors."""
    from indexshare import _v4
    t = load_file(str(v4["dump"]))
    cfg = v4["model"].config
    for layer, kind in enumerate("SCHCC"):
        n = sum(x.numel() * x.element_size() for name, x in t.items() if name.startswith(f"layers.{layer}."))
        assert n == T * _v4.bytes_per_token_layer(cfg, kind, T) + _v4.bytes_per_layer(cfg, kind), layer
    flash = transformers.DeepseekV4Config()  # V4-Flash's attention shapes
    assert [_v4.bytes_per_token_layer(flash, kind, 0) for kind in "SHC"] == [328704, 332816, 372608]
    assert _v4.bytes_per_token_layer(flash, "C", 4096) - _v4.bytes_per_token_layer(flash, "C", 0) == 2048 + 4096


def test_model_passes_diff_against_its_golden(v4, tmp_path):
    _, st = diff(v4["golden"], v4["dump"], tmp_path, expect=0)
    for layer, kind in enumerate("SCHCC"):
        want = ["attn.out", "attn.out_rotated"]
        if kind != "S":
            want.append("compressor.entries")
        if kind == "C":
            want += ["indexer.entries", "indexer.scores", "indexer.blocks"]
        for name in want:
            assert st[(layer, name)] == "PASS", (layer, name)


def test_sink_left_out_fails_with_its_name(v4, tmp_path):
    attn = v4["model"].model.layers[3].self_attn
    sinks = attn.sinks.data.clone()
    attn.sinks.data.fill_(float("-inf"))  # exp(-inf) = 0: the sink's term gone from the softmax
    try:
        bad = splice(v4, tmp_path, 3, ["attn.out", "attn.out_rotated"], faulty=True)
    finally:
        attn.sinks.data.copy_(sinks)
    r, st = diff(v4["golden"], bad, tmp_path, expect=1)
    assert st[(3, "attn.out")] == "FAIL" and st[(1, "attn.out")] == "PASS"
    assert "layer 3: attn.out is the attention without the sink (the sink ignored)" in r.stdout, r.stdout


@pytest.mark.parametrize("part, name", [("window", "without its sliding window"),
                                        ("compressed", "without the compressed entries")])
def test_window_or_compressed_part_missing_fails_with_its_name(v4, tmp_path, monkeypatch, part, name):
    original = M.eager_attention_forward

    def masked(module, query, key, value, attention_mask, scaling, **kw):
        if module.layer_idx == 4:
            cols = slice(0, T) if part == "window" else slice(T, None)
            attention_mask = attention_mask.clone()
            attention_mask[..., cols] = float("-inf")
        return original(module, query, key, value, attention_mask, scaling, **kw)

    monkeypatch.setattr(M, "eager_attention_forward", masked)
    bad = splice(v4, tmp_path, 4, ["attn.out", "attn.out_rotated"], faulty=True)
    monkeypatch.undo()
    r, st = diff(v4["golden"], bad, tmp_path, expect=1)
    assert st[(4, "attn.out")] == "FAIL"
    assert f"layer 4: attn.out is the attention {name}" in r.stdout, r.stdout


def test_inverse_rope_skipped_fails_with_its_name(v4, tmp_path):
    def edit(t):
        t["layers.2.attn.out_rotated"] = t["layers.2.attn.out"].clone()

    r, st = diff(v4["golden"], splice(v4, tmp_path, 2, [], edit=edit), tmp_path, expect=1)
    assert st[(2, "attn.out_rotated")] == "FAIL" and st[(2, "attn.out")] == "PASS"
    assert "layer 2: attn.out_rotated is the kernel output without the inverse RoPE" in r.stdout, r.stdout


def test_blocks_off_by_one_fail_with_their_name(v4, tmp_path):
    def edit(t):
        b = t["layers.3.indexer.blocks"]
        t["layers.3.indexer.blocks"] = torch.where(b >= 0, b + 1, b)

    r, st = diff(v4["golden"], splice(v4, tmp_path, 3, [], edit=edit), tmp_path, expect=1)
    assert st[(3, "indexer.blocks")] == "FAIL"
    assert "layer 3: indexer.blocks are the golden's shifted by 1 block (an off-by-one block number)" in r.stdout, r.stdout


def test_bad_dumps_are_refused_by_name(v4, tmp_path):
    t = load_file(str(v4["dump"]))
    with safe_open(str(v4["dump"]), "pt") as f:
        meta = f.metadata()
    cases = []
    missing = {n: x for n, x in t.items() if n != "layers.3.indexer.q"}
    cases.append((missing, meta, "tensor 'layers.3.indexer.q' is missing"))
    nan = dict(t)
    nan["layers.1.compressor.gate"] = t["layers.1.compressor.gate"].clone()
    nan["layers.1.compressor.gate"][5, 7] = float("nan")
    cases.append((nan, meta, "tensor 'layers.1.compressor.gate': element [5,7] is NaN"))
    freq = json.loads(meta["compress_inv_freq"])
    freq[3] *= 1.001
    cases.append((t, dict(meta, compress_inv_freq=json.dumps(freq)), "metadata 'compress_inv_freq'[3]"))
    cases.append((dict(t, **{"layers.5.attn.q": t["layers.0.attn.q"].clone()}), meta, "layer 5 is outside the descriptor's 5 layers"))
    cases.append((dict(t, **{"layers.0.attn.sinks": t["layers.0.attn.sink"].clone()}), meta, "'layers.0.attn.sinks' is not a v4 dump name"))
    for i, (tensors, m, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.safetensors"
        save_file(tensors, str(path), metadata=m)
        r = run("golden", "--from", path, "--out", tmp_path / f"g{i}", expect=2)
        assert message in r.stderr, (message, r.stderr)
        assert not (tmp_path / f"g{i}").exists()
    r = run("golden", "--from", v4["dump"], "--problem", "k8", "--out", tmp_path / "gp", expect=2)
    assert "carries its V4 descriptor" in r.stderr


def test_dump_refuses_what_a_v4_set_cannot_express(v4, tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(CONFIG))
    model, _, _ = D.load_model(str(path), "cpu", 0)
    with pytest.raises(D.DumpError, match="float32"):
        D.dump(model.to(torch.bfloat16), v4["ids"], str(tmp_path / "b.safetensors"))
    assert not (tmp_path / "b.safetensors").exists()
    cfg = dict(CONFIG, rope_parameters=dict(CONFIG["rope_parameters"], factor=8.0))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    assert D.main(["--model", str(path), "--tokens", "16", "--out", str(tmp_path / "n.safetensors")]) == 2
    assert not (tmp_path / "n.safetensors").exists()


# --- overlap and search on V4 block indices --------------------------------------------------------

def causal_blocks(row):
    return min((row + 1) // 4, T // 4)


def mean_overlap(a, b, k=4):
    vals = [len(set(a[r].tolist()) & set(b[r].tolist())) / k for r in range(T) if causal_blocks(r) > k]
    return sum(vals) / len(vals), len(vals)


def test_overlap_of_a_dump_counts_the_c4a_layers_blocks(v4, tmp_path):
    out = tmp_path / "o.json"
    r = run("overlap", "--from", v4["dump"], "--json", out, expect=0)
    rep = json.loads(out.read_text())
    assert rep["schedule"] == "FFF" and rep["n_layers"] == 3 and rep["c4a_layers"] == [1, 3, 4]
    g = load_file(str(v4["golden"] / "tensors.safetensors"))
    blocks = [g[f"layers.{layer}.indexer.blocks"] for layer in (1, 3, 4)]
    mean01, n = mean_overlap(blocks[0], blocks[1])
    assert rep["trivial_rows"] == T - n
    assert abs(rep["matrix"]["overlap"][0][1] - mean01) < 1e-12
    assert abs(rep["matrix"]["overlap"][1][2] - mean_overlap(blocks[1], blocks[2])[0]) < 1e-12
    assert f"indexshare overlap --from {v4['dump']}" in r.stdout
    # the golden set of the dump gives the same figures, and indexshare.overlap the CLI's JSON
    run("overlap", "--golden", v4["golden"], "--json", tmp_path / "g.json", expect=0)
    from_set = json.loads((tmp_path / "g.json").read_text())
    assert from_set["matrix"] == rep["matrix"]
    import indexshare
    assert indexshare.overlap(v4["golden"]) == from_set
    assert indexshare.overlap(str(v4["golden"]), impl="ref") == from_set


def test_overlap_of_a_shared_schedule_and_its_refusals(tmp_path):
    spec = "t=64 h=2 d=64 w=8 csa=4 hca=8 ih=4 id=32 k=4 rope=16 types=SCHCCC sched=FSFS"
    out = tmp_path / "o.json"
    run("overlap", "--problem", spec, "--json", out, expect=0)
    rep = json.loads(out.read_text())
    assert rep["schedule"] == "FSFS" and rep["c4a_layers"] == [1, 3, 4, 5]
    assert [x["source"] for x in rep["layers"]] == [0, 0, 2, 2]
    r = run("overlap", "--problem", spec.replace("FSFS", "SFFS"), expect=2)
    assert "v4 spec field 'sched': v4 schedule pattern: must start with F, got 'SFFS'" in r.stderr, r.stderr
    r = run("search", "--problem", spec, "--loss", "kl", expect=2)
    assert "--loss output only" in r.stderr


def test_search_on_a_dump_flips_c4a_layers_by_their_output_error(v4, tmp_path):
    from indexshare._core_loader import core
    c = core()
    out = tmp_path / "s.json"
    run("search", "--from", v4["dump"], "--full-layers", "1", "--json", out, expect=0)
    rep = json.loads(out.read_text())
    assert rep["n_layers"] == 3 and rep["c4a_layers"] == [1, 3, 4]
    assert rep["pattern"].startswith("F") and rep["pattern"].count("F") == 1
    # The first step's candidate losses, recomputed here from the golden set's tensors: C4A rank j
    # attending over rank j - 1's blocks, relative Frobenius error against its own, / 3.
    g = load_file(str(v4["golden"] / "tensors.safetensors"))
    layers = (1, 3, 4)
    rope = (16, 160000.0, True, 16.0, 32, 32.0, 1.0)

    def attend(layer, blocks):
        q = g[f"layers.{layer}.attn.q"].view(torch.int16).numpy().view(np.uint16)
        kv = g[f"layers.{layer}.attn.kv"][:T, 0].contiguous().view(torch.int16).numpy().view(np.uint16)
        return c.v4_attend(np.ascontiguousarray(q), np.ascontiguousarray(kv), g[f"layers.{layer}.attn.sink"].numpy(),
                           g[f"layers.{layer}.compressor.entries"].numpy(), blocks, "C", 8, 8, rope, c.Impl.ref)[0]

    own = {layer: g[f"layers.{layer}.indexer.blocks"].numpy() for layer in layers}
    want = []
    for j in (1, 2):
        ref = attend(layers[j], own[layers[j]]).astype(np.float64)
        got = attend(layers[j], own[layers[j - 1]]).astype(np.float64)
        want.append(np.linalg.norm(got - ref) / np.linalg.norm(ref) / 3)
    step = rep["steps"][0]
    assert [x["layer"] for x in step["candidates"]] == [1, 2]
    assert np.allclose([x["loss"] for x in step["candidates"]], want, rtol=1e-9, atol=0), (step, want)
