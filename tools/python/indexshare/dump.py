"""Dump a transformers DSA model's kernel inputs for ``indexshare golden/overlap/search --from``.

    python -m indexshare.dump --model PATH_OR_CONFIG (--prompt-file F | --tokens N)
                              [--layer-list 0-3,6] [--device cpu|cuda] [--seed N] [--no-logits]
                              --out acts.safetensors

``--model`` is a checkpoint folder (``config.json`` and weights: ``from_pretrained`` with
``dtype=torch.bfloat16``), a folder with only ``config.json``, or a ``config.json`` file (both:
random weights from ``--seed``, for tests and dry runs). Families: ``glm_moe_dsa`` (GLM-5, with
cross-layer sharing from ``config.indexer_types``), ``deepseek_v32``, ``deepseek_v4``, ``hy_v4`` and GLM-5.3's
``glm5_next`` / ``glm5_next_text`` (f32 models, each with its own tensor list and descriptor: ``_v4.py``,
``_hyv4.py``, ``_kpool.py``; what follows is the first two's). One prefill of one
sequence (batch 1) runs with forward hooks on every chosen layer's attention and indexer; per
layer (renumbered 0, 1, ... in the order of ``--layer-list``) the file holds, under the golden tensor
names ``indexshare golden --from`` reads:

- Full layers: ``layers.{l}.indexer.q`` bf16 [S, H, D] and ``indexer.k`` bf16 [S, D] (after the
  model's RoPE), ``indexer.weights`` f32 [S, H] (``weights_proj(x).float() * H^-0.5 * D^-0.5``, the
  model's two scales folded in), ``indexer.k_scale`` f32 [S] (ones), ``indexer.ks``/``ke`` i32 [S]
  (0 and t + 1: causal);
- every layer: ``layers.{l}.attn.q`` bf16 [S, h, r + R] and ``attn.kv`` bf16 [S, 1, r + R], the
  absorbed MLA query and the latent key (``_hf.mla_absorbed`` explains the conversion);
- the model's own choices, under the names ``indexshare diff`` judges: ``layers.{l}.indexer.topk``
  i32 [S, k] (Full layers: the indexer's top-k), ``layers.{l}.attn.indices`` i32 [S, 1, k] (every
  layer: the positions its attention used; a Shared layer's are the ``prev_topk_indices`` it was
  handed), and, unless ``--no-logits``, ``layers.{l}.indexer.logits`` f32 [S, S] (the model's own
  index scores, future -inf). HF's masked future slots become -1 (``_hf.to_golden_topk``);
- the model's own attention, which ``diff`` judges through W_uv: ``layers.{l}.attn.model_out``
  [S, h, v_head_dim] (o_proj's input per head, eager or sdpa, model dtype), ``attn.w_uk`` /
  ``attn.w_uv`` [h, nope | v_head_dim, r] (kv_b_proj) and ``attn.q_nope`` [S, h, nope]
  (``_hf.model_attention``). Only bf16 models with eager or sdpa attention are dumped; the
  metadata records ``attn_implementation``, ``dtype`` and ``sdpa_bf16_reduction``.

The safetensors metadata (``format: indexshare-dump``) carries the model class and type, the config
numbers, the schedule of the dumped layers, the problem descriptor (``k``, ``dv``, ``sm``,
``indexer=bf16``, ``sched=``) that ``--from`` takes when no ``--problem`` is given, the dtype, the
token count, the original layer numbers and the self-check. The file is written to a temporary
name beside ``--out`` and renamed: an interrupted run leaves no partial dump.

Self-check: for every Full layer the top-k recomputed from the dumped intermediates, with the
model's own expression, must equal the model's returned top-k exactly; otherwise the dump is
refused (this transformers version computes something the bridge does not reproduce).

This module needs torch, transformers, safetensors and numpy, never the indexshare C++ extension.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ._bridge import Stop as _Stop
from ._bridge import meta_head, prefill


class DumpError(Exception):
    """Bad input or usage: the message names the file, option or field."""


def parse_layers(text: str, n_layers: int) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6] (each in [0, n_layers), ascending, no repeats)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
            else:
                lo = hi = int(part)
        except ValueError:
            raise DumpError(f"--layer-list: {part!r} is not a layer number or range (e.g. 0-3,6)") from None
        if lo > hi:
            raise DumpError(f"--layer-list: range {part!r} is empty")
        for layer in range(lo, hi + 1):
            if not 0 <= layer < n_layers:
                raise DumpError(f"--layer-list: layer {layer} is outside the model's {n_layers} layers")
            out.append(layer)
    if out != sorted(set(out)):
        raise DumpError("--layer-list: layers must be ascending without repeats")
    return out


def select_layers(schedule: list[str], wanted: list[int] | None) -> tuple[list[int], str]:
    """The layers to dump and their schedule string; a Shared layer needs its source layer."""
    layers = list(range(len(schedule))) if wanted is None else wanted
    sched = ""
    for layer in layers:
        if schedule[layer] == "S":
            src = max(i for i in range(layer) if schedule[i] == "F")
            if src not in layers:
                raise DumpError(
                    f"--layer-list: Shared layer {layer} reuses Full layer {src}'s positions; add layer {src}"
                )
        sched += schedule[layer]
    if sched[0] == "S":
        raise DumpError("--layer-list: the first dumped layer must be a Full layer")
    return layers, sched


def load_model(spec: str, device: str, seed: int):
    """(model, tokenizer folder or None, where the weights came from)."""
    import torch
    import transformers

    path = Path(spec)
    if not path.exists():
        raise DumpError(f"--model {spec}: no such file or folder")
    if path.is_file():
        try:
            config_dict = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DumpError(f"--model {spec}: not a JSON config file: {e}") from None
        if not isinstance(config_dict, dict) or "model_type" not in config_dict:
            raise DumpError(f"--model {spec}: the config has no 'model_type'")
        config = transformers.AutoConfig.for_model(**config_dict)
        weights, tok_dir = None, None
    else:
        if not (path / "config.json").is_file():
            raise DumpError(f"--model {spec}: the folder has no config.json")
        config = transformers.AutoConfig.from_pretrained(path)
        weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
        tok_dir = path
    from . import _hf, _hyv4, _kpool, _v4

    # dumped in f32 (_v4.py, _hyv4.py, _kpool.py say why)
    v4 = _v4.is_v4(config) or _hyv4.is_hyv4(config) or _kpool.is_kpool(config)
    try:
        if not v4:
            _hf.family_of(config)
    except _hf.BridgeError as e:
        raise DumpError(f"--model {spec}: {e}, deepseek_v4, hy_v4, glm5_next and glm5_next_text") from None
    dtype = torch.float32 if v4 else torch.bfloat16  # V4: f32 only (_v4.py says why)
    # glm5_next is an image-text-to-text model; glm5_next_text (the text model alone) has no head class: its base model.
    auto = {"glm5_next": transformers.AutoModelForImageTextToText,
            "glm5_next_text": transformers.AutoModel}.get(config.model_type, transformers.AutoModelForCausalLM)
    if weights:
        model = auto.from_pretrained(path, dtype=dtype)
        source = "checkpoint"
    else:
        torch.manual_seed(seed)
        # from_config with dtype, like from_pretrained: the rotary inv_freq and the MoE router stay
        # f32 (a blanket .to(bfloat16) would round inv_freq and move every RoPE angle).
        model = auto.from_config(config, dtype=dtype)
        source = f"random init, seed {seed}"
        if _v4.is_v4(config):  # transformers initialises the sinks and position biases to 0
            _v4.randomize_attention_extras(model, seed)
            source += " (sinks and position biases random)"
        elif _kpool.is_kpool(config):  # glm5_next: the pooling's slot embedding 0, its gate weights 1
            _kpool.randomize_indexer(model, seed)
            source += " (pooling ape and gate random)"
        elif v4:  # hy_v4: the sinks to learnable_sink_init
            _hyv4.randomize_sinks(model, seed)
            source += " (sinks random)"
    return model.to(device).eval(), tok_dir, source


def token_ids(args, model, tok_dir):
    import torch

    if args.prompt_file is not None:
        if tok_dir is None:
            raise DumpError("--prompt-file needs a tokenizer: give --model a checkpoint folder, or use --tokens N")
        import transformers

        try:
            text = Path(args.prompt_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise DumpError(f"--prompt-file {args.prompt_file}: {e}") from None
        tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
        ids = tok(text, return_tensors="pt").input_ids
        if args.tokens is not None:
            ids = ids[:, : args.tokens]
        if ids.shape[1] == 0:
            raise DumpError(f"--prompt-file {args.prompt_file}: no tokens")
        return ids
    if args.tokens is None or args.tokens < 1:
        raise DumpError("give --prompt-file F or --tokens N (N >= 1)")
    g = torch.Generator().manual_seed(args.seed)
    from . import _kpool

    vocab = _kpool.text_config(model.config).vocab_size  # glm5_next: its text model's
    return torch.randint(0, vocab, (1, args.tokens), generator=g)


def capture(model, input_ids, layers: list[int], with_logits: bool = True, indexer_rope: str | None = None):
    """Runs one prefill with hooks on `layers`; returns (tensors, info).

    tensors: name -> torch tensor (CPU) under the dump's names, layers renumbered 0, 1, ...;
    info: the per-layer self-check and the numbers the metadata records.
    indexer_rope: None = the model's own layout; 'interleave' or 'half' writes the indexer q/k with
    that layout instead (a negative control: the model's own top-k must then fail diff).
    """
    import torch

    from . import _hf

    cfg = model.config
    fam = _hf.family_of(cfg)
    own_layout = _hf.indexer_rope_layout(cfg)
    layout = indexer_rope or own_layout
    schedule = _hf.schedule_of(cfg)
    decoder = model.model.layers
    k = int(cfg.index_topk)
    S = int(input_ids.shape[1])
    tensors: dict[str, torch.Tensor] = {}
    info = {"self_check": {}, "sm": None}
    pending: dict[int, dict] = {}
    new_index = {layer: i for i, layer in enumerate(layers)}
    last = layers[-1]
    handles = []

    def indexer_hook(layer):
        def hook(mod, args, kwargs, output):
            a = _hf.bind(mod, args, kwargs)
            hs, qr, pe = a["hidden_states"], a["q_resid"], a["position_embeddings"]
            # Scored with the mask the forward received, applied as it applies it: the same bits,
            # so the same top-k, ties included.
            q, kk, w, scores = _hf.indexer_intermediates(mod, hs, qr, pe, own_layout, attention_mask=a.get("attention_mask"))
            model_topk = output[0]
            mine = scores.topk(min(k, S), dim=-1).indices.to(model_topk.dtype)
            same = bool(torch.equal(mine, model_topk))
            # The reference logits: future -inf whatever the mask's form (eager adds finfo.min).
            future = torch.ones(S, S, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
            if layout != own_layout:
                q, kk, _, _ = _hf.indexer_intermediates(mod, hs, qr, pe, layout, own=False)
            pending[layer] = dict(q=q, k=kk, w=w * mod.softmax_scale, scores=scores, topk=model_topk, same=same)

        return hook

    model_out: dict[int, torch.Tensor] = {}

    def o_proj_hook(layer):
        def hook(mod, args):
            # o_proj's input: the attention's per-head context [B, S, h * v_head_dim], as the
            # model's eager/sdpa attention computed it (top-k mask included), in the model dtype.
            model_out[layer] = args[0].detach()

        return hook

    def attn_hook(layer):
        def hook(mod, args, kwargs, output):
            a = _hf.bind(mod, args, kwargs)
            q, kv = _hf.mla_absorbed(mod, a["hidden_states"], a["position_embeddings"])
            i = new_index[layer]
            pre = f"layers.{i}."
            ctx = model_out.pop(layer, None)
            if ctx is None:
                raise DumpError(f"layer {layer}: o_proj was not called (no attention output to capture)")
            for name, t in _hf.model_attention(mod, a["hidden_states"], ctx).items():
                tensors[pre + name] = t.cpu().contiguous()
            if info["sm"] is None:
                info["sm"] = _hf.softmax_scale(mod)
            tensors[pre + "attn.q"] = q.to(torch.bfloat16).cpu()
            tensors[pre + "attn.kv"] = kv.to(torch.bfloat16).cpu()
            p = pending.pop(layer, None)
            if p is not None:
                tensors[pre + "indexer.q"] = p["q"].to(torch.bfloat16).cpu()
                tensors[pre + "indexer.k"] = p["k"].to(torch.bfloat16).cpu()
                tensors[pre + "indexer.weights"] = p["w"].float().cpu().contiguous()
                tensors[pre + "indexer.k_scale"] = torch.ones(S, dtype=torch.float32)
                tensors[pre + "indexer.ks"] = torch.zeros(S, dtype=torch.int32)
                tensors[pre + "indexer.ke"] = torch.arange(1, S + 1, dtype=torch.int32)
                tensors[pre + "indexer.topk"] = _hf.to_golden_topk(p["topk"], k)
                if with_logits:
                    tensors[pre + "indexer.logits"] = p["scores"].float().cpu().contiguous()
                info["self_check"][layer] = p["same"]
            # The positions this layer's attention used: GLM returns them (its own, or the
            # prev_topk_indices a Shared layer was handed); DeepSeek-V3.2 layers use their own.
            if isinstance(output, tuple) and len(output) >= 3 and output[2] is not None:
                used = output[2][0]
            elif p is not None:
                used = p["topk"]
            else:
                raise DumpError(f"layer {layer}: found no top-k positions for its attention")
            tensors[pre + "attn.indices"] = _hf.to_golden_topk(used, k).unsqueeze(1)
            if layer == last:
                raise _Stop()

        return hook

    try:
        for layer in layers:
            attn = decoder[layer].self_attn
            if getattr(attn, "indexer", None) is not None:
                handles.append(attn.indexer.register_forward_hook(indexer_hook(layer), with_kwargs=True))
            elif schedule[layer] == "F":
                raise DumpError(f"layer {layer} is Full in the schedule but its attention has no indexer")
            handles.append(attn.o_proj.register_forward_pre_hook(o_proj_hook(layer)))
            handles.append(attn.register_forward_hook(attn_hook(layer), with_kwargs=True))
        prefill(model, input_ids)
    finally:
        for h in handles:
            h.remove()
    rotary = model.model.rotary_emb
    rope = {"dim": int(cfg.qk_rope_head_dim), "inv_freq": [float(f) for f in rotary.inv_freq.float().cpu()],
            "attention_scaling": float(rotary.attention_scaling)}
    # torch's math sdpa keeps bf16 reductions only when allowed (default: upcast to f32); diff's bound
    # then treats the logits as rounded, as eager's
    info.update(sdpa_bf16_reduction="yes" if torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() else "no")
    info.update(attn_implementation=str(cfg._attn_implementation), dtype=str(next(model.parameters()).dtype).replace("torch.", ""))
    info.update(family=fam, layout=layout, own_layout=own_layout, schedule=schedule, k=k, S=S, rope=rope)
    return tensors, info


def config_numbers(cfg) -> dict:
    keys = [
        "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim", "index_topk",
        "rope_parameters", "rms_norm_eps", "max_position_embeddings", "indexer_types", "vocab_size",
    ]
    return {key: getattr(cfg, key) for key in keys if hasattr(cfg, key)}


def f32_text(x: float) -> str:
    """The shortest decimal that reads back as the same f32: what C++'s std::to_chars prints (ref/problem.h
    float_text), fixed or scientific whichever is shorter, an integral value in fixed form exactly."""
    import numpy as np

    f = np.float32(x)
    fixed = str(int(f)) if f == np.trunc(f) else np.format_float_positional(f, unique=True, trim="-")
    sci = np.format_float_scientific(f, unique=True, trim="-", exp_digits=2)
    return fixed if len(fixed) <= len(sci) else sci


def metadata(model, info, layers: list[int], sched: str, source: str, with_logits: bool) -> dict[str, str]:
    cfg = model.config
    r, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    # sm as the f32 the kernels use, in its shortest round-trip form (as the C++ problem strings)
    problem = f"k{info['k']} dv{r} sm={f32_text(info['sm'])} indexer=bf16 sched={sched}"
    fails = [layer for layer, ok in info["self_check"].items() if not ok]
    notes = {
        "topk": "indexer.topk / attn.indices: HF's raw torch.topk with masked (future) slots turned into -1, "
        "valid positions in torch.topk's order, -1 trailing; torch.topk's order among ties is unspecified",
        "weights": "indexer.weights = weights_proj(x).float() * index_n_heads^-0.5 * index_head_dim^-0.5 (f32)",
        "attn": f"attn.q = [q_nope W_uk (absorbed, {r}) | q_rope ({rope})], attn.kv = [kv_a_layernorm latent | k_rope]",
        "model_out": "attn.model_out = the input of o_proj viewed [S, h, v_head_dim] (the model's own attention, "
        f"{info['attn_implementation']}, {info['dtype']}); attn.w_uk / attn.w_uv = kv_b_proj.weight viewed "
        "[h, nope + v_head_dim, r] split; attn.q_nope = q_b_proj's nope part [S, h, nope]",
    }
    return {
        **meta_head(None, model, source),
        "config": json.dumps(config_numbers(cfg), sort_keys=True),
        "schedule": sched,
        "model_schedule": "".join(info["schedule"]),
        "layers": json.dumps(layers),
        "problem": problem,
        "dtype": info["dtype"],
        "attn_implementation": info["attn_implementation"],
        "sdpa_bf16_reduction": info["sdpa_bf16_reduction"],
        "tokens": str(info["S"]),
        "indexer_rope": info["layout"],
        "model_indexer_rope": info["own_layout"],
        "logits": "yes" if with_logits else "no",
        "self_check": "pass" if not fails else "fail on model layers " + ",".join(map(str, fails)),
        "notes": json.dumps(notes, sort_keys=True),
        "rope": json.dumps(info["rope"]),
    }


def write_atomic(out: str, tensors, meta: dict[str, str]) -> None:
    """safetensors to a temporary file beside `out`, then one rename."""
    from safetensors.torch import save_file

    target = Path(out)
    if target.exists() and not target.is_file():
        raise DumpError(f"--out {out}: exists and is not a regular file")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise DumpError(f"--out {out}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".tmp.", dir=parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
    try:
        save_file({n: t.contiguous() for n, t in sorted(tensors.items())}, tmp, metadata=meta)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def dump(model, input_ids, out: str, layers: list[int] | None = None, with_logits: bool = True,
         indexer_rope: str | None = None, source: str = "in memory") -> dict[str, str]:
    """Captures `layers` of `model` on `input_ids` [1, S] and writes the dump to `out`.

    Returns the metadata written. Raises DumpError when the layers cannot be dumped or the
    self-check fails (unless `indexer_rope` asks for a negative control, which cannot pass it by
    design; its metadata records the layout used).
    """
    from . import _hf, _hyv4, _kpool, _v4

    if _v4.is_v4(model.config):
        return dump_v4(model, input_ids, out, layers, with_logits, indexer_rope, source)
    if _hyv4.is_hyv4(model.config):
        return dump_hyv4(model, input_ids, out, layers, indexer_rope, source)
    if _kpool.is_kpool(model.config):
        return _dump_own(_kpool, _kpool.KpoolError, model.config.model_type, model, input_ids, out, layers, indexer_rope,
                         source)
    try:
        schedule = _hf.schedule_of(model.config)
    except _hf.BridgeError as e:
        raise DumpError(str(e)) from None
    layers, sched = select_layers(schedule, layers)
    if getattr(model.config, "q_lora_rank", None) is None:
        raise DumpError("config.q_lora_rank is None: the DSA indexer reads the q LoRA residual")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise DumpError(f"input_ids must be [1, S], got {list(input_ids.shape)}")
    import torch

    dtype = next(model.parameters()).dtype
    if dtype != torch.bfloat16:
        raise DumpError(f"the model runs in {dtype}: the bridge dumps bf16 models (from_pretrained/from_config with "
                        "dtype=torch.bfloat16), whose kernel inputs the golden takes without rounding")
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("eager", "sdpa"):
        raise DumpError(f"attn_implementation {impl!r}: the bridge captures and diff judges the model's attention for "
                        "'eager' and 'sdpa' (the dense attention with the top-k mask)")
    tensors, info = capture(model, input_ids, layers, with_logits, indexer_rope)
    meta = metadata(model, info, layers, sched, source, with_logits)
    bad = [layer for layer, ok in info["self_check"].items() if not ok]
    if bad and indexer_rope is None:
        raise DumpError(
            "self-check failed on layer(s) " + ",".join(map(str, bad)) + ": the top-k recomputed from the "
            "captured intermediates differs from the model's own; this transformers version computes something "
            "the bridge does not reproduce (nothing written)"
        )
    write_atomic(out, tensors, meta)
    return meta


def _dump_own(bridge, error, model_type: str, model, input_ids, out: str, layers, indexer_rope, source: str) -> dict[str, str]:
    """dump() through a model's own bridge (_v4, _hyv4): one layout (no --indexer-rope), input_ids [1, S],
    bridge.dump's (tensors, meta) written atomically; the bridge's `error` becomes a DumpError."""
    if indexer_rope is not None:
        raise DumpError(f"--indexer-rope is a control for the GLM-5 / DeepSeek-V3.2 indexer; {model_type} has one layout")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise DumpError(f"input_ids must be [1, S], got {list(input_ids.shape)}")
    try:
        tensors, meta = bridge.dump(model, input_ids, layers, source)
    except error as e:
        raise DumpError(str(e)) from None
    write_atomic(out, tensors, meta)
    return meta


def dump_v4(model, input_ids, out: str, layers, with_logits: bool, indexer_rope, source: str) -> dict[str, str]:
    """dump() of a deepseek_v4 model (tools/python/indexshare/_v4.py): every C4A layer Full."""
    from . import _v4

    del with_logits  # the model's own scores are [T, n_b], always dumped
    return _dump_own(_v4, _v4.V4Error, "deepseek_v4", model, input_ids, out, layers, indexer_rope, source)


def dump_hyv4(model, input_ids, out: str, layers, indexer_rope, source: str) -> dict[str, str]:
    """dump() of a hy_v4 model (tools/python/indexshare/_hyv4.py): every layer, in f32."""
    from . import _hyv4

    return _dump_own(_hyv4, _hyv4.HYV4Error, "hy_v4", model, input_ids, out, layers, indexer_rope, source)


def bytes_per_token_layer(cfg, full: bool, tokens: int, with_logits: bool = True) -> int:
    """What one token costs in one dumped layer (the README's memory figure)."""
    h, d = cfg.num_attention_heads, cfg.kv_lora_rank + cfg.qk_rope_head_dim
    H, D, k = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
    n = 2 * h * d + 2 * d + 4 * k  # attn.q, attn.kv, attn.indices
    n += 2 * h * cfg.v_head_dim + 2 * h * cfg.qk_nope_head_dim  # attn.model_out, attn.q_nope
    if full:
        n += 2 * H * D + 2 * D + 4 + 4 * H + 8 + 4 * k + (4 * tokens if with_logits else 0)
    return n


def bytes_per_layer(cfg) -> int:
    """What one dumped layer costs whatever the token count: attn.w_uk and attn.w_uv (kv_b_proj, bf16)."""
    return 2 * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) * cfg.kv_lora_rank


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m indexshare.dump",
        description="Dump a transformers DSA model's (GLM-5, DeepSeek-V3.2, DeepSeek-V4) kernel inputs and its own choices for indexshare --from.",
    )
    ap.add_argument("--model", required=True, help="checkpoint folder, folder with config.json, or a config.json")
    ap.add_argument("--prompt-file", help="text to tokenise with the checkpoint's tokenizer")
    ap.add_argument("--tokens", type=int, help="random token ids (seeded); with --prompt-file: keep the first N")
    ap.add_argument("--layer-list", "--layers", dest="layers",
                    help="model layers to dump, e.g. 0-3,6 (default: all); renumbered 0, 1, ... (--layers: its old name)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0, help="random weights (config only) and random tokens")
    ap.add_argument("--no-logits", action="store_true", help="leave out the model's own [S, S] index scores")
    ap.add_argument("--indexer-rope", choices=["interleave", "half"],
                    help="negative control: write the indexer q/k with this RoPE layout instead of the model's")
    ap.add_argument("--out", required=True, help="the dump (.safetensors), written atomically")
    args = ap.parse_args(argv)
    if any(a == "--layers" or a.startswith("--layers=") for a in (sys.argv[1:] if argv is None else argv)):
        print("indexshare.dump: --layers is now --layer-list; the old name works for this release", file=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise DumpError("--device cuda: torch sees no CUDA device")
        model, tok_dir, source = load_model(args.model, args.device, args.seed)
        ids = token_ids(args, model, tok_dir)
        from . import _kpool

        n_layers = _kpool.text_config(model.config).num_hidden_layers  # glm5_next: its text model's
        layers = parse_layers(args.layers, n_layers) if args.layers else None
        meta = dump(model, ids, args.out, layers, not args.no_logits, args.indexer_rope, source)
    except DumpError as e:
        print(f"indexshare.dump: error: {e}", file=sys.stderr)
        return 2
    print(
        f"dump: {meta['model_class']} ({meta['weights']}), {meta['tokens']} tokens, layers {meta['layers']} "
        f"schedule {meta.get('schedule', 'in the problem')}, self-check {meta.get('self_check', 'none (v4)')} "
        f"-> {args.out}\n"
        f"dump: problem \"{meta['problem']}\""
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
