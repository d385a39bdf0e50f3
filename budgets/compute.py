"""compute(plan) -> Sheet: the lines of each card, the phase totals, the checks and the metrics."""

from __future__ import annotations

from typing import Any

from .arithmetic import kv_bytes_per_token, lora_params
from .engine import Engine, build_engine, vllm_weight_bytes
from .plan import Plan, Resolved, resolve
from .roofline import roofline
from .sheet import GIB, Card, Line, Sheet, phase_totals
from .trainer import generate_kv_line, overhead_lines, trainer_lines

# What to change when a line is the largest of a phase that does not fit.
ADVICE = {
    "train_activations": "lower --batch or --completion-len, or use --gradient-checkpointing unsloth",
    "logits": "lower --batch or --completion-len, or keep chunked logits on",
    "kv_cache": "lower --vllm-util (the KV cache is the rest of vLLM's share) or use --standby",
    "base_weights": "use --quant nf4, a smaller --model, or FSDP over more --gpus",
    "optimizer_states": "use --optimizer adamw_8bit, LoRA, or FSDP over more --gpus",
    "lora_params": "lower --lora-rank",
    "lora_grads": "lower --lora-rank",
    "full_grads": "train LoRA instead of --full, or FSDP over more --gpus",
    "reference_policy": "use --beta 0 (no reference), or LoRA (its reference is a copy of the adapter)",
    "vllm_weights": "use --layout shared (one copy of the weights) or --standby",
    "generate_kv_cache": "lower --generations, --batch or --completion-len",
    "vllm_profile_activations": "lower vLLM's max_num_seqs",
    "cuda_graphs": "run vLLM with enforce_eager",
    "vllm_lora_slots": "lower max_lora_rank",
}
FIXED = {"cuda_context", "host_runtime", "host_shape_caches", "other_processes"}


def _peak_problems(lines: list[Line], phases: dict[str, int], capacity: int) -> list[tuple[str, str]]:
    phase, peak = max(phases.items(), key=lambda kv: kv[1])
    if peak <= capacity:
        return []
    held = [ln for ln in lines if phase in ln.phases and ln.name not in FIXED] or lines
    worst = max(held, key=lambda ln: ln.bytes)
    return [
        (
            worst.name,
            f"the {phase} phase needs {peak / GIB:.2f} GiB > {capacity / GIB:.2f} GiB "
            f"(over by {(peak - capacity) / GIB:.2f} GiB); largest line {worst.name} "
            f"{worst.bytes / GIB:.2f} GiB: {ADVICE.get(worst.name, 'shrink it')}",
        )
    ]


def _card(role: str, count: int, lines: list[Line], capacity: int, extra: list[tuple[str, str]]) -> Card:
    phases = phase_totals(lines)
    return Card(role, count, lines, capacity, phases, extra + _peak_problems(lines, phases, capacity))


def _inputs(r: Resolved) -> dict[str, Any]:
    p = r.plan
    return {
        "model": r.shape.name,
        "gpu": r.card.name,
        "gpu_memory_bytes": r.card.memory_bytes,
        "gpu_bandwidth_bytes_per_s": r.card.bandwidth,
        "layout": r.layout,
        "gpus": p.gpus,
        "vllm_gpus": r.vllm_cards,
        "vllm_util": p.vllm_util,
        "quant": r.quant,
        "lora_rank": r.lora_rank or None,
        "full": not r.lora,
        "target_modules": list(p.target_modules),
        "optimizer": r.optimizer,
        "prompt_len": p.prompt_len,
        "completion_len": p.completion_len,
        "generations": p.generations,
        "batch": p.batch,
        "grad_accum": p.grad_accum,
        "max_seq_length": r.max_seq_length,
        "beta": p.beta,
        "gradient_checkpointing": r.checkpointing,
        "chunked_logits": p.chunked_logits,
        "standby": p.standby,
        "link_gbps": p.link_gbps,
        "fast_inference": p.fast_inference,
        "trainable_dtype_bytes": r.trainable_bytes,
        "trainer_sharding": p.trainer_sharding,
        "gen_batch": r.gen_batch,
        "prompts_per_step": r.prompts_per_step,
    }


