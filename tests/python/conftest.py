"""pytest setup for tests/python: the package from the source tree (tools/python) and the extension
from the build tree (INDEXSHARE_CORE_DIR, default build/python/indexshare), unless INDEXSHARE_INSTALLED=1
(the package installed with pip install .). The CLI is INDEXSHARE_CLI (default build/indexshare).
ctest sets all three; by hand, after tools/dev.sh build:  .venv/bin/python -m pytest tests/python"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if os.environ.get("INDEXSHARE_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "tools" / "python"))
    os.environ.setdefault("INDEXSHARE_CORE_DIR", str(ROOT / "build" / "python" / "indexshare"))


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def cli():
    """Runs the indexshare CLI: cli("golden", "--preset", "ties", ...) -> CompletedProcess (text)."""
    exe = os.path.abspath(os.environ.get("INDEXSHARE_CLI", str(ROOT / "build" / "indexshare")))
    if not os.path.exists(exe):
        pytest.fail(f"the indexshare CLI is not built ({exe}); set INDEXSHARE_CLI")

    def run(*args, cwd=None, check=True):
        r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd)
        if check and r.returncode not in (0, 1):
            raise AssertionError(f"indexshare {' '.join(map(str, args))} exited {r.returncode}: {r.stderr}")
        return r
    return run
