"""Problem descriptors and golden sets (ref/problem.h, tools/lib/golden.h)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

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
    """The golden presets (``indexshare presets``): name, problem, kind, description, and kernel (the
    GPU kernel a kernel preset is written for, as ``golden --for``; "" for the others)."""
    return [dict(name=n, problem=p, kind=k, description=d, kernel=kn) for n, p, k, d, kn in core().presets()]


def options(command: str | None = None) -> list[dict]:
    """The options ``golden`` and ``diff`` share with the CLI (one table, tools/lib/options.h): per option
    its command, ``cli`` name, ``python`` keyword ("train.loss": a key of golden's ``train=`` dict),
    ``meaning`` (the CLI's --help text) and, for the integer overrides, the range ``lo`` .. ``hi``."""
    rows = [dict(command=c, cli=cl, python=p, meaning=m, lo=lo, hi=hi, range=r) for c, cl, p, m, lo, hi, r in core().options()]
    return [r for r in rows if command is None or r["command"] == command]


def _kernels() -> list[dict]:
    """The registered GPU kernels (``indexshare kernels``): name and the kind of set they take."""
    return [dict(name=n, kind=k) for n, k in core().kernel_kinds()]


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


def _override(name: str, value) -> int:
    """A layers= / seq= / seed= override checked as the CLI checks --layers / --seq / --seed (the range
    of the shared option table)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    o = next(r for r in options("golden") if r["python"] == name)
    if not o["lo"] <= int(value) <= o["hi"]:
        raise ValueError(f"{name}: must be in [{o['lo']}, {o['range']}], got {int(value)}")
    return int(value)


def _refuse(what: str, why: str, **given):
    bad = [n for n, v in given.items() if v is not None]
    if bad:
        raise ValueError(f"{', '.join(n + '=' for n in bad)}: not for {what} ({why})")


def golden(problem=None, *, preset: str | None = None, model: str | None = None, from_dump=None,
           kind: str | None = None, for_kernel: str | None = None, rows=None, impl: str | None = None,
           logits: bool = True, layers: int | None = None, seq: int | None = None, seed: int | None = None,
           schedule: str | None = None, sim: float | None = None, variant: str | None = None,
           train: dict | None = None, framework: str = "numpy") -> GoldenSet:
    """Computes a golden set in memory: what ``indexshare golden`` writes (tools/lib/golden.h), with the
    CLI's option rules (golden.h ``plan_stack``); ``.save(dir)`` writes the CLI's bytes.

    Exactly one of
      problem  a descriptor (str or Problem; ref/problem.h) -> a kernel-level set of ``kind``
               ("stack", "attention-edge" or "decode"; default "stack"); ``rows`` (e.g. "last:2,0,16-18"
               or a list of row numbers) makes a sampled set of those query rows (``--rows``);
               ``logits=False`` leaves out the [s_q, s_kv] indexer logits (``--no-logits``)
      preset   a golden preset (:func:`presets`; ``indexshare presets``): a kernel-level one (its own
               kind; a kernel preset is written for its kernel) or a module-level one (as model=)
      model    the module-level toy model with a preset's shapes (ref/model.h; ``--model``), with
               ``layers``, ``seq``, ``schedule``, ``seed`` (default 1), ``sim`` (0.8), ``variant``
               ("deepseek_fp8" or "hf_bf16") as the CLI's options
      from_dump  a safetensors file of per-layer kernel inputs dumped from a real model under the
               golden tensor names (``--from``; tools/lib/golden.h ``build_from``); ``problem`` may
               then give top-k, d_v, sm and sched= (the shapes and layer count come from the file);
               on a model dump it completes the recorded problem, and a field that contradicts
               the dump raises ValueError naming both values
      problem with kind="train"  a training set (``--kind train``; the problem needs indexer=bf16): the
               stack's forward and its exact backward; ``train`` = {"loss": "sparse" | "dense",
               "target": "own-layer" | "served-layers", "kl_form": "kl-of-mean" | "mean-of-kl" (``--kl-form``),
               "relu": bool, "loss_coeff": float, "edges": bool
               (``--train-edges``), "loss_layers": [int] (``--loss-layers``)}; also a
               train preset= (written for its kernel), and for_kernel= a training kernel
               (tilelang-sparse-mla-bwd, megatron-dsa-indexer-loss; implies kind="train")
    Kernel-level sets (problem= or a kernel-level preset=) also take
      for_kernel  a GPU kernel (``indexshare kernels``; ``--for``): the set is that kernel's kind, its
               problem must meet the kernel's constraints (ValueError listing each one it breaks),
               and it carries the kernel's call in the manifest (and the tensors only that kernel
               takes, e.g. context_lens). Not with rows=.
      layers   the number of layers (nl; ``--layers``, 1..10^6)
      seq      the sequence length: s_kv, with s_q capped at it (``--seq``, 1..2^31-1)
      seed     the seed (``--seed``, >= 0)
    impl: "ref", "simd" or "auto" (the same bytes; auto takes simd for large problems and records it
    in the replay line, as the CLI does). Default: simd for a kernel preset (as the CLI without
    --impl), else "auto". ``framework``: "numpy" or "torch" for ``.tensors``.
    An option the CLI refuses for that kind of set is a ValueError naming it.
    """
    if layers is not None:
        layers = _override("layers", layers)
    if seq is not None:
        seq = _override("seq", seq)
    if seed is not None:
        seed = _override("seed", seed)
    if from_dump is not None:
        if preset is not None or model is not None or rows is not None:
            raise ValueError("from_dump: excludes preset=, model= and rows= (problem= may give top-k, dv, sm, sched=)")
        _refuse("from_dump=", "the dump gives shapes, layers and values, problem= top-k and sched=", kind=kind,
                for_kernel=for_kernel, layers=layers, seq=seq, seed=seed, schedule=schedule, sim=sim, variant=variant)
        text = "" if problem is None else str(problem)
        return GoldenSet(core().golden_from(os.fspath(from_dump), text, bool(logits)), framework)
    train_preset = preset is not None and any(p["name"] == preset and p["kind"] == "train" for p in presets())
    train_kernel = for_kernel is not None and any(k["name"] == for_kernel and k["kind"] == "train" for k in _kernels())
    if kind == "train" or train is not None or train_preset or train_kernel:
        # A training set (golden --kind train; tools/lib/golden_train.h): train= {"loss": "sparse" or "dense",
        # "target": "own-layer" or "served-layers", "relu": bool, "loss_coeff": float}; problem= or a train
        # preset (written for its kernel), optionally for_kernel= a training kernel.
        if kind not in (None, "train") or (problem is None) == (preset is None) or model is not None:
            raise ValueError("train: a training set takes problem= (with indexer=bf16) or a train preset=, and kind=\"train\" only")
        if preset is not None and not train_preset:
            raise ValueError(f"train: preset '{preset}' is not a train set")
        _refuse("a training set", "it takes its sizes and seed from problem=", rows=rows, layers=layers,
                seq=seq, seed=seed, schedule=schedule, sim=sim, variant=variant)
        t = dict(train or {})
        unknown = set(t) - {"loss", "target", "kl_form", "relu", "loss_coeff", "edges", "loss_layers"}
        if unknown:
            raise ValueError(f"train: unknown keys {sorted(unknown)} (loss, target, kl_form, relu, loss_coeff, edges, loss_layers)")
        for key in ("relu", "edges"):  # a string ("no") or a number would silently read as True
            if key in t and not isinstance(t[key], bool):
                raise ValueError(f"train: {key} must be True or False, got {t[key]!r}")
        loss_layers = t.get("loss_layers") or []
        if isinstance(loss_layers, (int, str)) or not all(isinstance(x, int) and x >= 0 for x in loss_layers):
            raise ValueError(f"train: loss_layers must be a list of layer numbers, got {loss_layers!r}")
        text, kern = str(Problem(problem)) if problem is not None else None, for_kernel or ""
        if preset is not None:
            pr = [p for p in presets() if p["name"] == preset][0]
            if kern and pr["kernel"] and kern != pr["kernel"]:
                raise ValueError(f"golden: preset '{preset}' is written for {pr['kernel']}, not for_kernel={kern}")
            text, kern = pr["problem"], kern or pr["kernel"]
        h = core().golden_train(text, t.get("loss", "sparse"), t.get("target", "own-layer"), bool(t.get("relu", True)),
                                float(t.get("loss_coeff", 1.0)), impl or "", kern, preset is not None,
                                bool(t.get("edges", False)), [int(x) for x in loss_layers], str(t.get("kl_form", "kl-of-mean")))
        return GoldenSet(h, framework)
    given = [n for n, v in (("problem", problem), ("preset", preset), ("model", model)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"golden: give exactly one of problem=, preset=, model= and from_dump=, got {given or 'none'}")
    if preset is not None:
        match = [p for p in presets() if p["name"] == preset]
        if not match:
            names = ", ".join(p["name"] for p in presets())
            raise ValueError(f"preset: unknown preset '{preset}' (one of {names})")
        if match[0]["kind"] == "module":
            model, preset = match[0]["problem"], None
    if model is not None:
        if rows is not None:
            raise ValueError("rows: sampled sets are kernel-level (problem= or a kernel-level preset=), not model=")
        _refuse("a module-level set (model=)", "it has its own tensor list; --for takes problem= or a kernel-level preset=",
                kind=kind, for_kernel=for_kernel)
        if not logits:
            raise ValueError("logits=False: not for a module-level set (model=): it has its own tensor list")
        h = core().golden_model(model, layers or 0, seq or 0, schedule or "", 1 if seed is None else seed,
                                0.8 if sim is None else float(sim), variant or "deepseek_fp8", impl or "auto")
    else:
        _refuse("a kernel-level set", "it takes them from its descriptor: sched=, sim=, the indexer mode",
                schedule=schedule, sim=sim, variant=variant)
        if preset is not None and kind is not None:
            raise ValueError(f"kind=: not with preset= (preset '{preset}' has its own kind)")
        h = core().golden_stack(preset or "", "" if problem is None else str(Problem(problem)), kind, impl or "",
                                _rows_text(rows), bool(logits), for_kernel or "", layers or 0, seq or 0,
                                -1 if seed is None else seed)
    return GoldenSet(h, framework)


def overlap(golden=None, *, problem=None, buckets: int = 8, shared_stats: bool = True, impl: str = "auto") -> dict:
    """Cross-layer top-k overlap statistics (ref/overlap.h): the JSON of ``indexshare overlap --json``
    as a dict (the same numbers), for a golden set (a folder, a :class:`LoadedGolden` or a
    :class:`GoldenSet`) or a generated ``problem``. Per pair of layers the mean |A ∩ B| / topk and the
    Jaccard index of their own top-k, per Shared layer the recall of its source's positions and (with
    ``shared_stats``) the attention cost of sharing, by ``buckets`` query-position buckets. A v4 set
    (DeepSeek-V4): the same figures over its C4A layers' block indices (ref/v4/sharing.h), with
    ``c4a_layers`` naming the model layer of each.
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


