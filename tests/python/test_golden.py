"""indexshare.Problem, golden(), GoldenSet.save, load_golden: against the CLI's bytes and an independent
reader (the stock safetensors parser + ml_dtypes)."""
import hashlib
import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import deserialize
from safetensors.torch import load_file

import indexshare

ST = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BF16": ml_dtypes.bfloat16,
      "F8_E4M3": ml_dtypes.float8_e4m3fn}


def read_independently(path):
    with open(path, "rb") as f:
        raw = f.read()
    return {n: np.frombuffer(bytes(i["data"]), dtype=ST[i["dtype"]]).reshape(i["shape"]) for n, i in deserialize(raw)}


def files_of(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in ("manifest.json", "tensors.safetensors")}


def test_problem_parse_canonical_fields():
    p = indexshare.Problem("skv256  sq64 hq4 k32 nl4 sched=FSFS seed7")
    assert str(p) == "sq64 skv256 hq4 dqk576 dv512 ih8 id128 k32 seed7 nl4 sched=FSFS"
    assert p.s_q == 64 and p.s_kv == 256 and p.h_q == 4 and p.index_topk == 32 and p.n_layers == 4
    assert p.schedule == "FSFS" and p.d_qk == 576 and p.sm_scale == pytest.approx(576 ** -0.5)
    assert indexshare.Problem(str(p)) == p
    with pytest.raises(ValueError, match="bogus"):
        indexshare.Problem("sq64 bogus7")
    with pytest.raises(ValueError, match="s_kv|skv"):
        indexshare.Problem("sq64 skv32")


# Kernel-level and module-level presets: GoldenSet.save writes the bytes the CLI writes. Both are
# written under the same relative folder (golden/NAME), so that the manifest's replay line (which
# names --out) is the same too; the tensors are also the checked-in set's.
@pytest.mark.parametrize("name", ["ties", "attention-edge", "short-rows", "decode", "module-tiny-glm"])
def test_golden_preset_saves_the_cli_bytes(name, root, cli, tmp_path, monkeypatch):
    (tmp_path / "cli").mkdir()
    cli("golden", "--preset", name, "--out", f"golden/{name}", cwd=tmp_path / "cli")
    g = indexshare.golden(preset=name)
    (tmp_path / "py").mkdir()
    monkeypatch.chdir(tmp_path / "py")
    g.save(f"golden/{name}")
    got = files_of(tmp_path / "py" / "golden" / name)
    assert got == files_of(tmp_path / "cli" / "golden" / name)
    assert got["tensors.safetensors"] == files_of(root / "golden" / name)["tensors.safetensors"]


def test_golden_problem_and_rows_equal_the_cli(cli, tmp_path, monkeypatch):
    problem = "sq32 skv96 hq2 dqk64 dv32 ih4 id32 k8 seed11 nseq2 nl4 sched=FFSS recency=0.25 sinks=2"
    (tmp_path / "cli").mkdir()
    (tmp_path / "py").mkdir()
    monkeypatch.chdir(tmp_path / "py")
    for i, (rows, args) in enumerate(((None, []), ("last:2,0,16-18,9", ["--rows", "last:2,0,16-18,9"]),
                                      ([31, 30, 0], ["--rows", "31,30,0"]))):
        cli("golden", "--problem", problem, *args, "--out", f"set{i}", cwd=tmp_path / "cli")
        want = files_of(tmp_path / "cli" / f"set{i}")
        g = indexshare.golden(problem, rows=rows)
        g.save(f"set{i}")
        assert files_of(f"set{i}") == want, rows
        # The replay line names the same command, less --out.
        assert json.loads(want["manifest.json"])["replay"] == g.replay + f" --out set{i}"


def test_golden_in_memory_tensors_manifest_roles(root):
    g = indexshare.golden(preset="ties")
    disk = read_independently(root / "golden/ties/tensors.safetensors")
    assert set(g.tensors) == set(disk)
    for n, a in g.tensors.items():
        assert a.dtype == disk[n].dtype and a.shape == disk[n].shape and a.tobytes() == disk[n].tobytes(), n
    m = json.load(open(root / "golden/ties/manifest.json"))
    assert g.config == m["config"] and g.layers == m["layers"]
    assert g.roles["layers.0.attn.out"] == "output" and g.roles["layers.0.attn.q"] == "input"
    assert not g.tensors["layers.0.attn.q"].flags.writeable  # views of the set's bytes


