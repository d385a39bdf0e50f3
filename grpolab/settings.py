"""A lab's settings: read from its lab.toml, overridden from the command line, checked.

Every number a lab trains with lives in `labs/<chapter>/lab.toml`, one table per
profile (`gpu`: the real run on a 16 GB card; `cpu`: the tiny stand-in). The budget
CLI reads the same file, so the sheet it prints is the one the lab prints.

`check()` refuses settings that cannot work before anything heavy is imported, with
one line that says what is wrong and how to fix it.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = ("gpu", "cpu")


class LabSettingsError(ValueError):
    """Settings that cannot work; the message is one line with the fix."""


@dataclass(frozen=True)
class LabSettings:
    chapter: str
    task: str
    profile: str
    # The policy
    model: str
    model_shape: str
    backend: str
    gpu: str
    load_in_4bit: bool
    fast_inference: bool
    max_seq_length: int
    max_lora_rank: int
    lora_rank: int
    lora_alpha: int
    target_modules: tuple[str, ...]
    gradient_checkpointing: str
    gpu_memory_utilization: float
    optimizer: str
    # GRPO
    num_generations: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_completion_length: int
    learning_rate: float
    beta: float
    epsilon: float
    num_iterations: int
    loss_type: str
    temperature: float
    top_p: float
    max_steps: int
    logging_steps: int
    save_steps: int
    seed: int
    num_prompts: int
    # Optional keys
    dtype: str = "auto"
    lr_scheduler_type: str = "linear"
    lab_dir: str = field(default="", compare=False)

    @property
    def max_prompt_length(self) -> int:
        """Prompts longer than this are filtered out: prompt + completion must fit the sequence."""
        return self.max_seq_length - self.max_completion_length

    @property
    def generation_batch_size(self) -> int:
        """Completions generated per optimizer step on one device (TRL's default)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def as_params(self) -> dict[str, str]:
        """Every value as a string, for MLflow params."""
        return {
            k: ",".join(v) if isinstance(v, tuple) else str(v) for k, v in dataclasses.asdict(self).items()
        }


# Command-line flag -> settings key, for the settings users are expected to experiment with.
OVERRIDABLE = (
    "model",
    "max_steps",
    "num_generations",
    "max_completion_length",
    "learning_rate",
    "num_prompts",
    "seed",
)


def load_lab(lab_dir: str | Path, profile: str, **overrides: object) -> LabSettings:
    """Read `<lab_dir>/lab.toml` for one profile and apply the non-None overrides."""
    lab_dir = Path(lab_dir)
    if profile not in PROFILES:
        raise LabSettingsError(f"unknown profile {profile!r}: use one of {', '.join(PROFILES)}")
    path = lab_dir / "lab.toml"
    if not path.is_file():
        raise LabSettingsError(f"no lab settings at {path}: pass a lab folder such as labs/grpo-first")
    raw = tomllib.loads(path.read_text())
    table = dict(raw.get("profile", {}).get(profile, {}))
    if not table:
        raise LabSettingsError(f"{path} has no [profile.{profile}] table")
    values = {"chapter": raw["chapter"], "task": raw["task"], "profile": profile, **table}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "model" in overrides and overrides["model"] is not None and "model_shape" not in overrides:
        # A user's own model: the budget reads its shape from the model's config.json.
        values["model_shape"] = str(overrides["model"])
    values["target_modules"] = tuple(values["target_modules"])
    values["lab_dir"] = str(lab_dir)
    known = {f.name for f in dataclasses.fields(LabSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise LabSettingsError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    missing = sorted(f.name for f in dataclasses.fields(LabSettings) if f.name not in values and _required(f))
    if missing:
        raise LabSettingsError(f"{path} [profile.{profile}] lacks {', '.join(missing)}")
    return LabSettings(**values)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def check(s: LabSettings) -> None:
    """Raise LabSettingsError for settings that cannot work, before any model loads."""
    from task import TASKS

    if s.task not in TASKS:
        raise LabSettingsError(f"unknown task {s.task!r}: known tasks are {', '.join(TASKS)}")
    for name in ("max_steps", "num_generations", "max_completion_length", "num_prompts", "max_seq_length"):
        if getattr(s, name) <= 0:
            raise LabSettingsError(
                f"{name} must be positive, got {getattr(s, name)}: pass --{_flag(name)} 1 or more"
            )
    if s.num_generations < 2:
        raise LabSettingsError(
            f"num_generations is {s.num_generations}: GRPO compares completions within a group, use 2 or more"
        )
    if s.generation_batch_size % s.num_generations:
        raise LabSettingsError(
            f"the generation batch ({s.per_device_train_batch_size} x {s.gradient_accumulation_steps} = "
            f"{s.generation_batch_size} completions) is not divisible by num_generations {s.num_generations}: "
            f"use a group size that divides {s.generation_batch_size}, or set per_device_train_batch_size to a "
            f"multiple of {s.num_generations} in lab.toml"
        )
    if s.max_completion_length >= s.max_seq_length:
        raise LabSettingsError(
            f"max_completion_length {s.max_completion_length} leaves no room for the prompt in max_seq_length "
            f"{s.max_seq_length}: lower --max-completion-length below {s.max_seq_length}"
        )
    if s.learning_rate <= 0:
        raise LabSettingsError(f"learning_rate must be positive, got {s.learning_rate}")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise LabSettingsError(f"gpu_memory_utilization must be in (0, 1], got {s.gpu_memory_utilization}")
    if s.lora_rank > s.max_lora_rank:
        raise LabSettingsError(
            f"lora_rank {s.lora_rank} exceeds max_lora_rank {s.max_lora_rank}: raise max_lora_rank"
        )
    _check_model(s)


def _check_model(s: LabSettings) -> None:
    """A path must hold a model; a Hub id is only checked for shape (downloads happen at load)."""
    if s.model == "tiny-qwen3":
        return
    path = Path(s.model).expanduser()
    looks_like_path = s.model.startswith((".", "/", "~")) or path.exists() or s.model.count("/") != 1
    if looks_like_path and not (path / "config.json").is_file():
        raise LabSettingsError(
            f"no model at {s.model!r}: pass a folder with config.json, or a Hub id such as unsloth/Qwen3-4B"
        )


def _flag(name: str) -> str:
    return name.replace("_", "-")
