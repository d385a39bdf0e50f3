"""A lab's settings: one reader of lab.toml, one set of flags, one validator.

Every value a lab trains with lives in `labs/<chapter>/lab.toml`: shared values at the top, and a
table per profile (`[profile.gpu]`: the real run on a 16 GB card; `[profile.cpu]`: the tiny
stand-in) that overrides them. Settings keep TRL's and Unsloth's names (`num_generations`,
`per_device_train_batch_size`, `gpu_memory_utilization`, ...), the same names the budget's `Plan`
uses, so `settings.plan()` is a plain copy and the lab's flags and the budget CLI's flags match.

Every setting is a flag of the lab (`--num-generations 4`, `--fast-inference false`); the values
the command line changed are kept in `settings.overridden`. `check()` refuses settings that cannot
work before anything heavy is imported, with one line that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILES = ("gpu", "cpu")


class LabSettingsError(ValueError):
    """Settings that cannot work; the message is one line with the fix."""


def setting(help: str, **kwargs: Any) -> Any:
    return field(metadata={"help": help}, **kwargs)


@dataclass(frozen=True)
class LabSettings:
    """What one profile of a lab trains with.

    Parameters that control the task and the model:
        task, model, gpu, load_in_4bit, dtype, fast_inference, max_seq_length, gpu_memory_utilization,
        lora_rank, lora_alpha, max_lora_rank, target_modules, use_gradient_checkpointing
    Parameters that control generation (the group):
        num_generations, max_completion_length, temperature, top_p
    Parameters that control the loss and the optimizer:
        loss_type, scale_rewards, beta, epsilon, num_iterations, optim, learning_rate,
        lr_scheduler_type, warmup_steps, weight_decay, max_grad_norm, per_device_train_batch_size,
        gradient_accumulation_steps, vllm_importance_sampling_correction
    Parameters that control the run:
        max_steps, num_prompts, eval_prompts, seed, logging_steps, save_steps
    """

    chapter: str = setting("the chapter's name: its MLflow experiment and output folder")
    profile: str = setting("gpu (the real run) or cpu (the tiny stand-in)")
    # --- the task and the model ---------------------------------------------------------------
    task: str = setting("the task to learn, from task.TASKS")
    model: str = setting("a Hub id or a local model folder (tiny-qwen3: the CPU stand-in, built offline)")
    gpu: str = setting("the card the budget sheet is checked against when no GPU is detected")
    load_in_4bit: bool = setting("bitsandbytes NF4 base weights")
    dtype: str = setting(
        "compute dtype: auto (what Unsloth picks for the card), bfloat16, float16 or float32"
    )
    fast_inference: bool = setting("vLLM in this process generates (Unsloth); false: transformers' generate")
    max_seq_length: int = setting("prompt + completion tokens the model and vLLM are sized for")
    gpu_memory_utilization: float = setting("vLLM's share of the card (Unsloth scales it by the free memory)")
    lora_rank: int = setting("LoRA rank r")
    lora_alpha: int = setting("LoRA alpha (the adapter's output is scaled by alpha / r)")
    max_lora_rank: int = setting("the largest LoRA rank vLLM's adapter slots hold")
    target_modules: tuple[str, ...] = setting("the linear layers LoRA adapts")
    use_gradient_checkpointing: str = setting("unsloth (checkpoints offloaded to CPU RAM), true or false")
    # --- generation ----------------------------------------------------------------------------
    num_generations: int = setting("completions per prompt: the GRPO group")
    max_completion_length: int = setting("tokens per completion")
    temperature: float = setting("sampling temperature of the rollouts")
    top_p: float = setting("nucleus sampling of the rollouts")
    # --- the loss and the optimizer ------------------------------------------------------------
    loss_type: str = setting("TRL's loss: dr_grpo, grpo, dapo, bnpo")
    scale_rewards: str = setting("divide advantages by the group's std: group, batch or none")
    beta: float = setting("KL weight against the reference policy (0: no reference)")
    epsilon: float = setting("PPO clip range of the probability ratio")
    num_iterations: int = setting("optimizer passes over each generated batch")
    optim: str = setting("optimizer: adamw_8bit or adamw_torch")
    learning_rate: float = setting("peak learning rate")
    lr_scheduler_type: str = setting("learning-rate schedule: linear, constant, cosine")
    warmup_steps: int = setting("warm-up steps (Unsloth's config would default to 10%% of the steps)")
    weight_decay: float = setting("AdamW weight decay (Unsloth's config would default to 0.001)")
    max_grad_norm: float = setting("gradient clipping norm")
    per_device_train_batch_size: int = setting("completions per micro-batch (a whole number of groups)")
    gradient_accumulation_steps: int = setting("micro-batches per optimizer step")
    vllm_importance_sampling_correction: bool = setting(
        "correct for vLLM's sampling log-probs differing from the trainer's (TRL: true, Unsloth: false)"
    )
    # --- the run -------------------------------------------------------------------------------
    max_steps: int = setting("optimizer steps")
    num_prompts: int = setting("training prompts to build")
    eval_prompts: int = setting(
        "held-out prompts scored greedily before and after training (0: no evaluation)"
    )
    seed: int = setting("seed of the prompts, the adapter's init and sampling")
    logging_steps: int = setting("log every N steps")
    save_steps: int = setting("checkpoint every N steps")
    # --- optional -----------------------------------------------------------------------------
    unsloth_vllm_standby: bool = setting(
        "UNSLOTH_VLLM_STANDBY: vLLM releases its KV cache while the trainer runs", default=False
    )
    other_processes_gib: float = setting(
        "GiB other processes hold on the card (measured at start on a GPU)", default=0.0
    )
    lab_dir: str = field(default="", compare=False, metadata={"flag": False})
    overridden: frozenset[str] = field(default=frozenset(), compare=False, metadata={"flag": False})

    # --- derived ---------------------------------------------------------------------------------
    @property
    def prompt_room(self) -> int:
        """What max_seq_length leaves a prompt beside a full completion: longer prompts are dropped."""
        return self.max_seq_length - self.max_completion_length

    @property
    def max_prompt_length(self) -> int:
        """The budget's prompt length: the task's longest prompt, rendered in the ChatML turns Qwen3
        uses, counted as one token per character (a token is at least a character, so this bounds any
        tokenizer's count), and never more than prompt_room."""
        from task import get_task

        return min(self.prompt_room, chatml_chars(get_task(self.task).worst_case_prompt()))

    @property
    def generation_batch_size(self) -> int:
        """Completions generated per optimizer step on one device (TRL's default)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def backend(self) -> str:
        return "unsloth+vllm" if self.fast_inference else f"unsloth-{self.profile}"

    @property
    def grpo_trainer(self) -> str:
        """Which GRPO trainer runs: Unsloth's generated one, on both profiles (grpolab.unsloth_trainer)."""
        return "unsloth"

    def plan(self):
        """The budget's Plan: the settings both share, under the same names."""
        from budgets import Plan
        from budgets.plan import PLAN_FIELDS

        shared = {name: getattr(self, name) for name in PLAN_FIELDS if name in FIELDS}
        return Plan(**shared, max_prompt_length=self.max_prompt_length, grpo_trainer=self.grpo_trainer)

    def as_params(self) -> dict[str, str]:
        """Every setting as a string, for MLflow params."""
        return {name: flag_text(getattr(self, name)) for name in FIELDS}

    def replace(self, **changes: Any) -> LabSettings:
        return dataclasses.replace(self, **changes)


FIELDS = tuple(f.name for f in dataclasses.fields(LabSettings) if f.metadata.get("flag", True))
# The settings a lab's command line accepts: every setting but the chapter and the profile.
FLAGS = tuple(name for name in FIELDS if name not in ("chapter", "profile"))
_HINTS = typing.get_type_hints(LabSettings)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (`--num-generations`), typed like the setting, default None."""
    from budgets.cli import CHOICES, add_setting

    group = parser.add_argument_group(
        "settings (override lab.toml; the same names as TRL, Unsloth and the budget)"
    )
    for f in dataclasses.fields(LabSettings):
        if f.name in FLAGS:
            add_setting(group, f.name, _HINTS[f.name], f.metadata["help"], CHOICES.get(f.name))


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave."""
    return {name: getattr(args, name) for name in FLAGS if getattr(args, name, None) is not None}


def read_lab_toml(lab_dir: str | Path) -> dict[str, Any]:
    path = Path(lab_dir) / "lab.toml"
    if not path.is_file():
        raise LabSettingsError(f"no lab settings at {path}: pass a lab folder such as labs/grpo-first")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise LabSettingsError(f"{path} is not valid TOML ({exc})") from None


def lab_settings(
    lab_dir: str | Path, profile: str, overrides: Mapping[str, Any] | None = None
) -> LabSettings:
    """The settings of one profile of `<lab_dir>/lab.toml`, with the command line's overrides."""
    from budgets.plan import follow_group

    if profile not in PROFILES:
        raise LabSettingsError(f"unknown profile {profile!r}: use one of {', '.join(PROFILES)}")
    raw = read_lab_toml(lab_dir)
    path = Path(lab_dir) / "lab.toml"
    tables = raw.pop("profile", {})
    if profile not in tables:
        raise LabSettingsError(f"{path} has no [profile.{profile}] table")
    values = {**raw, **tables[profile], "profile": profile}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "num_generations" in given and "per_device_train_batch_size" not in given:
        values.update(follow_group(values, given["num_generations"]))  # the batch follows the group
    values.update(given)
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise LabSettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    required = [f.name for f in dataclasses.fields(LabSettings) if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise LabSettingsError(f"{path} [profile.{profile}] lacks {', '.join(missing)}")
    values["target_modules"] = tuple(values["target_modules"])
    values["use_gradient_checkpointing"] = flag_text(values["use_gradient_checkpointing"])
    return LabSettings(**values, lab_dir=str(lab_dir), overridden=frozenset(given))


def check(s: LabSettings) -> None:
    """Raise LabSettingsError for settings that cannot work, before any model loads. What the budget
    checks (group and batch, lengths, ranks, the vLLM share) it checks once, in budgets.plan.resolve."""
    from budgets import BudgetError
    from budgets.plan import resolve
    from task import TASKS

    if s.task not in TASKS:
        raise LabSettingsError(f"task: unknown task {s.task!r}; pass --task with one of {', '.join(TASKS)}")
    for name in (
        "max_steps",
        "num_prompts",
        "max_seq_length",
        "max_completion_length",
        "logging_steps",
        "save_steps",
    ):
        if getattr(s, name) <= 0:
            raise LabSettingsError(
                f"{name}: must be positive, got {getattr(s, name)}: pass {flag(name)} 1 or more"
            )
    if s.num_generations < 2:
        raise LabSettingsError(
            f"num_generations: {s.num_generations} leaves nothing to compare: GRPO scores a completion against "
            "its group, pass --num-generations 2 or more"
        )
    if s.max_completion_length >= s.max_seq_length:
        raise LabSettingsError(
            f"max_completion_length: {s.max_completion_length} leaves no room for the prompt in max_seq_length "
            f"{s.max_seq_length}: lower --max-completion-length below {s.max_seq_length} or raise --max-seq-length"
        )
    if s.learning_rate <= 0:
        raise LabSettingsError(f"learning_rate: must be positive, got {s.learning_rate}")
    if s.fast_inference and s.dtype == "float32":
        # unsloth_zoo's load_vllm raises "We do not support dtype = float32 yet!" deep in the load.
        raise LabSettingsError(
            "dtype: vLLM in Unsloth (fast_inference) does not run float32: pass --dtype auto (bfloat16, or "
            "float16 on cards without bf16), or --fast-inference false to generate with transformers"
        )
    if s.unsloth_vllm_standby and not s.fast_inference:
        raise LabSettingsError(
            "unsloth_vllm_standby: standby puts Unsloth's in-process vLLM to sleep while the trainer runs, and "
            "fast_inference is false (no vLLM): pass --fast-inference true or --unsloth-vllm-standby false"
        )
    _check_model(s)
    try:
        resolve(s.plan())
    except BudgetError as err:
        raise LabSettingsError(str(err)) from None


def _check_model(s: LabSettings) -> None:
    """A path must hold a model; a Hub id is only checked for shape (downloads happen at load)."""
    if s.model == "tiny-qwen3":
        return
    path = Path(s.model).expanduser()
    looks_like_path = s.model.startswith((".", "/", "~")) or path.exists() or s.model.count("/") != 1
    if looks_like_path and not (path / "config.json").is_file():
        raise LabSettingsError(
            f"model: no model at {s.model!r}: pass --model with a folder holding config.json, or a Hub id such "
            "as unsloth/Qwen3-4B"
        )


def chatml_chars(messages: list[dict[str, str]]) -> int:
    """Characters of `messages` as ChatML with the assistant's turn opened, special tokens included."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return len(turns + "<|im_start|>assistant\n")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def flag_text(value: Any) -> str:
    """A setting's value as its flag takes it (and as MLflow params show it)."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
