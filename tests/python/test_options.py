"""One vocabulary: the options golden, diff, overlap and cost share between the CLI and the Python package come from
one table (tools/lib/options.h, indexshare.options()). Each row's Python keyword is a parameter of the
Python function (or a key of golden's train= dict), its meaning is the CLI's --help text, and the
integer overrides are refused with the same range by both."""
import inspect
import re

import pytest

import indexshare


def test_every_shared_option_is_a_python_keyword_of_its_function():
    rows = indexshare.options()
    assert {r["command"] for r in rows} == {"golden", "diff", "overlap", "cost"}
    for command, fn in (("golden", indexshare.golden), ("diff", indexshare.diff), ("overlap", indexshare.overlap),
                        ("cost", indexshare.cost)):
        params = set(inspect.signature(fn).parameters)
        for r in indexshare.options(command):
            if r["python"].startswith("train."):
                continue
            assert r["python"] in params, (command, r)
    # train.* are exactly the keys golden's train= dict takes: its refusal of an unknown key lists them.
    with pytest.raises(ValueError) as e:
        indexshare.golden("sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 indexer=bf16", kind="train", train={"bogus": 1})
    listed = set(re.search(r"\(([^)]*)\)\s*$", str(e.value)).group(1).split(", "))
    assert listed == {r["python"][len("train."):] for r in indexshare.options("golden") if r["python"].startswith("train.")}


def test_the_cli_help_is_the_tables_meaning(cli):
    for command in ("golden", "diff", "overlap", "cost"):
        text = " ".join(cli(command, "--help").stdout.split())
        for r in indexshare.options(command):
            assert r["cli"] in text, r
            assert " ".join(r["meaning"].split()) in text, r


@pytest.mark.parametrize("name, bad", [("layers", 0), ("layers", 10 ** 6 + 1), ("seq", 0), ("seed", -1)])
def test_the_overrides_are_refused_with_the_tables_range_by_both(cli, tmp_path, name, bad):
    row = next(r for r in indexshare.options("golden") if r["python"] == name)
    with pytest.raises(ValueError, match=re.escape(f"{name}: must be in [{row['lo']}, {row['range']}], got {bad}")):
        indexshare.golden(model="tiny-glm", **{name: bad})
    r = cli("golden", "--model", "tiny-glm", row["cli"], bad, "--out", tmp_path / "x", check=False)
    assert r.returncode == 2
    if name != "seed":  # the CLI takes a negative --seed as "not given" and says so in its own words
        assert f"{row['cli']} must be in [{row['lo']}, {row['range']}], got {bad}" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()
