"""Layouts: where the trainer and vLLM sit, one module each.

shared    Unsloth's fast_inference=True: vLLM inside the trainer's process, on the trainer's own
          weights (held once); the adapter reaches vLLM through its LoRA slots.
colocate  TRL's vllm_mode="colocate": vLLM in the trainer's process with its own copy of the weights.
server    TRL's vllm-serve: vLLM alone on its own cards (tensor parallel); the other cards train.
generate  no vLLM (fast_inference false, or the CPU): transformers' generate on the trainer's model.

A layout's `build(r)` returns an `Assembly`: the lines of each kind of card, the vLLM engine (if
any), the weight sync per step and what the decode roofline reads. A new layout is a new module
here and one entry in LAYOUTS.
"""

from __future__ import annotations

from ..plan import Resolved
from .common import Assembly, Decode, fsdp_shards, trainable_params

__all__ = ["Assembly", "Decode", "build", "fsdp_shards", "trainable_params"]


def build(r: Resolved) -> Assembly:
    from . import colocate, generate, server, shared

    if not r.uses_vllm:
        return generate.build(r)
    return {"shared": shared, "colocate": colocate, "server": server}[r.layout].build(r)
