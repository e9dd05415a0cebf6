"""The indexshare CLI run as a subprocess, for the tests that check its exit status (the dump tests):
cli() is the binary INDEXSHARE_CLI names (the test fails without it), run(*args, expect=N) runs it and,
given expect, asserts the exit status (showing its output otherwise). Imported by name: pytest puts
this folder on sys.path (conftest.py's `cli` fixture serves the other tests)."""
import os
import subprocess

import pytest


def cli() -> str:
    path = os.environ.get("INDEXSHARE_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("set INDEXSHARE_CLI to the built indexshare binary (e.g. build/indexshare)")
    return path


def run(*args, expect=None):
    r = subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)
    if expect is not None:
        assert r.returncode == expect, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def diff_verdicts(golden, candidate, out, expect):
    """diff --json out: (the CompletedProcess, {(layer, tensor): verdict})."""
    import json

    r = run("diff", "--golden", golden, "--candidate", candidate, "--json", out, expect=expect)
    rep = json.loads(out.read_text())
    return r, {(t["layer"], t["tensor"]): t["verdict"] for t in rep["tensors"]}


def model_dump(work, config: dict, tokens: int, eager: bool = False) -> dict:
    """A tiny random model of `config` (written to work/config.json: nothing downloaded) dumped with
    indexshare.dump on `tokens` seeded random ids, and the set `golden --from` builds from the dump:
    {model, ids, dump, golden, meta, work}. eager: the model's attention set to eager first."""
    import json

    import torch
    from indexshare import dump as D

    cfg = work / "config.json"
    cfg.write_text(json.dumps(config))
    model, _, source = D.load_model(str(cfg), "cpu", 0)
    if eager:
        model.config._attn_implementation = "eager"
    ids = torch.randint(0, config["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    dump = work / "dump.safetensors"
    meta = D.dump(model, ids, str(dump), source=source)
    gold = work / "golden"
    run("golden", "--from", dump, "--out", gold, expect=0)
    return dict(model=model, ids=ids, dump=dump, golden=gold, meta=meta, work=work)
