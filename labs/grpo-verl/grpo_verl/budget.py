"""The budget sheet of a verl configuration, derived from its overrides: one source for both.

verl's hybrid engine puts, on every card, an FSDP shard of the actor and a vLLM replica of its own
(tensor parallel 1 here) that sleeps while the actor trains. In the budget's vocabulary that is
layout "colocate" (vLLM with its own copy of the weights) with ``unsloth_vllm_standby`` (vLLM's
sleep mode: KV cache and weights released while training) and ``trainer_sharding`` "fsdp". The rest
of the plan is read from the overrides, key by key (`PLAN_FROM_VERL`).

What the sheet leaves out of verl (said again where the launcher prints it):
- verl runs vLLM in processes of its own beside the FSDP worker: a second CUDA context per card
  (about 0.5 GiB) that the sheet does not count.
- With LoRA, verl sends vLLM only the adapter after each step (sleep level 1 keeps vLLM's base);
  the sheet's weight sync is the colocate layout's merged full weights, an upper bound.
- vLLM holds LoRA slots for the adapter (layers x max_lora_rank x sum(in+out) x 2 B; tens of MiB).
- verl computes log-probs over the whole micro-batch (``chunked_logits`` false); its own optional
  chunking (entropy_from_logits_with_chunking) and fused kernels are not modelled.
- Ray's object store, the driver and the dataloader live in CPU RAM: not on the card.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

import budgets
from budgets.units import GIB
from budgets.vocabulary import flag, flag_text
from grpo_verl.settings import LaunchConfig

# Plan field -> the verl key it is read from. Everything else in `plan()` is fixed by verl's layout.
PLAN_FROM_VERL = {
    "model": "actor_rollout_ref.model.path",
    "lora_rank": "actor_rollout_ref.model.lora_rank",
    "num_generations": "actor_rollout_ref.rollout.n",
    "max_prompt_length": "data.max_prompt_length",
    "max_completion_length": "data.max_response_length",
    "per_device_train_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "unsloth_vllm_standby": "actor_rollout_ref.rollout.free_cache_engine",
    "max_num_seqs": "actor_rollout_ref.rollout.max_num_seqs",
    "use_gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
}
# Keys whose values the budget's colocate layout assumes; another value would make the sheet wrong.
ASSUMED = {
    "actor_rollout_ref.hybrid_engine": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 4096,
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "bfloat16",
    "actor_rollout_ref.model.target_modules": "all-linear",
}


class BudgetMismatch(ValueError):
    """The overrides ask for something the budget's layout cannot describe."""


