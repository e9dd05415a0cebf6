"""Finds the extension indexshare._core: installed beside this file (pip install .), or in a build
tree named by INDEXSHARE_CORE_DIR (ctest sets it; tests/python/conftest.py defaults it to build/)."""
from __future__ import annotations

import importlib
import os

_core = None


def core():
    global _core
    if _core is None:
        import indexshare
        extra = os.environ.get("INDEXSHARE_CORE_DIR")
        if extra and extra not in indexshare.__path__:
            indexshare.__path__.append(extra)
        try:
            _core = importlib.import_module("indexshare._core")
        except ImportError as e:
            raise ImportError(
                "indexshare._core (the C++ extension) was not found: install the package (pip install .) "
                "or build it (tools/dev.sh build) and set INDEXSHARE_CORE_DIR=build/python/indexshare") from e
    return _core
