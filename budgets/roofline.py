"""Throughput from the roofline: decoding reads every weight once per step of the batch, so memory
bandwidth / bytes read per token bounds the tokens per second. Prefill and the training step's
compute are not modelled: the numbers are lower bounds on time."""

from __future__ import annotations

from typing import Any

from .arithmetic import base_weight_parts
from .plan import Resolved
from .units import ceil_div


def weights_read_per_token(r: Resolved, tp: int = 1, lora_slots: bool = False) -> tuple[int, str]:
    """Weights one decode step reads: the linears (in their precision), the output head (the embedding
    matrix when tied: the input lookup reads one row only), the norms and any LoRA adapter."""
    s = r.shape
    quant = r.quant if r.lora else "bf16"
    parts = base_weight_parts(s, quant, 2)
    head = s.vocab * s.hidden * 2
    total = parts["linears_nf4"] + parts["linears_16bit"] + head + parts["norms"]
    what = f"linears ({quant}) + output head {s.vocab} x {s.hidden} x 2 B + norms"
    if r.lora and lora_slots:
        per_layer = sum(i + o for i, o in s.linear_shapes().values())
        total += s.layers * r.max_lora_rank * per_layer * 2
        what += " + LoRA slots (bf16)"
    elif r.lora and not r.uses_vllm:
        targets = r.plan.target_modules
        per_layer = sum(r.lora_rank * (i + o) for m, (i, o) in s.linear_shapes().items() if m in targets)
        total += per_layer * s.layers * r.trainable_bytes
        what += f" + LoRA ({'fp32' if r.trainable_bytes == 4 else 'bf16'})"
    return ceil_div(total, tp), what + (f" / tp {tp}" if tp > 1 else "")


def roofline(
    r: Resolved,
    *,
    bandwidth: float,
    kv_per_token: int,
    concurrent: int,
    sequences: int,
    tp: int = 1,
    lora_slots: bool = False,
) -> dict[str, Any]:
    """bandwidth: bytes/s of one card (tensor parallel cards read their shards at the same time)."""
    p = r.plan
    weights, what = weights_read_per_token(r, tp, lora_slots)
    ctx = p.max_prompt_length + p.max_completion_length // 2  # average context while decoding
    per_token = weights + ctx * kv_per_token
    concurrent = max(1, min(concurrent, sequences))
    # Each decode iteration reads the weights once and the KV of every sequence in flight.
    seconds, left = 0.0, sequences
    while left > 0:
        wave = min(left, concurrent)
        seconds += p.max_completion_length * (weights + wave * ctx * kv_per_token) / bandwidth
        left -= wave
    return {
        "decode_bytes_per_token": per_token,
        "decode_weights_read": what,
        "decode_tokens_per_s_ceiling": round(bandwidth / per_token, 1),
        "tokens_per_step": r.gen_batch * p.max_completion_length,
        "generation_seconds_estimate": round(seconds, 3),
    }
