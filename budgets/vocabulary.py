"""One vocabulary for every setting: its name, what it means, the values it takes, how a flag reads it.

The names are TRL's (`GRPOConfig`) and Unsloth's (`FastLanguageModel`) where those libraries have
one (`num_generations`, `per_device_train_batch_size`, `gpu_memory_utilization`, ...), and the
budget's own otherwise (`gpu`, `layout`, `gpus`). The budget's `Plan`, a lab's `LabSettings`,
lab.toml, the lab's flags, the budget CLI's flags and the MLflow params all use these names, so the
one help text here is what every `--help` prints. This module sits at the bottom: it imports nothing
of the project, and everything that builds flags or prints advice builds on it.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Any

HELP: dict[str, str] = {
    # --- the chapter and the task --------------------------------------------------------------
    "chapter": "the chapter's name: its MLflow experiment and output folder",
    "profile": "gpu (the real run) or cpu (the tiny stand-in)",
    "task": (
        "the task to learn: one of task.TASKS, a task file (my_task.py), a data file (.jsonl, .csv, .parquet) "
        "or reasoning-gym:<dataset> (its longest prompt sets max_prompt_length)"
    ),
    "task_config": (
        'the task\'s config, JSON: a data file\'s columns and checker ({"question": "q", "answer": "a", '
        '"checker": "number"}), a reasoning-gym dataset\'s arguments'
    ),
    # --- the model -----------------------------------------------------------------------------
    "model": "a Hub id, a local model folder or config.json, or a shipped shape (tiny-qwen3: the CPU stand-in)",
    "load_in_4bit": "bitsandbytes NF4 base weights (false: 16-bit)",
    "dtype": "compute dtype: auto (what Unsloth picks for the card), bfloat16, float16 or float32",
    "fast_inference": "vLLM in this process generates (Unsloth); false: transformers' generate",
    "max_seq_length": "prompt + completion tokens the model and vLLM are sized for",
    "gpu_memory_utilization": "vLLM's share of the card, in (0, 1] (Unsloth scales it by the free memory)",
    "lora_rank": "LoRA rank r (PEFT's r)",
    "lora_alpha": "LoRA alpha (the adapter's output is scaled by alpha / r)",
    "max_lora_rank": "the largest LoRA rank vLLM's adapter slots hold (default: lora_rank)",
    "target_modules": "the linear layers LoRA adapts",
    "full_finetuning": "train every parameter instead of LoRA",
    "use_gradient_checkpointing": "unsloth (checkpoints offloaded to CPU RAM), true or false",
    # --- generation ----------------------------------------------------------------------------
    "num_generations": "completions per prompt: the GRPO group",
    "max_prompt_length": "tokens of the longest prompt",
    "max_completion_length": "tokens per completion",
    "temperature": "sampling temperature of the rollouts",
    "top_p": "nucleus sampling of the rollouts",
    "unsloth_vllm_standby": (
        "Unsloth's standby (UNSLOTH_VLLM_STANDBY): vLLM releases its KV cache while the trainer runs; "
        "TRL's vllm_enable_sleep_mode in the colocate layout"
    ),
    "rollout_adapter": (
        "sample the rollouts with the LoRA adapter on (false: from the base while the adapter trains, "
        "the failure chapter 8 reproduces without vLLM)"
    ),
    "unsloth_vllm_standby_util_override": "UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE: keep gpu_memory_utilization under standby",
    "max_num_seqs": "vLLM's batch (default: what Unsloth or TRL pick)",
    "enforce_eager": "vLLM without CUDA graphs",
    # --- the loss and the optimizer ------------------------------------------------------------
    "loss_type": "TRL's loss: dr_grpo, grpo, dapo, bnpo",
    "scale_rewards": "divide advantages by the group's std: group, batch or none",
    "beta": "KL weight against the reference policy (0: no reference)",
    "epsilon": "PPO clip range of the probability ratio",
    "num_iterations": "optimizer passes over each generated batch",
    "optim": "optimizer: adamw_8bit or adamw_torch (fp32 states)",
    "learning_rate": "peak learning rate",
    "lr_scheduler_type": "learning-rate schedule: linear, constant, cosine",
    "warmup_steps": "warm-up steps (Unsloth's config would default to 10%% of the steps)",
    "weight_decay": "AdamW weight decay (Unsloth's config would default to 0.001)",
    "max_grad_norm": "gradient clipping norm",
    "per_device_train_batch_size": "completions per micro-batch per trainer card (a whole number of groups)",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "vllm_importance_sampling_correction": (
        "correct for vLLM's sampling log-probs differing from the trainer's (TRL: true, Unsloth: false)"
    ),
    "chunked_logits": "Unsloth's chunked log-prob kernel (false: whole-batch logits)",
    "grpo_trainer": "the GRPO trainer that runs: unsloth (its generated trainer) or trl (TRL's own)",
    "trainable_dtype_bytes": "bytes per LoRA param, grad and AdamW state (default: 4; 2 under TRL's trainer on cpu)",
    # --- the run -------------------------------------------------------------------------------
    "max_steps": "optimizer steps",
    "num_prompts": "training prompts to build",
    "eval_prompts": "held-out prompts scored greedily before and after training (0: no evaluation)",
    "seed": "seed of the prompts, the adapter's init and sampling",
    "logging_steps": "log every N steps",
    "save_steps": "checkpoint every N steps",
    # --- the cards -----------------------------------------------------------------------------
    "gpu": "the card the sheet is checked against (a lab's, when no GPU is detected), from the catalog",
    "gpus": "cards in all",
    "layout": "shared (Unsloth's in-process vLLM on the trainer's weights), colocate or server",
    "vllm_gpus": "server layout: cards given to vLLM (tensor parallel); the rest train",
    "trainer_sharding": "how trainer cards split the model: ddp or fsdp",
    "link_gbps": "trainer -> vLLM link in 10^9 bits/s (server layout weight sync)",
    "other_processes_gib": "GiB other processes (a desktop) hold on the card (measured at start on a GPU)",
}

LAYOUTS = ("shared", "colocate", "server")
SHARDING = ("ddp", "fsdp")
GRPO_TRAINERS = ("unsloth", "trl")
CHOICES: dict[str, tuple] = {
    "layout": LAYOUTS,
    "trainer_sharding": SHARDING,
    "grpo_trainer": GRPO_TRAINERS,
    "use_gradient_checkpointing": ("unsloth", "true", "false"),
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "trainable_dtype_bytes": (2, 4),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2, like every other bad input here."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_setting(
    group: argparse._ActionsContainer, name: str, annotation: Any, help: str | None = None
) -> None:
    """One flag for one setting: --name-with-dashes, typed from the dataclass annotation, with the
    vocabulary's help and choices. Defaults stay None so that only the settings given on the command
    line override."""
    text = str(annotation)
    help = help or HELP[name]
    choices = CHOICES.get(name)
    if text in ("bool", "<class 'bool'>"):
        group.add_argument(flag(name), type=parse_bool, metavar="{true,false}", help=help)
    elif "tuple" in text:
        group.add_argument(flag(name), type=parse_list, metavar="A,B,...", help=help)
    elif choices is not None:
        kind = int if all(isinstance(c, int) for c in choices) else str
        group.add_argument(flag(name), type=kind, choices=choices, help=help)
    elif "float" in text:
        group.add_argument(flag(name), type=float, help=help)
    elif text.startswith("int") or "<class 'int'>" in text:
        group.add_argument(flag(name), type=int, help=help)
    else:
        group.add_argument(flag(name), help=help)


def flag(name: str) -> str:
    """A setting's flag: --num-generations for num_generations."""
    return "--" + name.replace("_", "-")


def flag_text(value: Any) -> str:
    """A setting's value as its flag takes it (and as MLflow params show it)."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