def _renamed(old: str, new: str, old_value, new_value):
    """A keyword renamed to the CLI's name for the same thing: ``old=`` still works for this release, with
    a one-line notice on stderr (as the CLI's old option names)."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"give {new}= only ({old}= is its old name)")
    print(f"indexshare: {old}= is now {new}=; the old name works for this release", file=sys.stderr)
    return old_value


def cost(model: str | None = None, contexts=(4096, 16384, 65536, 131072, 262144, 1048576), *, schedule: str = "",
         mode: str = "both", preset: str | None = None) -> dict:
    """The cost model (ref/cost.h): the JSON of ``indexshare cost --model NAME --json`` as a dict (the
    same numbers). FLOPs and bytes per decoded token and per whole prefill of the model preset ``model``
    (deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek, tiny-glm; ``preset=`` is its old name) under
    ``schedule`` (default: the model's own; an F/S pattern, a preset name, freq:N,offset:M, ...)
    against every layer Full, at each context length of ``contexts`` (ints, or the CLI's text
    "4096,16K,1M"); ``mode`` "decode", "prefill" or "both"; the default accounting options."""
    model = _renamed("preset", "model", preset, model)
    if model is None:
        raise TypeError("cost: give model= (a model preset: deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek, tiny-glm)")
    text = contexts if isinstance(contexts, str) else ",".join(str(int(c)) for c in contexts)
    return json.loads(core().cost(model, text, schedule, mode))
