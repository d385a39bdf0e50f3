"""The trainer's precision flags, decided from the dtype Unsloth really loaded the model in.

Why not `torch.cuda.is_bf16_supported()`: torch's own answer (torch/cuda/__init__.py,
`is_bf16_supported(including_emulation=True)`) is True on a T4, because a bf16 tensor can be
made there, while Unsloth loads the model in float16 on any card below compute capability 8.
Unsloth's GRPO trainer then refuses the run (its generated `UnslothGRPOTrainer.__init__`, from
unsloth/models/rl.py): "Model is in float16 precision but you want to use bfloat16 precision".
(Unsloth 2026.10 also rewraps `torch.cuda.is_bf16_supported` on import so that its default
ignores emulation, unsloth/_gpu_init.py; whether a call sees torch's answer or Unsloth's then
depends on import order. The model's dtype does not.)

The rules, as the installed Unsloth 2026.10.9 has them:

- What Unsloth loads (`dtype=None`): `SUPPORTS_BFLOAT16 = capability[0] >= 8`
  (unsloth/_gpu_init.py and unsloth/models/_utils.py, "SUPPORTS_BFLOAT16 = _bf16_cap is not None
  and _bf16_cap[0] >= 8"), then `dtype = torch.float16 if not SUPPORTS_BFLOAT16 else
  torch.bfloat16` (unsloth/models/loader.py, FastLanguageModel.from_pretrained, and
  unsloth/models/llama.py, FastLlamaModel.from_pretrained). An explicit bfloat16 on such a card
  is switched to float16 too ("Device does not support bfloat16. Will change to float16.").
- What its trainer accepts: the guard reads the model's dtype from `model.config.dtype` (or
  `torch_dtype`, else the input embeddings' weight) and raises a TypeError for a float16 model
  with `bf16=True` and for a bfloat16 model with `fp16=True`. With both flags False it picks an
  autocast itself (bf16 where the card has it natively, else fp16), except for a model the caller
  loaded in float32 on a card without native bf16, which it keeps in float32.

tests/test_unsloth_trainer.py runs these functions' answers through the guard's own code, taken
from the generated trainer, for a T4 (sm_75) and an RTX 5080 (sm_120).
"""

from __future__ import annotations

from typing import Any

import torch

#: Compute capability from which Unsloth loads (and trains) in bfloat16 rather than float16.
UNSLOTH_BF16_MIN_MAJOR = 8


def load_dtype(capability: tuple[int, int]) -> torch.dtype:
    """The dtype Unsloth loads a model in on a CUDA card of this compute capability (dtype=None).

    float16 below compute capability 8 (T4: (7, 5), V100: (7, 0)), bfloat16 from 8 on (A100:
    (8, 0), RTX 4090: (8, 9), RTX 5080: (12, 0)): Unsloth's `SUPPORTS_BFLOAT16` rule.
    """
    major = int(capability[0])
    return torch.bfloat16 if major >= UNSLOTH_BF16_MIN_MAJOR else torch.float16


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a dtype or its name ("bfloat16", "torch.float16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {dtype!r}")
    return value


def model_dtype(model: Any) -> torch.dtype:
    """The model's dtype, read the way Unsloth's trainer guard reads it.

    `model.config.dtype`, else `model.config.torch_dtype`, else the input embeddings' weight dtype.
    For a 4-bit model this is the compute dtype Unsloth loaded it in, not uint8.
    """
    config = getattr(model, "config", None)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if dtype is None:
        dtype = model.get_input_embeddings().weight.dtype
    return as_dtype(dtype)


def trainer_precision(model_dtype: torch.dtype | str, on_gpu: bool) -> dict[str, bool]:
    """`bf16` / `fp16` for the GRPOConfig: the mixed precision that matches the loaded model.

    On a GPU: bfloat16 model -> bf16, float16 model (what Unsloth loads on a T4) -> fp16, float32
    model -> neither (TRL then trains in float32; Unsloth's trainer picks an autocast itself, as
    the module docstring says). On the CPU: neither, always (the CPU profile trains in float32).
    """
    dtype = as_dtype(model_dtype)
    if not on_gpu:
        return {"bf16": False, "fp16": False}
    return {"bf16": dtype == torch.bfloat16, "fp16": dtype == torch.float16}
