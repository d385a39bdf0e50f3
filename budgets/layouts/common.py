"""What every layout module builds on: the Assembly a layout returns, what decoding reads, and the
trainable parameters and shards every layout counts the same way."""

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


def fsdp_shards(r: Resolved) -> int:
    """Trainer cards an FSDP trainer splits weights, grads and states over (1: DDP replicas)."""
    return r.trainer_cards if r.plan.trainer_sharding.lower() == "fsdp" and r.trainer_cards > 1 else 1


def trainable_params(r: Resolved) -> int:
    return lora_params(r.shape, r.lora_rank, r.plan.target_modules) if r.lora else r.shape.total_params()
