"""vLLM's share of a card: what it holds besides the KV cache, whether it starts, and how many
rollouts its KV cache holds. The layouts (budgets/layouts/) say how big the share is and what is
free when vLLM starts; this module turns that into lines and checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import advice
from .arithmetic import VLLM_BLOCK, base_weight_parts, kv_per_token_term
from .formula import Term, given, nbytes, num
from .plan import Resolved
from .shapes import LINEARS
from .sheet import Line, Problem
from .units import ALL, START_GEN, ceil_div, gib
from .vllm_rules import unsloth_cuda_graph_bytes, vllm_profile_bytes


@dataclass
class Engine:
    lines: list[Line]  # vLLM's own lines (in the shared layout the weights are the trainer's line)
    info: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)


def vllm_weight_bytes(r: Resolved, tp: int = 1) -> int:
    """The weights vLLM loads: NF4 through the bitsandbytes plugin, else 16-bit; split by tensor parallel."""
    return ceil_div(sum(base_weight_parts(r.shape, r.quant, 2).values()), tp)


def lora_slot_term(r: Resolved) -> Term:
    """vLLM's preallocated adapter buffers: max_loras 1 x max_lora_rank x sum(in + out) over all seven
    linears (vLLM pads every linear, targeted or not) x 2 B, per layer."""
    per_layer = sum(i + o for i, o in r.shape.linear_shapes().values())
    return (
        num(r.shape.layers, "layers")
        * num(r.max_lora_rank, "max_lora_rank")
        * num(per_layer, f"sum(in+out) over {len(LINEARS)} linears")
        * nbytes(2)
    )


def build_engine(
    r: Resolved,
    *,
    share: Term,
    effective_util: float,
    free_at_start: int,
    weights_in_share: int,
    own_weights: bool,
    lora_slots: bool,
    batch_limits: tuple[int, int],
    sequences: int,
    released_while_training: bool,
    tp: int = 1,
) -> Engine:
    """Lines and checks of one vLLM engine (one card's share).

    share: the bytes vLLM claims, with how they are computed; free_at_start: what is free when vLLM
    checks; weights_in_share: the weights counted against the share; own_weights: add a vllm_weights
    line (colocate, server) rather than rely on the trainer's base_weights line (shared);
    batch_limits: (max_num_batched_tokens, max_num_seqs); sequences: the rollouts asked for at once.
    """
    p, s = r.plan, r.shape
    lines: list[Line] = []
    problems: list[Problem] = []
    requested = int(share.value)
    info: dict[str, Any] = {
        "requested_util": p.gpu_memory_utilization,
        "effective_util": round(effective_util, 4),
        "requested_bytes": requested,
        "free_at_start_bytes": free_at_start,
        "starts": free_at_start >= requested,
    }
    if free_at_start < requested:
        best = int(free_at_start / r.card.memory_bytes * 100) / 100
        problems.append(
            Problem(
                "gpu_memory_utilization",
                f"vLLM claims {gib(requested):.2f} GiB but only {gib(free_at_start):.2f} GiB is free when it "
                "starts (vLLM refuses to start)",
                (advice.lower("gpu_memory_utilization", best), advice.set_to("layout", "shared")),
            )
        )
    batched, seqs = batch_limits
    if p.max_num_seqs:
        seqs = p.max_num_seqs
    info.update(max_num_seqs=seqs, max_num_batched_tokens=batched)

    # What the share holds besides the KV cache.
    held: list[Term] = [given(weights_in_share, "weights")]
    kv_phases = START_GEN if released_while_training else ALL
    if own_weights:
        lines.append(
            Line(
                name="vllm_weights",
                term=given(
                    weights_in_share, f"vLLM's own copy ({r.quant}" + (f", / tp {tp})" if tp > 1 else ")")
                ),
                estimate=False,
                note="reloaded from the trainer after each optimizer step",
                phases=kv_phases,
            )
        )
    if lora_slots:
        slots = lora_slot_term(r)
        lines.append(
            Line(
                name="vllm_lora_slots",
                term=slots,
                estimate=True,
                note="vLLM's preallocated adapter buffers (max_loras 1)",
            )
        )
        held.append(given(slots.value, "LoRA slots"))
    prof_bytes, prof_text = vllm_profile_bytes(s, batched, seqs, r.quant == "nf4")
    profile = given(ceil_div(prof_bytes, tp), prof_text + (f" / tp {tp}" if tp > 1 else ""))
    lines.append(
        Line(
            name="vllm_profile_activations",
            term=profile,
            estimate=True,
            note="peak of vLLM's profiling pass, reserved in its share; reused when decoding",
            phases=START_GEN,
        )
    )
    held.append(given(profile.value, "profiling"))
    if not p.enforce_eager:
        graphs = unsloth_cuda_graph_bytes(s)
        lines.append(
            Line(
                name="cuda_graphs",
                term=given(
                    graphs, f"172 graphs x h {s.hidden} x layers {s.layers} x 4 B, within [0.15, 1] GiB"
                ),
                estimate=True,
                note="Unsloth's allowance; inside the share since vLLM 0.21",
            )
        )
        held.append(given(graphs, "CUDA graphs"))

    # The KV cache is the rest of the share, in whole blocks of 16 tokens.
    kv_tok = kv_per_token_term(s, 2, tp)
    kv = share.but(f"share {gib(requested):.2f} GiB")
    for term in held:
        kv = kv - term
    blocks = max(int(kv.value), 0) // (int(kv_tok.value) * VLLM_BLOCK)
    fit_rollouts = blocks // ceil_div(r.seq_len, VLLM_BLOCK)
    concurrent = min(fit_rollouts, seqs)
    kv_line = kv if kv.value > 0 else given(0, kv.text + " <= 0")
    lines.append(
        Line(
            name="kv_cache",
            term=kv_line.plus_note(f"= {blocks:,} blocks x {VLLM_BLOCK} tokens x {kv_tok.text}"),
            estimate=True,
            note="released while training (standby / sleep mode)"
            if released_while_training
            else "preallocated for the whole run",
            phases=kv_phases,
        )
    )
    info.update(
        kv_cache_bytes=max(int(kv.value), 0),
        kv_cache_tokens=blocks * VLLM_BLOCK,
        kv_cache_bytes_per_token=int(kv_tok.value),
        rollouts_in_kv=fit_rollouts,
        max_concurrent_rollouts=concurrent,
        rollouts_requested=sequences,
    )
    if kv.value <= 0:
        problems.append(
            Problem(
                "kv_cache",
                f"vLLM's share {gib(requested):.2f} GiB leaves {gib(kv.value):.2f} GiB for the KV cache after "
                "weights, profiling and graphs",
                (advice.raise_("gpu_memory_utilization"), advice.set_to("load_in_4bit", True)),
            )
        )
    elif blocks * VLLM_BLOCK < r.max_seq_length:
        problems.append(
            Problem(
                "kv_cache",
                f"holds {blocks * VLLM_BLOCK} tokens < max_seq_length {r.max_seq_length}: vLLM cannot serve one "
                "full-length request",
                (advice.raise_("gpu_memory_utilization"), advice.lower("max_seq_length")),
            )
        )
    return Engine(lines, info, problems)


def engine_notes(r: Resolved, engine: Engine) -> list[str]:
    info = engine.info
    notes = [
        f"vLLM share: {gib(info['requested_bytes']):.2f} GiB (gpu_memory_utilization handed to vLLM "
        f"{info['effective_util']}); free when it starts {gib(info['free_at_start_bytes']):.2f} GiB: "
        + ("starts" if info["starts"] else "vLLM REFUSES to start"),
        f"KV cache: {info['kv_cache_tokens']:,} tokens = {info['rollouts_in_kv']} rollouts of T {r.seq_len}; "
        f"engine batch max_num_seqs {info['max_num_seqs']}, {info['max_num_batched_tokens']} batched tokens",
    ]
    if "unsloth_kv_estimate_bytes" in info:
        notes.append(
            f"unsloth_zoo's approximate_vllm_memory_usage for the same card: KV "
            f"{gib(info['unsloth_kv_estimate_bytes']):.2f} GiB, {info['unsloth_kv_tokens']:,} tokens; it counts "
            "4-bit weights at 16/5 compression (5 bits per weight, no quantization constants), keeps 5% back and "
            "counts no profiling pass, where the sheet models what vLLM allocates"
        )
    if "unsloth_max_seq_length" in info:
        notes.append(f"Unsloth's own estimate lowers max_seq_length to {info['unsloth_max_seq_length']}")
    return notes