@pytest.mark.parametrize("name", ["ties", "glm-5.2", "module-tiny-glm"])
def test_load_golden_numpy_and_torch(name, root):
    d = root / "golden" / name
    g = indexshare.load_golden(d)
    disk = read_independently(d / "tensors.safetensors")
    assert set(g.tensors) == set(disk)
    for n, a in g.tensors.items():
        assert a.dtype == disk[n].dtype and a.shape == disk[n].shape and a.tobytes() == disk[n].tobytes(), n
    assert g.manifest == json.load(open(d / "manifest.json"))
    t = indexshare.load_golden(d, framework="torch").tensors
    ref = load_file(str(d / "tensors.safetensors"))
    assert set(t) == set(ref)
    for n in ref:
        assert t[n].dtype == ref[n].dtype and torch.equal(t[n].view(torch.uint8), ref[n].view(torch.uint8)), n
    assert g.summary().strip()


def test_load_golden_refuses_a_tampered_set(root, tmp_path):
    d = tmp_path / "ties"
    shutil.copytree(root / "golden/ties", d)
    raw = bytearray(open(d / "tensors.safetensors", "rb").read())
    raw[-1] ^= 1
    open(d / "tensors.safetensors", "wb").write(bytes(raw))
    with pytest.raises(ValueError, match="SHA-256|sha256"):
        indexshare.load_golden(d)
    with pytest.raises(ValueError, match="framework"):
        indexshare.load_golden(root / "golden/ties", framework="jax")


def test_golden_bad_arguments():
    with pytest.raises(ValueError, match="exactly one"):
        indexshare.golden("sq8 skv8", preset="ties")
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        indexshare.golden(preset="nope")
    with pytest.raises(ValueError, match="--rows|rows"):
        indexshare.golden("sq8 skv8 hq2 dqk64 dv32 ih2 id16 k4", rows="9")
    with pytest.raises(ValueError, match="impl"):
        indexshare.golden("sq8 skv8 hq2 dqk64 dv32 ih2 id16 k4", impl="gpu")


# for_kernel= and the layers= / seq= / seed= overrides are the CLI's --for, --layers, --seq, --seed: the
# same bytes (and replay line) for a problem, a kernel-level preset and a kernel preset, each option.
PAGED = "sq4 skv192 hq4 dqk576 dv512 ih32 id128 k64 seed4 nseq2"


@pytest.mark.parametrize("kwargs,args", [
    (dict(problem="sq8 skv256 hq64 k128 seed3 nl2 sched=FS", for_kernel="flashmla-sparse-prefill-sm90"),
     ["--problem", "sq8 skv256 hq64 k128 seed3 nl2 sched=FS", "--for", "flashmla-sparse-prefill-sm90"]),
    (dict(problem=PAGED, for_kernel="deepgemm-fp8-paged-mqa-logits"),  # adds context_lens
     ["--problem", PAGED, "--for", "deepgemm-fp8-paged-mqa-logits"]),
    (dict(preset="ties", layers=3), ["--preset", "ties", "--layers", "3"]),
    (dict(preset="ties", seq=48), ["--preset", "ties", "--seq", "48"]),
    (dict(preset="decode", seed=11), ["--preset", "decode", "--seed", "11"]),
    (dict(problem="sq16 skv64 hq2 dqk64 dv32 ih4 id16 k8 nl2", layers=3, seq=12, seed=0),
     ["--problem", "sq16 skv64 hq2 dqk64 dv32 ih4 id16 k8 nl2", "--layers", "3", "--seq", "12", "--seed", "0"]),
    (dict(preset="deepgemm-fp8-mqa-logits-sm100", seq=2048, layers=2, seed=5),  # a kernel preset: simd, its kernel
     ["--preset", "deepgemm-fp8-mqa-logits-sm100", "--seq", "2048", "--layers", "2", "--seed", "5"]),
], ids=["for-problem", "for-paged", "layers", "seq", "seed", "all-three", "kernel-preset"])
def test_golden_for_kernel_and_overrides_equal_the_cli(kwargs, args, cli, tmp_path, monkeypatch):
    (tmp_path / "cli").mkdir()
    (tmp_path / "py").mkdir()
    cli("golden", *args, "--out", "set", cwd=tmp_path / "cli")
    want = files_of(tmp_path / "cli" / "set")
    g = indexshare.golden(**kwargs)
    monkeypatch.chdir(tmp_path / "py")
    g.save("set")
    assert files_of("set") == want
    assert json.loads(want["manifest.json"])["replay"] == g.replay + " --out set"
    if "for_kernel" in kwargs or kwargs.get("preset", "").startswith("deepgemm"):
        assert "kernel" in g.manifest
    if "paged" in kwargs.get("for_kernel", ""):
        assert "context_lens" in g.tensors


