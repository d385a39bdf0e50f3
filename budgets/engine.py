"""vLLM's share of a card: what it holds, whether it starts, and how many rollouts its KV cache holds.

shared   (Unsloth fast_inference): the engine loads the weights inside its share and the trainer
         uses the same tensors; LoRA adapters reach vLLM through its LoRA slots.
colocate (TRL vllm_mode="colocate"): the trainer loads its model first; vLLM then starts inside the
         same process with its own copy of the weights inside its share.
server   (trl vllm-serve): vLLM alone on its own cards, tensor parallel over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .arithmetic import VLLM_BLOCK, base_weight_parts, ceil_div, kv_bytes_per_token
from .plan import Resolved
from .shapes import LINEARS
from .sheet import Line
from .vllm_rules import (
    unsloth_approximate,
    unsloth_cuda_graph_bytes,
    unsloth_engine_limits,
    unsloth_standby_util,
    vllm_profile_bytes,
    vllm_requested_bytes,
)

GIB = 1 << 30
ALL = ("start", "generate", "train")
START_GEN = ("start", "generate")


@dataclass
class Engine:
    lines: list[Line]  # vLLM's own lines (weights excluded in the shared layout: the trainer's line)
    info: dict[str, Any]
    problems: list[tuple[str, str]] = field(default_factory=list)


def vllm_weight_bytes(r: Resolved, tp: int = 1) -> int:
    """The weights vLLM loads: NF4 through the bitsandbytes plugin, else bf16; split by tensor parallel."""
    return ceil_div(sum(base_weight_parts(r.shape, r.quant, 2).values()), tp)


def build_engine(
    r: Resolved,
    *,
    total: int,
    free_at_start: int,
    weights_in_share: int,
    own_weights: bool,
    tp: int = 1,
    sequences: int,
) -> Engine:
    """Lines and checks of one vLLM engine (one card's share).

    total: the card's memory; free_at_start: what is free when vLLM measures; weights_in_share: the
    bytes of weights vLLM counts against its share; own_weights: add a vllm_weights line (colocate,
    server) rather than rely on the trainer's base_weights line (shared); sequences: the rollouts
    the engine is asked for at once (the generation batch it serves).
    """
    p, s = r.plan, r.shape
    lines: list[Line] = []
    problems: list[tuple[str, str]] = []
    info: dict[str, Any] = {}

    # 1. The share. Unsloth's standby replaces the util it was given by its own tier.
    util = p.vllm_util
    if p.standby and r.layout == "shared" and not p.standby_util_override:
        util = unsloth_standby_util(total)
    requested = vllm_requested_bytes(total, util)
    info.update(
        requested_util=p.vllm_util,
        effective_util=round(util, 4),
        requested_bytes=requested,
        free_at_start_bytes=free_at_start,
        starts=free_at_start >= requested,
    )
    if free_at_start < requested:
        best = free_at_start / total
        problems.append(
            (
                "vllm_util",
                f"vLLM asks for {util:.2f} x {total / GIB:.2f} GiB = {requested / GIB:.2f} "
                f"GiB but only {free_at_start / GIB:.2f} GiB is free at start (vLLM refuses); "
                f"lower --vllm-util to <= {int(best * 100) / 100:.2f}",
            )
        )

    # 2. Engine batch limits: Unsloth picks them from its own KV estimate; TRL colocate asks for the
    # per-card generation batch with 4096 batched tokens; vLLM's defaults for a server.
    if r.layout == "shared":
        u_tokens, _, _, u_kv_gib = unsloth_approximate(
            s,
            free=free_at_start,
            total=total,
            util=util,
            max_seq_length=r.max_seq_length,
            nf4=r.quant == "nf4",
            max_lora_rank=r.max_lora_rank or 16,
            enable_lora=r.lora,
        )
        batched, seqs = unsloth_engine_limits(u_kv_gib, min(r.max_seq_length, max(u_tokens, 256)))
        info.update(unsloth_kv_estimate_bytes=int(u_kv_gib * GIB), unsloth_kv_tokens=u_tokens)
        if u_tokens < r.max_seq_length:
            info["unsloth_max_seq_length"] = max(u_tokens, 256)
    elif r.layout == "colocate":
        batched, seqs = 4096, p.batch * p.grad_accum
    else:
        batched, seqs = 8192, 256
    if p.max_num_seqs:
        seqs = p.max_num_seqs
    info.update(max_num_seqs=seqs, max_num_batched_tokens=batched)

    # 3. What the share holds besides the KV cache.
    held_weights = weights_in_share
    if own_weights:
        phases = START_GEN if p.standby else ALL  # TRL sleep level 2 drops the weights while training
        lines.append(
            Line(
                "vllm_weights",
                weights_in_share,
                f"vLLM's own copy ({r.quant}{', / tp ' + str(tp) if tp > 1 else ''})",
                False,
                "reloaded from the trainer after each optimizer step",
                phases,
            )
        )
    if r.layout == "shared" and r.lora:
        # LoRA slots: max_loras 1 x max_lora_rank x sum(in + out) over the 7 linears x 2 B, per layer.
        per_layer = sum(i + o for i, o in s.linear_shapes().values())
        slot = s.layers * r.max_lora_rank * per_layer * 2
        lines.append(
            Line(
                "vllm_lora_slots",
                slot,
                f"L {s.layers} x max_lora_rank {r.max_lora_rank} x "
                f"sum(in+out) {per_layer:,} over {len(LINEARS)} linears x 2 B",
                True,
                "vLLM's preallocated adapter buffers (max_loras 1)",
                ALL,
            )
        )
        held_weights += slot
    prof, prof_formula = vllm_profile_bytes(s, batched, seqs, r.quant == "nf4")
    prof = ceil_div(prof, tp) if tp > 1 else prof
    lines.append(
        Line(
            "vllm_profile_activations",
            prof,
            prof_formula,
            True,
            "peak of vLLM's profiling pass, reserved in its share; reused when decoding",
            START_GEN,
        )
    )
    graphs = 0 if p.enforce_eager else unsloth_cuda_graph_bytes(s)
    if graphs:
        lines.append(
            Line(
                "cuda_graphs",
                graphs,
                "172 graphs x h x L x 4 B, within [0.15, 1] GiB (Unsloth's allowance)",
                True,
                "inside the share since vLLM 0.21 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)",
                ALL,
            )
        )

    # 4. The KV cache is the rest of the share, in whole blocks of 16 tokens.
    kv_tok = kv_bytes_per_token(s, 2, tp)
    kv = requested - held_weights - prof - graphs
    blocks = max(kv, 0) // (kv_tok * VLLM_BLOCK)
    kv_tokens = blocks * VLLM_BLOCK
    per_rollout_blocks = ceil_div(r.seq_len, VLLM_BLOCK)
    fit_rollouts = blocks // per_rollout_blocks
    concurrent = min(fit_rollouts, seqs)
    kv_phases = START_GEN if p.standby else ALL
    lines.append(
        Line(
            "kv_cache",
            max(kv, 0),
            f"ceil({util:.2f} x {total / GIB:.2f} GiB) - weights - "
            + ("LoRA slots - " if r.layout == "shared" and r.lora else "")
            + f"profiling - graphs = {blocks:,} blocks x 16 tokens x {kv_tok:,} B/token",
            True,
            "released while training (standby / sleep mode)"
            if p.standby
            else "preallocated for the whole run",
            kv_phases,
        )
    )
    info.update(
        kv_cache_bytes=max(kv, 0),
        kv_cache_tokens=kv_tokens,
        kv_cache_bytes_per_token=kv_tok,
        rollouts_in_kv=fit_rollouts,
        max_concurrent_rollouts=concurrent,
        rollouts_requested=sequences,
    )
    if kv <= 0:
        problems.append(
            (
                "kv_cache",
                f"vLLM's share {requested / GIB:.2f} GiB leaves {kv / GIB:.2f} GiB for the "
                "KV cache after weights, profiling and graphs; raise --vllm-util or use a smaller model",
            )
        )
    elif kv_tokens < r.max_seq_length:
        problems.append(
            (
                "kv_cache",
                f"holds {kv_tokens} tokens < max_seq_length {r.max_seq_length}: vLLM "
                "cannot serve one full-length request; raise --vllm-util or lower max_seq_length",
            )
        )
    return Engine(lines, info, problems)
