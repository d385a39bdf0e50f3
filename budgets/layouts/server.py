"""server: TRL's `trl vllm-serve` on `vllm_gpus` cards of their own (tensor parallel); the other
cards train (DDP replicas, or FSDP shards). After each optimizer step the trainer merges the adapter
and sends the full weights in bf16 over the link, so a 4-bit base cannot be used."""

from __future__ import annotations

from ..engine import build_engine, engine_notes, vllm_weight_bytes
from ..formula import given
from ..plan import Resolved
from ..sheet import CardSheet
from ..trainer import overhead_lines, trainer_lines
from ..units import gib
from ..vllm_rules import vllm_requested_bytes
from .common import Assembly, Decode, fsdp_shards

# vLLM's own defaults for a server: max_num_batched_tokens 8192, max_num_seqs 256.
SERVER_LIMITS = (8192, 256)


def build(r: Resolved) -> Assembly:
    p, card = r.plan, r.card
    total, tp = card.memory_bytes, r.vllm_cards
    overhead = overhead_lines(r)
    util = p.gpu_memory_utilization
    engine = build_engine(
        r,
        share=given(vllm_requested_bytes(total, util), f"ceil({util:g} x total {gib(total):.2f} GiB)"),
        effective_util=util,
        free_at_start=total - sum(ln.bytes for ln in overhead),
        weights_in_share=vllm_weight_bytes(r, tp),
        own_weights=True,
        lora_slots=False,
        batch_limits=SERVER_LIMITS,
        sequences=r.gen_batch,
        released_while_training=False,
        tp=tp,
    )
    full = r.shape.total_params() * 2  # merged full weights in bf16
    return Assembly(
        cards=[
            CardSheet("trainer", r.trainer_cards, overhead + trainer_lines(r, fsdp_shards(r)), total),
            CardSheet("vllm", r.vllm_cards, overhead + engine.lines, total, list(engine.problems)),
        ],
        engine=engine,
        weight_sync=(
            full,
            round(full * 8 / (p.link_gbps * 1e9), 3),
            f"merged full weights in bf16 over {p.link_gbps:g} Gb/s",
        ),
        decode=Decode(
            bandwidth=card.bandwidth,
            kv_per_token=engine.info["kv_cache_bytes_per_token"],
            concurrent=engine.info["max_concurrent_rollouts"],
            sequences=r.gen_batch,
            tp=tp,
        ),
        notes=engine_notes(r, engine),
    )
