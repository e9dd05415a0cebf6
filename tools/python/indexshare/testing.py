"""The one line a pytest needs: ``indexshare.testing.assert_matches(golden, candidate)``."""
from __future__ import annotations

from ._diff import Report, diff
from ._golden import _renamed


def assert_matches(golden, candidate, layer_list=None, impl: str = "auto", precision: str = "", *, layers=None) -> Report:
    """Judges ``candidate`` against ``golden`` (:func:`indexshare.diff`, the same arguments) and raises
    AssertionError carrying the CLI's human report (with its diagnoses) when any tensor FAILs;
    returns the :class:`indexshare.Report` otherwise. MISTRUSTED tensors do not fail."""
    r = diff(golden, candidate, _renamed("layers", "layer_list", layers, layer_list), impl=impl, precision=precision)
    if not r.passed:
        e = AssertionError("indexshare: the candidate does not match the golden set\n" + str(r))
        e.report = r
        raise e
    return r