def compute(plan: Plan, *, _alternative: bool = True) -> Sheet:
    """The budget of a plan. Raises BudgetError for bad inputs; a plan that does not fit still gives
    a sheet (fits False, problems naming the line): call require_fits() to refuse it."""
    r = resolve(plan)
    p, s, card = r.plan, r.shape, r.card
    total = card.memory_bytes
    fsdp = str(p.trainer_sharding).lower() == "fsdp"
    shard = r.trainer_cards if fsdp and r.trainer_cards > 1 else 1
    notes: list[str] = []
    metrics: dict[str, Any] = {}
    engine: Engine | None = None
    engine_card_lines: list[Line] = []
    per_card: list[Card] = []

    overhead = overhead_lines(r)
    trainer = trainer_lines(r, shard, shared_with_vllm=r.layout == "shared" and r.uses_vllm)
    base_bytes = trainer[0].bytes
    ctx = sum(ln.bytes for ln in overhead)

    if not r.uses_vllm:
        kv_tok = kv_bytes_per_token(s, p.compute_dtype_bytes)
        lines = overhead + trainer + [generate_kv_line(r, kv_tok)]
        concurrent, sequences, tp, bandwidth = r.local_gen_batch, r.local_gen_batch, 1, card.bandwidth
        notes.append("no vLLM: completions come from HF generate on the trainer's own model")
    elif r.layout == "shared":
        free = total - ctx  # Unsloth starts vLLM before the trainer allocates anything
        engine = build_engine(
            r,
            total=total,
            free_at_start=free,
            weights_in_share=base_bytes,
            own_weights=False,
            sequences=r.local_gen_batch,
        )
        lines = overhead + trainer[:1] + engine.lines + trainer[1:]
        kv_tok, tp, bandwidth = engine.info["kv_cache_bytes_per_token"], 1, card.bandwidth
        concurrent, sequences = engine.info["max_concurrent_rollouts"], r.local_gen_batch
    elif r.layout == "colocate":
        # TRL builds the trainer's model (adapter, reference) first, then vLLM in the same process.
        before = base_bytes + sum(
            ln.bytes for ln in trainer if ln.name in ("lora_params", "reference_policy")
        )
        engine = build_engine(
            r,
            total=total,
            free_at_start=total - ctx - before,
            weights_in_share=vllm_weight_bytes(r),
            own_weights=True,
            sequences=r.local_gen_batch,
        )
        lines = overhead + trainer[:1] + engine.lines + trainer[1:]
        kv_tok, tp, bandwidth = engine.info["kv_cache_bytes_per_token"], 1, card.bandwidth
        concurrent, sequences = engine.info["max_concurrent_rollouts"], r.local_gen_batch
    else:  # server: vLLM tensor parallel on its own cards
        tp = r.vllm_cards
        engine = build_engine(
            r,
            total=total,
            free_at_start=total - ctx,
            weights_in_share=vllm_weight_bytes(r, tp),
            own_weights=True,
            tp=tp,
            sequences=r.gen_batch,
        )
        engine_card_lines = overhead + engine.lines
        lines = overhead + trainer
        kv_tok, bandwidth = engine.info["kv_cache_bytes_per_token"], card.bandwidth
        concurrent, sequences = engine.info["max_concurrent_rollouts"] * 1, r.gen_batch

    # Checks and per-card view.
    engine_problems = engine.problems if engine else []
    if r.layout == "server":
        per_card.append(_card("trainer", r.trainer_cards, lines, total, []))
        per_card.append(_card("vllm", r.vllm_cards, engine_card_lines, total, engine_problems))
        phases, problems = per_card[0].phases, []
    else:
        phases = phase_totals(lines)
        problems = engine_problems + _peak_problems(lines, phases, total)
        if p.gpus > 1:
            role = "trainer+vllm" if r.uses_vllm else "trainer"
            per_card.append(Card(role, p.gpus, lines, total, phases, list(problems)))

    # Metrics the issue asks for.
    trainable = lora_params(s, r.lora_rank, p.target_modules) if r.lora else s.total_params()
    state_names = {"base_weights", "lora_params", "lora_grads", "optimizer_states", "full_grads"}
    metrics["trainable_params"] = trainable
    metrics["train_state_bytes"] = sum(ln.bytes for ln in lines if ln.name in state_names)
    metrics["kv_cache_bytes_per_token"] = kv_tok
    metrics["max_concurrent_rollouts"] = concurrent
    metrics["rollouts_per_step"] = r.gen_batch
    metrics.update(
        roofline(
            r, bandwidth=bandwidth, kv_per_token=kv_tok, concurrent=concurrent, sequences=sequences, tp=tp
        )
    )
    sync_bytes, sync_s, sync_how = _weight_sync(r, trainable)
    metrics["weight_sync_bytes_per_step"] = sync_bytes
    metrics["weight_sync_seconds"] = sync_s
    metrics["weight_sync"] = sync_how
    metrics["step_seconds_estimate"] = round(metrics["generation_seconds_estimate"] + sync_s, 3)
    if r.checkpointing == "unsloth" and card.cuda:
        host = p.batch * r.seq_len * s.layers * s.hidden * p.compute_dtype_bytes
        metrics["host_offload_bytes"] = host
        notes.append(
            f"Unsloth's gradient checkpointing keeps L x batch x T x h x 2 B = {host / GIB:.2f} GiB "
            "of hidden states in CPU RAM, not on the card"
        )
    if engine:
        metrics["vllm"] = engine.info
        _engine_notes(r, engine, notes)
        if _alternative and r.layout == "shared":
            metrics["standby_alternative"] = _alternative_summary(p)
    notes.append(
        "estimates (to be settled by measurement): "
        + ", ".join(sorted({ln.name for ln in lines + engine_card_lines if ln.estimate}))
    )

    title = (
        f"{s.name} on {card.label} ({card.name}), layout {r.layout}"
        + (f", {p.gpus} cards" if p.gpus > 1 else "")
        + f", {'LoRA r ' + str(r.lora_rank) if r.lora else 'full'} {r.quant}, "
        f"{r.prompts_per_step} prompt(s) x {p.generations} completions of {p.completion_len} tokens"
    )
    return Sheet(
        title=title,
        lines=lines,
        capacity_bytes=total,
        phases=phases,
        problems=problems,
        metrics=metrics,
        inputs=_inputs(r),
        notes=notes,
        per_card=per_card,
    )


