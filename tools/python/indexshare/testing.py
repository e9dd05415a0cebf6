"""The one line a pytest needs: ``indexshare.testing.assert_matches(golden, candidate)``."""
from __future__ import annotations

from ._diff import Report, diff


def assert_matches(golden, candidate, layers=None, impl: str = "auto", precision: str = "") -> Report:
    """Judges ``candidate`` against ``golden`` (:func:`indexshare.diff`, the same arguments) and raises
    AssertionError carrying the CLI's human report (with its diagnoses) when any tensor FAILs;
    returns the :class:`indexshare.Report` otherwise. MISTRUSTED tensors do not fail."""
    r = diff(golden, candidate, layers=layers, impl=impl, precision=precision)
    if not r.passed:
        e = AssertionError("indexshare: the candidate does not match the golden set\n" + str(r))
        e.report = r
        raise e
    return r
