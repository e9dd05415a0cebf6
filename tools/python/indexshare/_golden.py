"""Problem descriptors and golden sets (ref/problem.h, tools/lib/golden.h)."""
from __future__ import annotations

import json
import os

from . import _arrays
from ._core_loader import core


class Problem:
    """A problem descriptor (ref/problem.h): ``Problem("sq1024 skv1024 hq64 k256 seed7")``.

    ``str(p)`` is the canonical string (the one every replay line and manifest carries), ``p.fields``
    a dict of every field (s_q, s_kv, h_q, d_qk, d_v, index_n_heads, index_head_dim, index_topk, seed,
    indexer, sm_scale, sink, n_layers, sched, schedule (the F/S pattern), sim, drift, recency, sinks,
    own, n_seqs), each also an attribute (``p.s_q``). A bad token raises ValueError naming it.
    """

    def __init__(self, text: "str | Problem" = ""):
        text = str(text)
        self._canonical = core().problem_canonical(text)
        self.fields = dict(core().problem_fields(text))

    def __str__(self):
        return self._canonical

    def __repr__(self):
        return f"Problem({self._canonical!r})"

    def __eq__(self, other):
        return isinstance(other, Problem) and str(self) == str(other)

    def __hash__(self):
        return hash(self._canonical)

    def __getattr__(self, name):
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(name)


def presets() -> list[dict]:
    """The golden presets (``indexshare presets``): name, problem, kind, description."""
    return [dict(name=n, problem=p, kind=k, description=d) for n, p, k, d in core().presets()]


class _Tensors:
    """Shared by GoldenSet and LoadedGolden: the tensors as numpy (views) or torch (copies)."""

    def _init(self, handle, framework: str):
        if framework not in ("numpy", "torch"):
            raise ValueError(f"framework: expected 'numpy' or 'torch', got {framework!r}")
        self._h = handle
        self.framework = framework
        self.manifest = json.loads(handle.manifest_json)
        self._tensors = None

    @property
    def tensors(self) -> dict:
        """name -> array (README "Tensor names"); numpy arrays are read-only views of the set's bytes."""
        if self._tensors is None:
            self._tensors = {n: _arrays.from_raw(d, s, raw, self.framework) for n, d, s, raw in self._h.tensors()}
        return self._tensors

    @property
    def config(self) -> dict:
        """The manifest's config (s_q, s_kv, h_q, d_qk, d_v, topk, sm_scale, ...)."""
        return self.manifest["config"]

    @property
    def layers(self) -> list:
        """The manifest's layer schedule: per layer its kind (full / shared) and source."""
        return self.manifest["layers"]

    def __getitem__(self, name):
        return self.tensors[name]


class GoldenSet(_Tensors):
    """A golden set computed in memory by :func:`golden` (tools/lib/golden.h ``build``).

    ``.tensors`` (name -> array), ``.manifest`` (dict, without the "tensors" list, which writing adds),
    ``.config``, ``.layers``, ``.roles`` (name -> input / output / reference), ``.replay`` (the CLI
    command that writes the same set, without ``--out``). ``.save(dir)`` writes exactly the bytes
    ``indexshare golden ... --out dir`` writes (atomically; ``force`` replaces a set already there).
    """

    def __init__(self, handle, framework="numpy"):
        self._init(handle, framework)
        self.replay = handle.replay
        self.roles = dict(handle.roles())

    def save(self, dir, force: bool = False) -> str:
        dir = os.fspath(dir)
        core_manifest = self._h.save(dir, force)
        self.saved_manifest = json.loads(core_manifest)
        return dir


class LoadedGolden(_Tensors):
    """A golden set read from a folder and verified (every tensor's dtype, shape and SHA-256):
    :func:`load_golden`. ``.dir``, ``.manifest`` (with its "tensors" list), ``.tensors``, ``.config``,
    ``.layers``, ``.summary()`` (what ``indexshare verify`` prints)."""

    def __init__(self, handle, framework="numpy"):
        self._init(handle, framework)
        self.dir = handle.dir

    def summary(self) -> str:
        return self._h.summary()


def load_golden(dir, framework: str = "numpy") -> LoadedGolden:
    """Reads and verifies the golden set in ``dir`` (tools/lib/golden.h ``read``); tensors as
    ``framework`` "numpy" (bf16 / e4m3 as ml_dtypes dtypes) or "torch". A tampered tensor, a missing
    field or a bad file raises ValueError naming the file and the field."""
    return LoadedGolden(core().load_golden(os.fspath(dir)), framework)


def _rows_text(rows) -> str | None:
    if rows is None:
        return None
    if isinstance(rows, str):
        return rows
    return ",".join(str(int(r)) for r in rows)


