"""Loading the policy: a 4-bit base model through Unsloth plus a LoRA adapter to train.

On a CUDA GPU this is the real thing: the base weights are loaded once, in 4-bit, and shared
between the trainer and the vLLM engine Unsloth starts in the same process (`fast_inference=True`).
On a CPU Unsloth still loads real bitsandbytes 4-bit layers and trains LoRA through them, but
generation runs through transformers' `generate`.

Import order matters: Unsloth patches transformers and TRL when it is imported, so callers import
this module (or `unsloth`) before either.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Without CUDA, `import unsloth` imports vLLM (a CUDA build), finds it broken, warns the user to
    # reinstall it and blocks it (unsloth/import_fixes.py: disable_broken_vllm). Blocking it first
    # skips that: ~10 s of every CPU start, and a warning that tells a CPU user to reinstall vLLM.
    sys.modules.setdefault("vllm", None)

from unsloth import FastLanguageModel  # after the vLLM block above

from grpolab.config.settings import LabSettings
from grpolab.model.unsloth_trainer import keep_float32
from grpolab.tiny_model import ensure_tiny_model


def resolve_model_path(model: str, task: str | None = None, config: str | None = None) -> str:
    """The tiny CPU model is built and cached on first use (the one for `task`: the book's for the
    book's tasks, grpolab.tiny_model); anything else is a path or a Hub id."""
    if model == "tiny-qwen3":
        return str(ensure_tiny_model(task=task, config=config))
    path = Path(model).expanduser()
    return str(path) if path.exists() else model


def load_model(model_name: str, s: LabSettings):
    """Unsloth's loader with the settings' keywords: (model, tokenizer). `model_name` is a base, or a
    saved adapter's folder, whose base (its adapter_config.json's) Unsloth loads before it attaches the
    adapter through PEFT (chapter 6's reload)."""
    import torch

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_name,
        max_seq_length=s.max_seq_length,
        load_in_4bit=s.load_in_4bit,
        dtype=None if s.dtype == "auto" else getattr(torch, s.dtype),
        # vLLM in the same process, sharing the 4-bit weights with the trainer (GPU only).
        fast_inference=s.fast_inference,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_lora_rank=s.max_lora_rank,
        # Standby: vLLM's KV cache is released while the trainer runs. The loader refuses the keyword
        # unless UNSLOTH_VLLM_STANDBY=1 was set before Unsloth was imported (grpolab.model.cuda_env does).
        **({"unsloth_vllm_standby": True} if s.unsloth_vllm_standby else {}),
    )
    if s.dtype == "float32":
        # Unsloth's GPU loader marks a float32 request; its CPU loader does not, and without the mark
        # Unsloth's GRPO trainer would switch the CPU stand-in to float16 autocast.
        keep_float32(model)
    return model, tokenizer


def load_policy(s: LabSettings):
    """Return (model, tokenizer): the 4-bit base with trainable LoRA adapters attached."""
    model, tokenizer = load_model(resolve_model_path(s.model, s.task, s.task_config), s)
    model = FastLanguageModel.get_peft_model(
        model,
        r=s.lora_rank,
        lora_alpha=s.lora_alpha,
        target_modules=list(s.target_modules),
        # "unsloth": checkpoint each layer and offload the saved activations to CPU memory.
        use_gradient_checkpointing=_checkpointing(s.use_gradient_checkpointing),
        random_state=s.seed,
    )
    return model, tokenizer


def _checkpointing(value: str) -> str | bool:
    return {"true": True, "false": False}.get(value.lower(), value)
