"""What the transformers bridges share (dump.py for GLM-5 / DeepSeek-V3.2, _v4.py for deepseek_v4,
_hyv4.py for hy_v4): the one prefill their hooks record, ended early by Stop, and the opening fields
of a dump's safetensors metadata. Needs torch only when prefill runs."""

from __future__ import annotations

FORMAT = "indexshare-dump"
VERSION = "1"


class Stop(Exception):
    """Raised by the hook of the last dumped layer: later layers need not run."""


def prefill(model, input_ids) -> None:
    """The model's forward on input_ids [1, S] (no grad, no cache) on the model's device; a hook's Stop
    ends it quietly."""
    import torch

    try:
        with torch.no_grad():
            model(input_ids=input_ids.to(next(model.parameters()).device), use_cache=False)
    except Stop:
        pass


def meta_head(kind: str | None, model, source: str) -> dict[str, str]:
    """The metadata's first fields: format, version, kind (none for the GLM-5 / DeepSeek-V3.2 dump),
    model_class, model_type and weights (where the model came from)."""
    head = {"format": FORMAT, "version": VERSION}
    if kind is not None:
        head["kind"] = kind
    head.update(model_class=type(model).__name__, model_type=model.config.model_type, weights=source)
    return head
