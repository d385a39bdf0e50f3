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

from dataclasses import dataclass, field
from typing import Any

from ..arithmetic import lora_params
from ..engine import Engine
from ..plan import Plan, Resolved
from ..sheet import CardSheet


@dataclass
class Decode:
    """What decoding reads, for the roofline."""

    bandwidth: float  # bytes/s of one card
    kv_per_token: int
    concurrent: int  # rollouts decoded at once
    sequences: int  # rollouts asked for per step (per engine)
    tp: int = 1
    lora_slots: bool = False  # vLLM reads its LoRA slots with the weights


@dataclass
class Assembly:
    cards: list[CardSheet]  # the trainer's card first: the card the lab runs on
    engine: Engine | None
    weight_sync: tuple[int, float, str]  # bytes per step, seconds, what is sent
    decode: Decode
    notes: list[str] = field(default_factory=list)
    alternative: Plan | None = None  # the same plan with the question a user asks next (standby)
    extra_metrics: dict[str, Any] = field(default_factory=dict)


def build(r: Resolved) -> Assembly:
    from . import colocate, generate, server, shared

    if not r.uses_vllm:
        return generate.build(r)
    return {"shared": shared, "colocate": colocate, "server": server}[r.layout].build(r)


def fsdp_shards(r: Resolved) -> int:
    """Trainer cards an FSDP trainer splits weights, grads and states over (1: DDP replicas)."""
    return r.trainer_cards if r.plan.trainer_sharding.lower() == "fsdp" and r.trainer_cards > 1 else 1


def trainable_params(r: Resolved) -> int:
    return lora_params(r.shape, r.lora_rank, r.plan.target_modules) if r.lora else r.shape.total_params()
