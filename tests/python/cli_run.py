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
