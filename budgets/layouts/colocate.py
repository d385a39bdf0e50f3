"""colocate: TRL's vllm_mode="colocate". The trainer loads its model first; vLLM then starts in the
same process with its own copy of the weights inside its share. TRL passes gpu_memory_utilization to
vLLM unchanged, so vLLM claims util x total and refuses to start when less is free. After each
optimizer step TRL merges the adapter and loads the full weights into vLLM. With sleep mode
(unsloth_vllm_standby here) vLLM releases its weights and KV cache while the trainer runs."""

from __future__ import annotations

from ..engine import build_engine, engine_notes, vllm_weight_bytes
from ..formula import given
from ..plan import Resolved
from ..sheet import CardSheet
from ..trainer import overhead_lines, trainer_lines
from ..units import gib
from ..vllm_rules import vllm_requested_bytes
from .common import Assembly, Decode, fsdp_shards

# TRL's colocate engine: max_num_batched_tokens 4096, max_num_seqs = the local generation batch.
TRL_BATCHED_TOKENS = 4096


def build(r: Resolved) -> Assembly:
    p, card = r.plan, r.card
    total = card.memory_bytes
    overhead = overhead_lines(r)
    trainer = trainer_lines(r, fsdp_shards(r))
    loaded_first = {"base_weights", "lora_params", "reference_policy"}
    free = (
        total - sum(ln.bytes for ln in overhead) - sum(ln.bytes for ln in trainer if ln.name in loaded_first)
    )
    util = p.gpu_memory_utilization
    share = given(vllm_requested_bytes(total, util), f"ceil({util:g} x total {gib(total):.2f} GiB)")
    engine = build_engine(
        r,
        share=share,
        effective_util=util,
        free_at_start=free,
        weights_in_share=vllm_weight_bytes(r),
        own_weights=True,
        lora_slots=False,
        batch_limits=(TRL_BATCHED_TOKENS, r.local_gen_batch),
        sequences=r.local_gen_batch,
        released_while_training=p.unsloth_vllm_standby,
    )
    lines = overhead + trainer[:1] + engine.lines + trainer[1:]
    full = r.shape.total_params() * 2  # merged full weights in bf16
    return Assembly(
        cards=[CardSheet("trainer+vllm", p.gpus, lines, total, list(engine.problems))],
        engine=engine,
        weight_sync=(full, round(2 * full / card.bandwidth, 4), "merged full weights in bf16 (on-card copy)"),
        decode=Decode(
            bandwidth=card.bandwidth,
            kv_per_token=engine.info["kv_cache_bytes_per_token"],
            concurrent=engine.info["max_concurrent_rollouts"],
            sequences=r.local_gen_batch,
        ),
        notes=engine_notes(r, engine),
    )
