"""A lab's plan from its `lab.toml`, so the lab and `python -m budgets --lab` print the same sheet."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .errors import BudgetError
from .plan import Plan

# lab.toml key (TRL / Unsloth spelling) -> Plan field
KEYS = {
    "model_shape": "model",
    "gpu": "gpu",
    "layout": "layout",
    "gpus": "gpus",
    "vllm_gpus": "vllm_gpus",
    "gpu_memory_utilization": "vllm_util",
    "lora_rank": "lora_rank",
    "full_finetuning": "full",
    "target_modules": "target_modules",
    "optimizer": "optimizer",
    "optim": "optimizer",
    "max_completion_length": "completion_len",
    "num_generations": "generations",
    "per_device_train_batch_size": "batch",
    "gradient_accumulation_steps": "grad_accum",
    "max_seq_length": "max_seq_length",
    "beta": "beta",
    "gradient_checkpointing": "gradient_checkpointing",
    "chunked_logits": "chunked_logits",
    "standby": "standby",
    "unsloth_vllm_standby": "standby",
    "link_gbps": "link_gbps",
    "fast_inference": "fast_inference",
    "max_lora_rank": "max_lora_rank",
    "enforce_eager": "enforce_eager",
    "max_num_seqs": "max_num_seqs",
    "prompt_len": "prompt_len",
}


def read_lab(lab_dir: str | Path, profile: str = "gpu") -> dict[str, Any]:
    """The [profile.<name>] table of <lab_dir>/lab.toml."""
    path = Path(lab_dir) / "lab.toml"
    if not path.is_file():
        raise BudgetError(f"lab: {path} not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise BudgetError(f"lab: {path} is not valid TOML ({exc})") from None
    profiles = data.get("profile", {})
    if profile not in profiles:
        raise BudgetError(
            f"profile: {path} has no [profile.{profile}]; it has {', '.join(profiles) or 'none'}"
        )
    return dict(profiles[profile])


def plan_from_lab(lab_dir: str | Path, profile: str = "gpu", **overrides: Any) -> Plan:
    """The plan of a lab's profile; `overrides` are the lab's command-line overrides, in lab.toml's
    spelling (num_generations=4, max_completion_length=16) or Plan's (generations=4)."""
    settings = read_lab(lab_dir, profile)
    settings.update({k: v for k, v in overrides.items() if v is not None})
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in settings.items():
        name = KEYS.get(key, key if key in Plan.__dataclass_fields__ else None)
        if name is None:
            extra[key] = value
            continue
        fields[name] = value
    if "model" not in fields and "model" in settings:
        fields["model"] = settings["model"]
    if "load_in_4bit" in settings and "quant" not in fields:
        fields["quant"] = "nf4" if settings["load_in_4bit"] else "bf16"
    # The lab's dtype decides the bytes of activations, KV and unquantized weights.
    dtype = str(settings.get("dtype", "")).lower().removeprefix("torch.")
    if dtype and "compute_dtype_bytes" not in fields:
        sizes = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
        if dtype not in sizes:
            raise BudgetError(f"dtype: must be float32, bfloat16 or float16, got {settings['dtype']!r}")
        fields["compute_dtype_bytes"] = sizes[dtype]
    gc = fields.get("gradient_checkpointing")
    if isinstance(gc, bool):
        fields["gradient_checkpointing"] = "true" if gc else "none"
    if "target_modules" in fields:
        fields["target_modules"] = tuple(fields["target_modules"])
    if fields.get("full"):
        fields["lora_rank"] = None
    # The prompt length a lab allows: its own key, else what max_seq_length leaves the completion.
    if "prompt_len" not in fields:
        if "max_seq_length" not in fields or "completion_len" not in fields:
            raise BudgetError(
                f"lab: [profile.{profile}] needs prompt_len or max_seq_length and max_completion_length"
            )
        fields["prompt_len"] = fields["max_seq_length"] - fields["completion_len"]
        if fields["prompt_len"] <= 0:
            raise BudgetError(
                f"max_completion_length: {fields['completion_len']} leaves no room for the prompt "
                f"in max_seq_length {fields['max_seq_length']}"
            )
    fields.setdefault("layout", "shared")
    fields.setdefault("gpus", 1)
    fields["extra"] = extra
    return Plan(**fields)
