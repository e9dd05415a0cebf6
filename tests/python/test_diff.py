"""indexshare.diff -> Report and testing.assert_matches: the CLI's judgement, text and JSON, on the
checked-in golden sets, with numpy and torch candidates."""
import json

import numpy as np
import pytest
import torch

import indexshare
from indexshare.testing import assert_matches

OUTPUTS = ("attn.out", "attn.lse", "attn.max_logits", "indexer.topk", "attn.indices")


def candidate_of(g, layers=None):
    """The golden's own outputs as a candidate (copies: the golden's views are read-only)."""
    c = {}
    for n, a in g.tensors.items():
        if any(n.endswith(o) for o in OUTPUTS) and (layers is None or int(n.split(".")[1]) in layers):
            c[n] = np.array(a)
    return c


@pytest.mark.parametrize("name", ["ties", "glm-5.2"])
def test_report_equals_the_cli_text_and_json(name, root, cli, tmp_path):
    gdir = root / "golden" / name
    g = indexshare.load_golden(gdir)
    c = candidate_of(g)
    c["layers.0.attn.out"][0, 0, :4] += 0.25  # one failure, so the text has mismatches and a diagnosis
    path = tmp_path / "cand.safetensors"
    indexshare.save_candidate(c, path)
    for cand in (c, path):
        r = indexshare.diff(gdir, cand)
        assert not r.passed and r.status(0, "attn.out") == "FAIL"
        cl = cli("diff", "--golden", gdir, "--candidate", path, "--json", tmp_path / "r.json")
        assert cl.returncode == 1
        text = str(r) if cand is path else str(r).replace("CANDIDATE.safetensors", str(path))
        assert text == cl.stdout
        assert r.to_json() == (tmp_path / "r.json").read_text()
        assert r.data == json.loads(cl.stdout and (tmp_path / "r.json").read_text())


def test_pass_with_numpy_torch_and_a_loaded_or_in_memory_golden(root, capsys):
    g = indexshare.load_golden(root / "golden/glm-5.2")
    c = candidate_of(g)
    assert indexshare.diff(g, c).passed
    tc = {n: torch.from_numpy(a) for n, a in c.items()}
    r = assert_matches(g, tc)
    assert r.passed and all(t["verdict"] == "PASS" for t in r.tensors)
    assert set(r.checked) == set(c)
    mem = indexshare.golden(preset="ties")
    assert assert_matches(mem, candidate_of(mem)).passed
    # layer_list= (diff --layer-list) judges only those layers; layers=, its old name, still works with a
    # one-line notice on stderr, and is named in the replay line as --layer-list.
    r = indexshare.diff(g, c, layer_list=[1])
    assert {t["layer"] for t in r.tensors} == {1}
    capsys.readouterr()
    old = indexshare.diff(g, c, layers=[1])
    assert capsys.readouterr().err == "indexshare: layers= is now layer_list=; the old name works for this release\n"
    assert old.to_json() == r.to_json() and "--layer-list 1" in str(r)
    assert assert_matches(g, c, layers="1").passed
    assert "layers= is now layer_list=" in capsys.readouterr().err
    with pytest.raises(TypeError, match="give layer_list= only"):
        indexshare.diff(g, c, layer_list=[1], layers=[1])


def test_bf16_out_and_torch_bf16(root):
    g = indexshare.load_golden(root / "golden/ties", framework="torch")
    c = {"layers.0.attn.out": g.tensors["layers.0.attn.out_bf16"].clone()}
    assert assert_matches(g.dir, c).passed


def test_assert_matches_raises_with_the_report(root):
    g = indexshare.load_golden(root / "golden/ties")
    c = candidate_of(g)
    c["layers.0.attn.lse"] = c["layers.0.attn.lse"] / np.float32(np.log(2))  # base 2
    with pytest.raises(AssertionError) as e:
        assert_matches(g, c)
    assert "attn.lse is in base 2" in str(e.value)
    assert e.value.report.status(0, "attn.lse") == "FAIL"


def test_bad_candidates_raise_naming_the_tensor(root):
    g = root / "golden/ties"
    out = np.zeros((16, 2, 512), np.float32)
    with pytest.raises(ValueError, match="layers.0.attn.out"):
        indexshare.diff(g, {"layers.0.attn.out": out[:, :1]})
    with pytest.raises(ValueError, match="layers.0.attn.out"):
        indexshare.diff(g, {"layers.0.attn.out": out.astype(np.float64)})
    with pytest.raises(ValueError, match="layers.9"):
        indexshare.diff(g, {"layers.9.attn.out": out})
    with pytest.raises(ValueError, match="empty"):
        indexshare.diff(g, {})
    with pytest.raises(TypeError, match="candidate"):
        indexshare.diff(g, [out])
    with pytest.raises(ValueError, match="device"):
        indexshare.diff(g, {"layers.0.attn.out": torch.zeros(16, 2, 512, device="meta")})


def test_precision_bf16_logits_fail_by_name_unless_declared(root, cli, tmp_path):
    """An indexer whose logits are rounded to bf16 is inside every bound, but carries bf16-level error:
    the default contract fails it by name, a declared logits=bf16 contract passes it, as the CLI does."""
    import ml_dtypes

    gdir = root / "golden" / "deepseek-v3.2"
    g = indexshare.load_golden(gdir)
    name = next(n for n in g.tensors if n.endswith("indexer.logits"))
    lg = np.array(g.tensors[name], dtype=np.float32)
    c = {name: lg.astype(ml_dtypes.bfloat16).astype(np.float32)}
    r = indexshare.diff(g, c)
    assert not r.passed
    assert any("bf16-level error" in d for d in r.data["diagnoses"])
    assert "precision contract: logits=fp8mma (default)" in str(r)
    d = indexshare.diff(g, c, precision="logits=bf16")
    assert d.passed and d.data["precision_contract"]["logits"] == "bf16"
    assert "--precision logits=bf16" in str(d)
    path = tmp_path / "cand.safetensors"
    indexshare.save_candidate(c, path)
    assert cli("diff", "--golden", gdir, "--candidate", path).returncode == 1
    assert cli("diff", "--golden", gdir, "--candidate", path, "--precision", "logits=bf16").returncode == 0
    bad = cli("diff", "--golden", gdir, "--candidate", path, "--precision", "logits=bf8", check=False)
    assert bad.returncode == 2 and "logits has the classes f32, fp8mma, f16, bf16" in bad.stderr
    with pytest.raises(ValueError, match="attn takes f32 alone"):
        indexshare.diff(g, c, precision="attn=bf16-acc")
