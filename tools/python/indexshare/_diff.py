"""The oracle's judgement of a candidate against a golden set (tools/lib/diff.h)."""
from __future__ import annotations

import json
import os
import tempfile

from . import _arrays
from ._core_loader import core
from ._golden import GoldenSet, LoadedGolden, _renamed


class Report:
    """The result of :func:`diff`: what ``indexshare diff`` prints and writes with ``--json``.

    ``.passed`` (no tensor FAIL), ``.tensors`` (per judged layer and tensor: layer, tensor, verdict
    PASS / FAIL / MISTRUSTED, reasons, note, stats, mismatches (the first ones), structure),
    ``.diagnoses`` (hypotheses that explain a failure, e.g. an LSE in base 2), ``.notes``, ``.checked``
    (the candidate names judged), ``.status(layer, tensor)``. ``str(report)`` is the CLI's human report,
    ``report.to_json()`` the text of its ``--json`` file.
    """

    def __init__(self, failed: bool, text: str, json_text: str):
        self.passed = not failed
        self._text = text
        self._json = json_text
        data = json.loads(json_text)
        self.data = data
        self.tensors = data["tensors"]
        self.diagnoses = data["diagnoses"]
        self.notes = data["notes"]
        self.checked = data["checked"]

    def status(self, layer: int, tensor: str) -> str | None:
        """The verdict of ``tensor`` (e.g. "attn.out") of ``layer``; None when it was not judged."""
        for t in self.tensors:
            if t["layer"] == layer and t["tensor"] == tensor:
                return t["verdict"]
        return None

    def __bool__(self):
        return self.passed

    def __str__(self):
        return self._text

    def __repr__(self):
        return f"<indexshare.Report {'PASS' if self.passed else 'FAIL'}: {len(self.tensors)} tensors judged>"

    def to_json(self) -> str:
        """The report as ``indexshare diff --json`` writes it (the same text)."""
        return self._json + "\n"


def _diff_impl(impl: str, golden_dir: str) -> str:
    # indexshare diff --impl auto: simd, as the CLI (the same results either way, simd's in a fraction of the time).
    return "simd" if impl == "auto" else impl


def diff(golden, candidate, layer_list=None, impl: str = "auto", precision: str = "", *, layers=None) -> Report:
    """Judges ``candidate`` against ``golden`` (tools/lib/diff.h ``judge``): exactly ``indexshare diff``.

    golden     a golden set folder, a :class:`LoadedGolden` (:func:`load_golden`) or a
               :class:`GoldenSet` (:func:`golden`; written to a temporary folder first)
    candidate  a dict name -> array (numpy or torch CPU) with any subset of the golden's output names
               (layers.{l}.indexer.logits F32 [s_q, s_kv], indexer.topk I32/I64 [s_q, topk],
               attn.indices I32/I64 [s_q, 1, topk], attn.out F32/BF16 [s_q, h_q, d_v], attn.lse and
               attn.max_logits F32 [s_q, h_q]), or a safetensors file
    layer_list None (every layer the candidate covers), a list of layer numbers or "0,3-5" (``diff
               --layer-list``; ``layers=`` is its old name)
    impl       "ref", "simd" or "auto": the kernels of the recomputed expectations (the same results)
    precision  the arithmetic the indexer's logits are held to (``diff --precision``): "" for the
               default (fp8mma: Hopper's FP8 tensor-core accumulation), or "logits=f32", "logits=f16",
               "logits=bf16" (an indexer documented as low precision)
    Bad input (an unknown or mis-shaped tensor, a wrong dtype) raises ValueError naming the tensor.
    """
    layers = _renamed("layers", "layer_list", layers, layer_list)
    if isinstance(golden, GoldenSet):
        with tempfile.TemporaryDirectory(prefix="indexshare-golden-") as tmp:
            d = golden.save(os.path.join(tmp, "golden"))
            return diff(d, candidate, layers, impl, precision)
    if isinstance(golden, LoadedGolden):
        handle = golden._h
    elif isinstance(golden, (str, os.PathLike)):
        handle = core().load_golden(os.fspath(golden))
    else:
        raise TypeError(f"golden: expected a folder, a LoadedGolden or a GoldenSet, got {type(golden).__name__}")
    gdir = handle.dir
    layers_text = "" if layers is None else layers if isinstance(layers, str) else ",".join(str(int(l)) for l in layers)
    if isinstance(candidate, (str, os.PathLike)):
        path, raws, shown = os.fspath(candidate), [], os.fspath(candidate)
    elif isinstance(candidate, dict):
        if not candidate:
            raise ValueError("candidate: an empty dict (nothing to judge)")
        path, raws = "", [_arrays.to_raw(str(n), v) for n, v in candidate.items()]
        shown = "CANDIDATE.safetensors"
    else:
        raise TypeError(f"candidate: expected a dict name -> array or a safetensors file, got {type(candidate).__name__}")
    replay = (f"indexshare diff --golden {gdir} --candidate {shown}" + (f" --layer-list {layers_text}" if layers_text else "")
              + (f" --precision {precision}" if precision else ""))
    failed, text, js = core().diff(handle, raws, path or "candidate", path, layers_text, _diff_impl(impl, gdir), replay, precision)
    r = Report(failed, text, js)
    r._raws = raws
    return r


def save_candidate(candidate: dict, path) -> str:
    """Writes a candidate dict (name -> numpy / torch CPU array) as a safetensors file (the CLI's input)."""
    core().write_safetensors(os.fspath(path), [_arrays.to_raw(str(n), v) for n, v in candidate.items()])
    return os.fspath(path)