def plan(cfg: LaunchConfig, values: Mapping[str, Any] | None = None) -> budgets.Plan:
    """The budget's Plan for a configuration's overrides (``values``: all of them, extras included)."""
    v = dict(cfg.verl if values is None else values)
    for key, expected in ASSUMED.items():
        if v.get(key, expected) != expected:
            raise BudgetMismatch(f"{key}={v[key]!r}: the budget sheet describes {key}={expected!r} only")
    prompts = int(v["data.train_batch_size"])
    if int(v["actor_rollout_ref.actor.ppo_mini_batch_size"]) != prompts:
        raise BudgetMismatch(
            "ppo_mini_batch_size must equal data.train_batch_size: one optimizer step per generated batch, "
            "as the budget (and labs/grpo-first) counts a step"
        )
    cards = int(v["trainer.nnodes"]) * int(v["trainer.n_gpus_per_node"])
    micro = int(v["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
    completions = prompts * int(v["actor_rollout_ref.rollout.n"])
    if completions % (cards * micro):
        raise BudgetMismatch(
            f"{completions} completions per step do not split into micro-batches of {micro} on {cards} card(s)"
        )
    fields = {name: v[key] for name, key in PLAN_FROM_VERL.items() if key in v}
    use_kl = bool(v.get("actor_rollout_ref.actor.use_kl_loss", False))
    return budgets.Plan(
        **fields,
        gpu=cfg.gpu,
        gpus=cards,
        layout="colocate",
        trainer_sharding="fsdp",
        load_in_4bit=False,  # verl loads a 16-bit base
        dtype="bfloat16",
        # verl casts the adapter to the base's dtype (FSDP wants one dtype per flat group), and torch's
        # AdamW keeps its states in the parameter's dtype: 2 B each.
        trainable_dtype_bytes=2,
        optim="adamw_torch",
        gradient_accumulation_steps=completions // (cards * micro),
        beta=float(v.get("actor_rollout_ref.actor.kl_loss_coef", 0.0)) if use_kl else 0.0,
        # With LoRA verl's reference is the base with the adapter disabled (ref_in_actor): no second
        # copy, which is what the budget counts for Unsloth's trainer.
        grpo_trainer="unsloth",
        chunked_logits=False,
        fast_inference=True,
    )


def sheet(cfg: LaunchConfig, values: Mapping[str, Any] | None = None) -> budgets.Sheet:
    return budgets.compute(plan(cfg, values))


def cli_args(p: budgets.Plan) -> list[str]:
    """The budget CLI's flags for a plan (the settings that differ from the CLI's defaults), so
    ``python -m budgets <these>`` prints the same sheet and can explore around it (--headroom, ...)."""
    default = budgets.Plan()
    args = []
    for field in dataclasses.fields(budgets.Plan):
        value = getattr(p, field.name)
        if value == getattr(default, field.name) and field.name not in ("model", "gpu"):
            continue
        args += [flag(field.name), flag_text(value)]
    return args


def card_summary(cfg: LaunchConfig, s: budgets.Sheet) -> dict[str, Any]:
    """The figures the launcher prints beside a configuration: layout, cards, weight sync, verdict."""
    return {
        "config": cfg.name,
        "model": s.inputs["model"],
        "cards": f"{cfg.nnodes} x {cfg.n_gpus_per_node} {s.inputs['gpu']}",
        "layout": f"{s.inputs['layout']} ({s.inputs['trainer_sharding']}, vLLM asleep while training)",
        "peak_per_card_gib": round(s.total_bytes / GIB, 2),
        "capacity_gib": round(s.capacity_bytes / GIB, 2),
        "weight_sync": f"{s.metrics['weight_sync_bytes_per_step'] / GIB:.2f} GiB, {s.metrics['weight_sync']}",
        "fits": s.fits,
        "verdict": s.verdict(),
    }


def describe(cfg: LaunchConfig, s: budgets.Sheet, values: Mapping[str, Any] | None = None) -> str:
    """The lines the launcher prints: the sheet, then the per-card verdict of the configuration."""
    summary = card_summary(cfg, s)
    lora_sync = s.metrics["trainable_params"] * 2
    cli = shlex.join(["python", "-m", "budgets", *cli_args(plan(cfg, values))])
    return "\n".join(
        [
            s.table(),
            "",
            f"the same sheet from the budget CLI: {cli}",
            "",
            f"configuration {cfg.name}: {cfg.description}",
            f"  cards:       {summary['cards']} ({cfg.cards} in all)",
            f"  layout:      {summary['layout']}",
            f"  per card:    peak {summary['peak_per_card_gib']} GiB of {summary['capacity_gib']} GiB",
            f"  weight sync: {summary['weight_sync']} (budget's colocate layout); verl with LoRA sends "
            f"the adapter only: {lora_sync / (1 << 20):.1f} MiB in bf16",
            "  not counted: vLLM's own CUDA context beside the FSDP worker (~0.5 GiB), vLLM's LoRA slots",
            f"  verdict:     {summary['verdict']}",
        ]
    )


# The Qwen3 bases a 16 GB card could hold in bf16, smallest first (shapes in budgets/models/).
QWEN3_BASES = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B")


def candidates(cfg: LaunchConfig, models: tuple[str, ...] = QWEN3_BASES) -> list[dict[str, Any]]:
    """Each model in the configuration's place: its peak per card and whether it fits."""
    rows = []
    for model in models:
        s = sheet(cfg, {**cfg.verl, "actor_rollout_ref.model.path": model})
        rows.append({"model": model, "peak_gib": round(s.total_bytes / GIB, 2), "fits": s.fits})
    return rows


def largest_that_fits(cfg: LaunchConfig, models: tuple[str, ...] = QWEN3_BASES) -> str | None:
    """The largest of ``models`` whose sheet fits the configuration's card (None if none does)."""
    fitting = [row["model"] for row in candidates(cfg, models) if row["fits"]]
    return fitting[-1] if fitting else None
