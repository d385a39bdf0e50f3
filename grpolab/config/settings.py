"""A lab's settings: the book's recipe, one reader of lab.toml, one set of flags, one validator.

Every chapter starts from the book's recipe (grpolab/recipe.toml: chapter 1's run, a table per
profile: `[profile.gpu]` the real run on a 16 GB card, `[profile.cpu]` the tiny stand-in), and its
`labs/<chapter>/lab.toml` states only what it changes, in the same shape. Settings keep TRL's and
Unsloth's names (`num_generations`, `per_device_train_batch_size`, `gpu_memory_utilization`, ...),
the budget's vocabulary (budgets.vocabulary: the help every flag prints), so `settings.plan()` is a
plain copy and the lab's flags and the budget CLI's flags match.

Every setting is a flag of the lab (`--num-generations 4`, `--fast-inference false`); the values
the command line changed are kept in `settings.overridden`. A chapter also declares its layout
(`layout`, grpolab.config.layouts): how generation and training share the cards. `check()` refuses settings
that cannot work before anything heavy is imported, with one line that says what is wrong and how
to fix it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgets.vocabulary import add_setting, flag, flag_text
from grpolab.config.errors import LabSettingsError
from task.dataset import chatml_chars

PROFILES = ("gpu", "cpu")
RECIPE = Path(__file__).resolve().parents[1] / "recipe.toml"


def setting(**kwargs: Any) -> Any:
    """A lab setting; its help is the vocabulary's (budgets.vocabulary.HELP), its value the recipe's
    unless the chapter's lab.toml or the command line says otherwise."""
    return field(**kwargs)


@dataclass(frozen=True)
class LabSettings:
    """What one profile of a lab trains with.

    Parameters that control the task and the model:
        task, task_config, model, gpu, load_in_4bit, dtype, fast_inference, max_seq_length, gpu_memory_utilization,
        lora_rank, lora_alpha, max_lora_rank, target_modules, use_gradient_checkpointing
    Parameters that control generation (the group):
        num_generations, max_completion_length, temperature, top_p, rollout_adapter
    Parameters that control the loss and the optimizer:
        loss_type, scale_rewards, beta, epsilon, num_iterations, optim, learning_rate,
        lr_scheduler_type, warmup_steps, weight_decay, max_grad_norm, per_device_train_batch_size,
        gradient_accumulation_steps, vllm_importance_sampling_correction
    Parameters that control the run:
        max_steps, num_prompts, eval_prompts, seed, logging_steps, save_steps
    """

    chapter: str = setting()
    profile: str = setting()
    # --- the task and the model ---------------------------------------------------------------
    task: str = setting()
    model: str = setting()
    gpu: str = setting()
    load_in_4bit: bool = setting()
    dtype: str = setting()
    fast_inference: bool = setting()
    max_seq_length: int = setting()
    gpu_memory_utilization: float = setting()
    lora_rank: int = setting()
    lora_alpha: int = setting()
    max_lora_rank: int = setting()
    target_modules: tuple[str, ...] = setting()
    use_gradient_checkpointing: str = setting()
    # --- generation ----------------------------------------------------------------------------
    num_generations: int = setting()
    max_completion_length: int = setting()
    temperature: float = setting()
    top_p: float = setting()
    # --- the loss and the optimizer ------------------------------------------------------------
    loss_type: str = setting()
    scale_rewards: str = setting()
    beta: float = setting()
    epsilon: float = setting()
    num_iterations: int = setting()
    optim: str = setting()
    learning_rate: float = setting()
    lr_scheduler_type: str = setting()
    warmup_steps: int = setting()
    weight_decay: float = setting()
    max_grad_norm: float = setting()
    per_device_train_batch_size: int = setting()
    gradient_accumulation_steps: int = setting()
    vllm_importance_sampling_correction: bool = setting()
    # --- the run -------------------------------------------------------------------------------
    max_steps: int = setting()
    num_prompts: int = setting()
    eval_prompts: int = setting()
    seed: int = setting()
    logging_steps: int = setting()
    save_steps: int = setting()
    # --- optional -----------------------------------------------------------------------------
    task_config: str = setting(default="{}")
    unsloth_vllm_standby: bool = setting(default=False)
    rollout_adapter: bool = setting(default=True)
    other_processes_gib: float = setting(default=0.0)
    # --- what the chapter declares (lab.toml only: not a flag, not a param) ------------------------
    layout: str = field(default="shared", metadata={"flag": False})
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
        return min(self.prompt_room, chatml_chars(self.get_task().worst_case_prompt()))

    def get_task(self):
        """The task these settings train (task.get_task of `task` and `task_config`)."""
        from task import get_task

        return get_task(self.task, self.task_config)

    @property
    def generation_batch_size(self) -> int:
        """Completions generated per optimizer step on one device (TRL's default)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def backend(self) -> str:
        return "unsloth+vllm" if self.fast_inference else f"unsloth-{self.profile}"

    @property
    def grpo_trainer(self) -> str:
        """Which GRPO trainer runs: the layout's (Unsloth's generated one in the shared layout, on both
        profiles: grpolab.model.unsloth_trainer)."""
        from grpolab.config.layouts import get_layout

        return get_layout(self.layout).trainer

    def plan(self):
        """The budget's Plan: the settings both share, under the same names, in the chapter's layout."""
        from budgets import Plan
        from budgets.plan import PLAN_FIELDS

        shared = {name: getattr(self, name) for name in PLAN_FIELDS if name in FIELDS}
        return Plan(
            **shared,
            max_prompt_length=self.max_prompt_length,
            grpo_trainer=self.grpo_trainer,
            layout=self.layout,
        )

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
    group = parser.add_argument_group(
        "settings (override lab.toml and the recipe; the same names as TRL, Unsloth and the budget)"
    )
    for f in dataclasses.fields(LabSettings):
        if f.name in FLAGS:
            add_setting(group, f.name, _HINTS[f.name])


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave."""
    return {name: getattr(args, name) for name in FLAGS if getattr(args, name, None) is not None}


