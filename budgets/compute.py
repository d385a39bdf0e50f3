"""compute(plan) -> Sheet: the layout's lines, the phase totals, the checks and the metrics."""

from __future__ import annotations

from typing import Any

from . import advice, layouts
from .arithmetic import lora_params
from .plan import PLAN_FIELDS, Plan, Resolved, resolve
from .roofline import roofline
from .sheet import Line, Problem, Sheet, phase_totals
from .units import gib

# Lines no setting of the plan shrinks: never blamed for a phase that does not fit.
FIXED = {"cuda_context", "host_runtime", "host_shape_caches", "other_processes"}


def peak_problem(lines: list[Line], capacity: int) -> Problem | None:
    """The phase that does not fit, blamed on its largest line that a setting can shrink."""
    phases = phase_totals(lines)
    phase, peak = max(phases.items(), key=lambda kv: kv[1])
    if peak <= capacity:
        return None
    held = [ln for ln in lines if phase in ln.phases and ln.name not in FIXED] or lines
    worst = max(held, key=lambda ln: ln.bytes)
    return Problem(
        worst.name,
        f"the {phase} phase needs {gib(peak):.2f} GiB > {gib(capacity):.2f} GiB (over by "
        f"{gib(peak - capacity):.2f} GiB); largest line {worst.name} {gib(worst.bytes):.2f} GiB",
        advice.BY_LINE.get(worst.name, ()),
    )


def _inputs(r: Resolved) -> dict[str, Any]:
    """The plan as resolved, under the plan's own names (advice renders against these)."""
    p = r.plan
    values = {name: getattr(p, name) for name in PLAN_FIELDS}
    values.update(
        model=r.shape.name,
        gpu=r.card.name,
        target_modules=list(p.target_modules),
        lora_rank=r.lora_rank or None,
        max_lora_rank=r.max_lora_rank or None,
        max_seq_length=r.max_seq_length,
        trainable_dtype_bytes=r.trainable_bytes,
        gpu_memory_bytes=r.card.memory_bytes,
        gpu_bandwidth_bytes_per_s=r.card.bandwidth,
        gen_batch=r.gen_batch,
        prompts_per_step=r.prompts_per_step,
    )
    return values


def compute(plan: Plan, *, _alternative: bool = True) -> Sheet:
    """The budget of a plan. Raises BudgetError for bad inputs; a plan that does not fit still gives
    a sheet (fits False, problems naming the line): call require_fits() to refuse it."""
    r = resolve(plan)
    p, s = r.plan, r.shape
    built = layouts.build(r)
    for card in built.cards:
        problem = peak_problem(card.lines, card.capacity_bytes)
        if problem is not None:
            card.problems.append(problem)
    lines = built.cards[0].lines
    problems = [pr for card in built.cards for pr in card.problems]

    notes = list(built.notes)
    metrics: dict[str, Any] = {}
    trainable = lora_params(s, r.lora_rank, p.target_modules) if r.lora else s.total_params()
    states = {"base_weights", "lora_params", "lora_grads", "optimizer_states", "full_grads"}
    metrics["trainable_params"] = trainable
    metrics["train_state_bytes"] = sum(ln.bytes for ln in lines if ln.name in states)
    metrics["kv_cache_bytes_per_token"] = built.decode.kv_per_token
    metrics["max_concurrent_rollouts"] = built.decode.concurrent
    metrics["rollouts_per_step"] = r.gen_batch
    d = built.decode
    metrics.update(
        roofline(
            r,
            bandwidth=d.bandwidth,
            kv_per_token=d.kv_per_token,
            concurrent=d.concurrent,
            sequences=d.sequences,
            tp=d.tp,
            lora_slots=d.lora_slots,
        )
    )
    # What a step's generation can reach at most, all rollouts of the step together.
    metrics["decode_tokens_per_s_step_ceiling"] = round(
        metrics["tokens_per_step"] / max(metrics["generation_seconds_estimate"], 1e-12), 1
    )
    sync_bytes, sync_s, sync_how = built.weight_sync
    metrics["weight_sync_bytes_per_step"] = sync_bytes
    metrics["weight_sync_seconds"] = sync_s
    metrics["weight_sync"] = sync_how
    metrics["step_seconds_estimate"] = round(metrics["generation_seconds_estimate"] + sync_s, 3)
    if r.checkpointing == "unsloth" and r.card.cuda:
        host = p.per_device_train_batch_size * r.seq_len * s.layers * s.hidden * r.dtype_bytes
        metrics["host_offload_bytes"] = host
        notes.append(
            f"Unsloth's gradient checkpointing keeps layers x batch x T x h x {r.dtype_bytes} B = "
            f"{gib(host):.2f} GiB of hidden states in CPU RAM, not on the card"
        )
    if built.engine:
        metrics["vllm"] = built.engine.info
    if built.alternative is not None and _alternative:
        metrics["standby_alternative"] = _alternative_summary(built.alternative)
    if p.beta > 0 and r.lora and p.grpo_trainer == "unsloth":
        notes.append(
            "beta > 0: Unsloth's GRPO trainer takes reference log-probs from the base with the adapter "
            "disabled, so no reference copy is held (TRL's own trainer adds a frozen fp32 'ref' adapter)"
        )
    if (
        r.quant == "nf4"
        and "bnb-4bit" in str(p.model).lower()
        and not s.skip_modules
        and "cache" not in s.source
    ):
        notes.append(
            f"{p.model} is a pre-quantized checkpoint whose own config is not in the local Hugging Face "
            "cache: every linear is counted in NF4 from the shipped shape; Unsloth's dynamic 4-bit "
            "checkpoints keep some modules in 16 bit (llm_int8_skip_modules), which the sheet reads "
            "once the checkpoint has been downloaded"
        )
    notes.insert(0, f"model shape from {s.source}")
    all_lines = [ln for card in built.cards for ln in card.lines]
    notes.append(
        "estimates (to be settled by measurement): "
        + ", ".join(sorted({ln.name for ln in all_lines if ln.estimate}))
    )

    title = (
        f"{s.name} on {r.card.label} ({r.card.name}), layout {r.layout if r.uses_vllm else 'generate'}"
        + (f", {p.gpus} cards" if p.gpus > 1 else "")
        + f", {'LoRA r ' + str(r.lora_rank) if r.lora else 'full'} {r.quant}, "
        f"{r.prompts_per_step} prompt(s) x {p.num_generations} completions of {p.max_completion_length} tokens"
    )
    return Sheet(
        title=title,
        lines=lines,
        capacity_bytes=r.card.memory_bytes,
        problems=problems,
        metrics=metrics,
        inputs=_inputs(r),
        notes=notes,
        per_card=built.cards if p.gpus > 1 else [],
    )


def _alternative_summary(plan: Plan) -> dict[str, Any]:
    """The same plan with Unsloth's standby toggled: the question a 16 GB user asks next."""
    alt = compute(plan, _alternative=False)
    info = alt.metrics.get("vllm", {})
    return {
        "unsloth_vllm_standby": plan.unsloth_vllm_standby,
        "effective_util": info.get("effective_util"),
        "starts": info.get("starts"),
        "kv_cache_bytes": info.get("kv_cache_bytes"),
        "max_concurrent_rollouts": alt.metrics["max_concurrent_rollouts"],
        "phases": alt.phases,
        "total_bytes": alt.total_bytes,
        "fits": alt.fits,
        "verdict": alt.verdict(),
    }
