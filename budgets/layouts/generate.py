"""generate: no vLLM. transformers' generate runs on the trainer's own model and keeps a KV cache
for the whole local generation batch; nothing is synced. The CPU profile's layout."""

from __future__ import annotations

from ..plan import Resolved
from ..sheet import CardSheet
from ..trainer import generate_kv_line, overhead_lines, trainer_lines
from .common import Assembly, Decode, fsdp_shards


def build(r: Resolved) -> Assembly:
    lines = overhead_lines(r) + trainer_lines(r, fsdp_shards(r)) + [generate_kv_line(r)]
    kv = lines[-1]
    return Assembly(
        cards=[CardSheet("trainer", r.plan.gpus, lines, r.card.memory_bytes)],
        engine=None,
        weight_sync=(0, 0.0, "none: generation uses the trainer's own model"),
        decode=Decode(
            bandwidth=r.card.bandwidth,
            kv_per_token=kv.bytes // (r.local_gen_batch * r.seq_len),
            concurrent=r.local_gen_batch,
            sequences=r.local_gen_batch,
        ),
        notes=["no vLLM: completions come from transformers' generate on the trainer's own model"],
    )
