"""shared: Unsloth's fast_inference=True, the first lab's layout.

Unsloth starts vLLM in the trainer's process before anything else is loaded, with the 4-bit weights
inside vLLM's share; the trainer's model is built on the same tensors (held once). After each
optimizer step the adapter (bf16) is copied into vLLM's LoRA slots.

vLLM's share is not gpu_memory_utilization x total: unsloth_zoo scales the util by the free memory
it measures and hands vLLM util x free / total (see vllm_rules.unsloth_vllm_share). Because of that
scaling the share always fits what is free, and vLLM's start check cannot fail here; what other
processes hold shrinks the share (and the KV cache) instead.
"""

from __future__ import annotations

from ..engine import build_engine, engine_notes
from ..formula import given
from ..plan import Resolved
from ..sheet import CardSheet
from ..trainer import overhead_lines, trainer_lines
from ..units import GIB, gib
from ..vllm_rules import unsloth_approximate, unsloth_engine_limits, unsloth_standby_util, unsloth_vllm_share
from .common import Assembly, Decode, fsdp_shards, trainable_params


def build(r: Resolved) -> Assembly:
    p, s, card = r.plan, r.shape, r.card
    total = card.memory_bytes
    overhead = overhead_lines(r)
    free = total - sum(ln.bytes for ln in overhead)  # measured by Unsloth before it loads anything
    notes = []
    util = p.gpu_memory_utilization
    if p.unsloth_vllm_standby and not p.unsloth_vllm_standby_util_override:
        util = unsloth_standby_util(total)
        notes.append(
            f"standby: Unsloth replaces gpu_memory_utilization {p.gpu_memory_utilization:g} by {util:.4f} "
            "(its tier for this card x 0.95) and releases the KV cache while the trainer runs"
        )
    handed, requested = unsloth_vllm_share(
        s, free=free, total=total, util=util, max_seq_length=r.max_seq_length
    )
    share = given(
        requested,
        f"ceil(total {gib(total):.2f} GiB x {handed:.4f}), the util Unsloth hands vLLM: "
        f"{util:g} x free at start {gib(free):.2f} GiB / total",
    )

    trainer = trainer_lines(
        r, fsdp_shards(r), weights_note="held once: Unsloth's vLLM engine uses the same tensors"
    )
    u_tokens, _, _, u_kv_gib = unsloth_approximate(
        s,
        free=free,
        total=total,
        util=util,
        max_seq_length=r.max_seq_length,
        nf4=r.quant == "nf4",
        max_lora_rank=r.max_lora_rank or 16,
        enable_lora=r.lora,
    )
    engine = build_engine(
        r,
        share=share,
        effective_util=handed,
        free_at_start=free,
        weights_in_share=trainer[0].bytes,
        own_weights=False,
        lora_slots=r.lora,
        # Unsloth picks the engine's batch from its own KV estimate.
        batch_limits=unsloth_engine_limits(u_kv_gib, min(r.max_seq_length, max(u_tokens, 256))),
        sequences=r.local_gen_batch,
        released_while_training=p.unsloth_vllm_standby,
    )
    engine.info.update(unsloth_kv_estimate_bytes=int(u_kv_gib * GIB), unsloth_kv_tokens=u_tokens)
    if u_tokens < r.max_seq_length:
        engine.info["unsloth_max_seq_length"] = max(u_tokens, 256)

    lines = overhead + trainer[:1] + engine.lines + trainer[1:]
    sync = trainable_params(r) * 2  # the adapter, cast to bf16, copied into vLLM's LoRA slots
    return Assembly(
        cards=[CardSheet("trainer+vllm", p.gpus, lines, total, list(engine.problems))],
        engine=engine,
        weight_sync=(
            sync,
            round(2 * sync / card.bandwidth, 6),
            "LoRA adapter in bf16 into vLLM's slots (on-card copy)",
        ),
        decode=Decode(
            bandwidth=card.bandwidth,
            kv_per_token=engine.info["kv_cache_bytes_per_token"],
            concurrent=engine.info["max_concurrent_rollouts"],
            sequences=r.local_gen_batch,
            lora_slots=r.lora,
        ),
        notes=notes + engine_notes(r, engine),
        alternative=p.with_(unsloth_vllm_standby=not p.unsloth_vllm_standby),
    )