def _weight_sync(r: Resolved, trainable: int) -> tuple[int, float, str]:
    """Bytes the trainer hands vLLM after each optimizer step and the seconds that takes."""
    p, card = r.plan, r.card
    if not r.uses_vllm:
        return 0, 0.0, "none: generation uses the trainer's own model"
    if r.layout == "shared":
        n = trainable * 2  # the adapter, cast to bf16, copied into vLLM's LoRA slots
        return n, round(2 * n / card.bandwidth, 6), "LoRA adapter in bf16 into vLLM's slots (on-card copy)"
    full = r.shape.total_params() * 2  # adapter merged into the base, full weights in bf16
    if r.layout == "colocate":
        return full, round(2 * full / card.bandwidth, 4), "merged full weights in bf16 (on-card copy)"
    return (
        full,
        round(full * 8 / (p.link_gbps * 1e9), 3),
        f"merged full weights in bf16 over {p.link_gbps:g} Gb/s",
    )


def _engine_notes(r: Resolved, engine: Engine, notes: list[str]) -> None:
    info = engine.info
    if r.plan.standby and r.layout == "shared" and not r.plan.standby_util_override:
        notes.append(
            f"standby: Unsloth replaces vllm_util {r.plan.vllm_util} by {info['effective_util']} "
            "(its tier x 0.95) and releases the KV cache while the trainer runs"
        )
    notes.append(
        f"vLLM share: {info['effective_util']} x total = {info['requested_bytes'] / GIB:.2f} GiB; "
        f"free at start {info['free_at_start_bytes'] / GIB:.2f} GiB; "
        f"{'starts' if info['starts'] else 'REFUSES to start'}"
    )
    notes.append(
        f"KV cache: {info['kv_cache_tokens']:,} tokens = {info['rollouts_in_kv']} rollouts of T "
        f"{r.seq_len}; engine batch max_num_seqs {info['max_num_seqs']}, "
        f"{info['max_num_batched_tokens']} batched tokens"
    )
    if "unsloth_kv_estimate_bytes" in info:
        notes.append(
            f"unsloth_zoo's approximate_vllm_memory_usage for the same card: KV "
            f"{info['unsloth_kv_estimate_bytes'] / GIB:.2f} GiB, {info['unsloth_kv_tokens']:,} tokens "
            "(it counts NF4 at 5 bits per weight and keeps 5% back)"
        )
    if "unsloth_max_seq_length" in info:
        notes.append(f"Unsloth's own estimate lowers max_seq_length to {info['unsloth_max_seq_length']}")


def _alternative_summary(p: Plan) -> dict[str, Any]:
    """The same plan with Unsloth's standby toggled: the question a 16 GB user asks next."""
    alt = compute(p.with_(standby=not p.standby), _alternative=False)
    info = alt.metrics.get("vllm", {})
    return {
        "standby": not p.standby,
        "effective_util": info.get("effective_util"),
        "starts": info.get("starts"),
        "kv_cache_bytes": info.get("kv_cache_bytes"),
        "max_concurrent_rollouts": alt.metrics["max_concurrent_rollouts"],
        "phases": alt.phases,
        "total_bytes": alt.total_bytes,
        "fits": alt.fits,
        "verdict": alt.verdict(),
    }