def test_golden_for_kernel_and_overrides_refused_as_the_cli(cli, tmp_path):
    small = "sq8 skv256 hq64 k64 seed3"
    cases = [  # (python kwargs, CLI args, the message both give)
        (dict(problem=small, for_kernel="flashmla-sparse-prefill-sm90"),
         ["--problem", small, "--for", "flashmla-sparse-prefill-sm90"], "takes a multiple of 128"),
        (dict(problem=small, for_kernel="nope"), ["--problem", small, "--for", "nope"], "nope"),
        (dict(problem=PAGED, for_kernel="deepgemm-fp8-paged-mqa-logits", rows="0"),
         ["--problem", PAGED, "--for", "deepgemm-fp8-paged-mqa-logits", "--rows", "0"], "--for writes whole sets"),
        (dict(preset="deepgemm-fp8-mqa-logits-sm100", for_kernel="flashmla-sparse-prefill-sm90"),
         ["--preset", "deepgemm-fp8-mqa-logits-sm100", "--for", "flashmla-sparse-prefill-sm90"], "is written for"),
        (dict(problem=PAGED, kind="stack", for_kernel="deepgemm-fp8-paged-mqa-logits"),
         ["--problem", PAGED, "--kind", "stack", "--for", "deepgemm-fp8-paged-mqa-logits"], "writes a decode set"),
    ]
    for kwargs, args, msg in cases:
        r = cli("golden", *args, "--out", tmp_path / "x", check=False)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
        with pytest.raises(ValueError, match=msg):
            indexshare.golden(**kwargs)
    with pytest.raises(ValueError, match=r"layers: must be in \[1, 10\^6\], got 0"):
        indexshare.golden(preset="ties", layers=0)
    with pytest.raises(ValueError, match="seq: must be"):
        indexshare.golden(preset="ties", seq=-4)
    with pytest.raises(ValueError, match="seed: must be"):
        indexshare.golden(preset="ties", seed=-1)
    with pytest.raises(TypeError, match="layers: expected an int"):
        indexshare.golden(preset="ties", layers=2.5)
    with pytest.raises(ValueError, match="schedule=: not for a kernel-level set"):
        indexshare.golden(preset="ties", schedule="FS")
    with pytest.raises(ValueError, match="kind=: not with preset="):
        indexshare.golden(preset="ties", kind="stack")
    with pytest.raises(ValueError, match="for_kernel=: not for a module-level set"):
        indexshare.golden(model="tiny-glm", for_kernel="flashmla-sparse-prefill-sm90")
    with pytest.raises(ValueError, match="layers=: not for from_dump="):
        indexshare.golden(from_dump="x.safetensors", layers=2)


def test_save_refuses_a_non_empty_folder(tmp_path):
    g = indexshare.golden("sq8 skv8 hq2 dqk64 dv32 ih2 id16 k4")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "other").write_text("keep me")
    with pytest.raises(ValueError):
        g.save(tmp_path / "x")
    assert (tmp_path / "x" / "other").read_text() == "keep me"
    g.save(tmp_path / "y")
    m = json.load(open(tmp_path / "y" / "manifest.json"))
    for e in m["tensors"]:
        data = g.tensors[e["name"]].tobytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"]


def test_golden_from_dump_equals_the_cli(cli, root, tmp_path, monkeypatch):
    # A dump: the checked-in glm-5.2 set's kernel inputs under the golden names.
    g = indexshare.load_golden(root / "golden/glm-5.2")
    keep = tuple(".indexer." + n for n in ("q", "k", "k_scale", "weights", "ks", "ke")) + (".attn.q", ".attn.kv")
    dump = tmp_path / "dump.safetensors"
    indexshare.save_candidate({n: a for n, a in g.tensors.items() if n.endswith(keep)}, dump)
    problem = f"k{g.config['topk']} sched=glm-5.2"
    (tmp_path / "cli").mkdir()
    (tmp_path / "py").mkdir()
    cli("golden", "--from", dump, "--problem", problem, "--out", "set", cwd=tmp_path / "cli")
    monkeypatch.chdir(tmp_path / "py")
    indexshare.golden(problem, from_dump=dump).save("set")
    assert files_of("set") == files_of(tmp_path / "cli" / "set")
    with pytest.raises(ValueError, match="from_dump"):
        indexshare.golden(from_dump=dump, rows="0")