def golden(problem=None, *, preset: str | None = None, model: str | None = None, from_dump=None, kind: str = "stack",
           rows=None, impl: str = "auto", logits: bool = True, layers: int = 0, seq: int = 0,
           schedule: str = "", seed: int = 1, sim: float = 0.8, variant: str = "deepseek_fp8",
           framework: str = "numpy") -> GoldenSet:
    """Computes a golden set in memory: what ``indexshare golden`` writes (tools/lib/golden.h).

    Exactly one of
      problem  a descriptor (str or Problem; ref/problem.h) -> a kernel-level set of ``kind``
               ("stack" or "attention-edge"); ``rows`` (e.g. "last:2,0,16-18" or a list of row numbers)
               makes a sampled set of those query rows (``--rows``); ``logits=False`` leaves out the
               [s_q, s_kv] indexer logits (``--no-logits``)
      preset   a golden preset (:func:`presets`; ``indexshare presets``)
      model    the module-level toy model with a preset's shapes (ref/model.h; ``--model``), with
               ``layers``, ``seq``, ``schedule``, ``seed``, ``sim``, ``variant`` as the CLI's options
      from_dump  a safetensors file of per-layer kernel inputs dumped from a real model under the
               golden tensor names (``--from``; tools/lib/golden.h ``build_from``); ``problem`` may
               then give top-k, d_v, sm and sched= (the shapes and layer count come from the file)
    impl: "ref", "simd" or "auto" (the same bytes; auto takes simd for large problems and records it
    in the replay line, as the CLI does). ``framework``: "numpy" or "torch" for ``.tensors``.
    """
    if from_dump is not None:
        if preset is not None or model is not None or rows is not None:
            raise ValueError("from_dump: excludes preset=, model= and rows= (problem= may give top-k, dv, sm, sched=)")
        text = "" if problem is None else str(problem)
        return GoldenSet(core().golden_from(os.fspath(from_dump), text, bool(logits)), framework)
    given = [n for n, v in (("problem", problem), ("preset", preset), ("model", model)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"golden: give exactly one of problem=, preset=, model= and from_dump=, got {given or 'none'}")
    if preset is not None:
        match = [p for p in presets() if p["name"] == preset]
        if not match:
            names = ", ".join(p["name"] for p in presets())
            raise ValueError(f"preset: unknown preset '{preset}' (one of {names})")
        if match[0]["kind"] == "module":
            model = match[0]["problem"]
        else:
            problem, kind = match[0]["problem"], match[0]["kind"]
    if model is not None:
        if rows is not None:
            raise ValueError("rows: sampled sets are kernel-level (problem= or a kernel-level preset=), not model=")
        h = core().golden_model(model, int(layers), int(seq), schedule, int(seed), float(sim), variant, impl)
    else:
        h = core().golden_stack(str(Problem(problem)), kind, impl, _rows_text(rows), bool(logits))
    return GoldenSet(h, framework)


def overlap(golden=None, *, problem=None, buckets: int = 8, shared_stats: bool = True, impl: str = "auto") -> dict:
    """Cross-layer top-k overlap statistics (ref/overlap.h): the JSON of ``indexshare overlap --json``
    as a dict (the same numbers), for a golden set (a folder, a :class:`LoadedGolden` or a
    :class:`GoldenSet`) or a generated ``problem``. Per pair of layers the mean |A ∩ B| / topk and the
    Jaccard index of their own top-k, per Shared layer the recall of its source's positions and (with
    ``shared_stats``) the attention cost of sharing, by ``buckets`` query-position buckets.
    impl: the kernels of the recomputations, "ref", "simd" or "auto" (the same numbers)."""
    import tempfile
    if (golden is None) == (problem is None):
        raise ValueError("overlap: give exactly one of golden and problem=")
    if isinstance(golden, GoldenSet):
        with tempfile.TemporaryDirectory(prefix="indexshare-golden-") as tmp:
            return overlap(golden.save(os.path.join(tmp, "golden")), buckets=buckets, shared_stats=shared_stats, impl=impl)
    gdir = "" if golden is None else golden.dir if isinstance(golden, LoadedGolden) else os.fspath(golden)
    text = core().overlap(gdir, "" if problem is None else str(Problem(problem)), int(buckets), bool(shared_stats), impl)
    return json.loads(text)


def cost(preset: str, contexts=(4096, 16384, 65536, 131072, 262144, 1048576), *, schedule: str = "",
         mode: str = "both") -> dict:
    """The cost model (ref/cost.h): the JSON of ``indexshare cost --preset NAME --json`` as a dict (the
    same numbers). FLOPs and bytes per decoded token and per whole prefill of the model ``preset``
    (deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek, tiny-glm) under ``schedule`` (default: the model's
    own; an F/S pattern, a preset name, freq:N,offset:M, ...) against every layer Full, at each
    context length of ``contexts`` (ints, or the CLI's text "4096,16K,1M"); ``mode`` "decode",
    "prefill" or "both"; the default accounting options."""
    text = contexts if isinstance(contexts, str) else ",".join(str(int(c)) for c in contexts)
    return json.loads(core().cost(preset, text, schedule, mode))
