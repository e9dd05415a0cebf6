"""indexshare.overlap and indexshare.cost: the numbers of `indexshare overlap --json` and `indexshare cost --json`, as Python objects."""
import json

import pytest

import indexshare


def test_overlap_of_a_golden_set_equals_the_cli_json(root, cli, tmp_path):
    d = root / "golden/glm-5.2-drift"
    cli("overlap", "--golden", d, "--json", tmp_path / "o.json")
    want = json.loads((tmp_path / "o.json").read_text())
    assert indexshare.overlap(d) == want
    assert indexshare.overlap(indexshare.load_golden(d), impl="simd") == want


def test_overlap_of_a_problem_equals_the_cli_json(cli, tmp_path):
    problem = "sq32 skv128 hq2 dqk64 dv32 ih4 id32 k8 nl4 sched=FSFS drift=0.9"
    cli("overlap", "--problem", problem, "--buckets", 4, "--json", tmp_path / "o.json")
    got = indexshare.overlap(problem=problem, buckets=4)
    assert got == json.loads((tmp_path / "o.json").read_text())
    # From a golden set of the problem: the same numbers (its problem line is rebuilt from the manifest).
    from_set = indexshare.overlap(indexshare.golden(problem), buckets=4)
    assert {k: v for k, v in from_set.items() if k != "problem"} == {k: v for k, v in got.items() if k != "problem"}
    with pytest.raises(ValueError, match="exactly one"):
        indexshare.overlap()


def test_cost_equals_the_cli_json(cli, tmp_path, capsys):
    for args, kw in (([], {}), (["--context", "4096,16K,1M", "--schedule", "freq:4", "--mode", "decode"],
                                dict(contexts="4096,16K,1M", schedule="freq:4", mode="decode"))):
        cli("cost", "--model", "glm-5.2", *args, "--json", tmp_path / "c.json")
        assert indexshare.cost("glm-5.2", **kw) == json.loads((tmp_path / "c.json").read_text())
    assert indexshare.cost("glm-5.2", [4096, 16384, 1 << 20], schedule="freq:4", mode="decode") == \
        indexshare.cost("glm-5.2", "4096,16K,1M", schedule="freq:4", mode="decode")
    with pytest.raises(ValueError, match="mode"):
        indexshare.cost("glm-5.2", mode="train")
    with pytest.raises(ValueError, match="context"):
        indexshare.cost("glm-5.2", "4096,abc")
    # model= is the CLI's --model; preset=, its old name, still works after a one-line notice.
    capsys.readouterr()
    assert indexshare.cost(preset="glm-5.2") == indexshare.cost(model="glm-5.2")
    assert capsys.readouterr().err == "indexshare: preset= is now model=; the old name works for this release\n"