# What a chapter's lab.toml may say of the chapter itself rather than of its settings: the chapter whose
# README run its command starts from (chapter 6 ships chapter 1's adapter; tests/suite.py reads it).
CHAPTER_KEYS = ("starts_from",)


def read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LabSettingsError(f"no lab settings at {path}: pass a lab folder such as labs/grpo-first")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise LabSettingsError(f"{path} is not valid TOML ({exc})") from None


def read_lab_toml(lab_dir: str | Path) -> dict[str, Any]:
    return read_toml(Path(lab_dir) / "lab.toml")


def profile_values(raw: dict[str, Any], profile: str) -> dict[str, Any]:
    """A lab.toml-shaped table's values for one profile: the shared ones, then [profile.<name>]'s."""
    tables = raw.get("profile", {})
    return {**{k: v for k, v in raw.items() if k != "profile"}, **tables.get(profile, {})}


def recipe(profile: str) -> dict[str, Any]:
    """The book's recipe for one profile: the values a chapter's lab.toml does not change."""
    return profile_values(read_toml(RECIPE), profile)


def lab_settings(
    lab_dir: str | Path, profile: str, overrides: Mapping[str, Any] | None = None
) -> LabSettings:
    """The settings of one profile of a chapter: the book's recipe, then what `<lab_dir>/lab.toml`
    changes, then the command line's overrides."""
    from budgets.plan import follow_group

    if profile not in PROFILES:
        raise LabSettingsError(f"unknown profile {profile!r}: use one of {', '.join(PROFILES)}")
    raw = read_lab_toml(lab_dir)
    path = Path(lab_dir) / "lab.toml"
    unknown_profiles = sorted(set(raw.get("profile", {})) - set(PROFILES))
    if unknown_profiles:
        raise LabSettingsError(f"{path}: unknown profile table(s) {', '.join(unknown_profiles)}")
    values = {**recipe(profile), **profile_values(raw, profile), "profile": profile}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "num_generations" in given and "per_device_train_batch_size" not in given:
        values.update(follow_group(values, given["num_generations"]))  # the batch follows the group
    values.update(given)
    for key in CHAPTER_KEYS:  # of the chapter, not of its runs
        values.pop(key, None)
    unknown = sorted(set(values) - set(FIELDS) - {"layout"})
    if unknown:
        raise LabSettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    required = [f.name for f in dataclasses.fields(LabSettings) if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise LabSettingsError(f"{path} and the recipe ({RECIPE.name}) leave {', '.join(missing)} unset")
    values["target_modules"] = tuple(values["target_modules"])
    values.update(_task_values(values, given, Path(lab_dir)))
    values["use_gradient_checkpointing"] = flag_text(values["use_gradient_checkpointing"])
    return LabSettings(**values, lab_dir=str(lab_dir), overridden=frozenset(given))


def _task_values(values: dict[str, Any], given: Mapping[str, Any], lab_dir: Path) -> dict[str, Any]:
    """The task as a run records it: a file named in lab.toml is relative to the chapter's folder, one
    given on the command line to the current folder, and either is kept as an absolute path; a
    `task_config` written as a TOML table is kept as JSON."""
    from task import is_path

    out: dict[str, Any] = {}
    task = values.get("task")
    if isinstance(task, str) and is_path(task):
        base = Path.cwd() if "task" in given else lab_dir
        out["task"] = str((base / Path(task).expanduser()).resolve())
    config = values.get("task_config")
    if isinstance(config, Mapping):
        out["task_config"] = json.dumps(dict(config), sort_keys=True)
    return out


def check(s: LabSettings) -> None:
    """Raise LabSettingsError for settings that cannot work, before any model loads: an unknown task
    or model path, a layout the harness cannot run, counts that must be positive, a group of one, a
    completion that leaves no room for the prompt, float32 or standby where vLLM cannot have them.
    What the budget checks (group and batch, lengths, ranks, the vLLM share) it checks once, in
    budgets.plan.resolve."""
    from budgets import BudgetError
    from budgets.plan import resolve
    from grpolab.config.layouts import require_runnable

    require_runnable(s.layout)
    try:
        s.get_task()
    except (KeyError, ValueError, OSError) as err:  # an unknown name, a file or config that makes no task
        text = str(err).strip()
        raise LabSettingsError(text if text.startswith("task_config:") else f"task: {text}") from None
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
    if not s.rollout_adapter and s.fast_inference:
        raise LabSettingsError(
            "rollout_adapter: false samples the rollouts with the adapter disabled on the trainer's own "
            "generation (chapter 8's reproduction of vLLM serving the base), and fast_inference samples "
            "them in vLLM: pass --fast-inference false, or --rollout-adapter true"
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
