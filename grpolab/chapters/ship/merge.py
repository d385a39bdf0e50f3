"""The adapter merged into the base's weights, the two ways a user can: into 16-bit weights (the book's
way) and into the 4-bit ones (the trap).

The adapter learned on the 4-bit base: what it adds to each layer, B @ A x alpha / r (PEFT's
`get_delta_weight`), is a small correction to the weights the trainer saw, the base dequantized. Added
to those weights in 16 bit, the correction survives: a 16-bit float keeps about three decimal digits of
every weight. Requantized to 4 bit, each block of 64 weights goes back to 16 levels scaled by the
block's largest value: a correction smaller than half the gap between two levels rounds back to the
level the weight had, and the merged model answers as the base did (unsloth#2009, "Applying LoRA
doesn't change model output").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MERGED_DTYPE = torch.float16  # what Unsloth's merged_16bit and llama.cpp's converter write by default


def lora_layers(model) -> Iterator[tuple[str, Any]]:
    """(name in the base model, module) of every layer the adapter wraps."""
    base = model.get_base_model()
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
            yield name, module


def dequantized(layer) -> torch.Tensor:
    """A linear layer's weight in float32, as its forward pass computes with it (4-bit: dequantized)."""
    weight = layer.weight
    if getattr(weight, "quant_state", None) is not None:
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, state=weight.quant_state).float()
    return weight.detach().float()


def delta(module, adapter: str = "default") -> torch.Tensor:
    """What the adapter adds to the layer's weight: B @ A x alpha / r, PEFT's own formula."""
    return module.get_delta_weight(adapter).float()


def merged_state(model, adapter: str = "default") -> dict[str, torch.Tensor]:
    """Every weight of the base, 4-bit layers dequantized and the adapter's delta added, in float32,
    under the names a plain transformers model of the base's architecture has."""
    base = model.get_base_model()
    wrapped = dict(lora_layers(model))
    state: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        inside = any(name == f"{w}.base_layer" or name.startswith(f"{w}.lora_") for w in wrapped)
        if inside:
            continue
        prefix = f"{name}." if name else ""
        if name in wrapped:
            layer = module.base_layer
            state[f"{prefix}weight"] = dequantized(layer) + delta(module, adapter)
            if layer.bias is not None:
                state[f"{prefix}bias"] = layer.bias.detach().float()
            continue
        for pname, param in module.named_parameters(recurse=False):
            is_4bit = pname == "weight" and getattr(param, "quant_state", None) is not None
            state[f"{prefix}{pname}"] = dequantized(module) if is_4bit else param.detach().float()
    return state


def plain_model(model, state: dict[str, torch.Tensor], dtype: torch.dtype = MERGED_DTYPE):
    """A transformers model of the base's architecture holding `state`, rounded to `dtype` once: no
    PEFT, no Unsloth, no bitsandbytes in it."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.get_base_model().config)
    for quantized in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, quantized):
            delattr(config, quantized)
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"the merge does not fit {type(plain).__name__}: missing {missing}, unexpected {unexpected}"
        )
    if tied:
        plain.tie_weights()
    return plain.eval()


def save_merged_16bit(model, tokenizer, folder: Path, adapter: str = "default") -> Path:
    """The book's merge on a CPU: the dequantized base plus PEFT's delta, in float16, saved with the
    tokenizer and its chat template as a plain transformers folder (written whole or not at all)."""
    from grpolab.lifecycle.atomic import save_pretrained_atomically

    plain = plain_model(model, merged_state(model, adapter))
    return save_pretrained_atomically(plain, tokenizer, folder)


@dataclass(frozen=True)
class RoundedAway:
    """What requantizing the merge to 4 bit did to the adapter's delta, over every wrapped layer."""

    entries: int  # weights the adapter changes (delta not 0)
    below_half_step: float  # share of them whose |delta| is under half the 4-bit gap where the weight sits
    same_code: float  # share of them whose 4-bit code after the merge is the base's: the change is gone
    median_ratio: float  # median |delta| / half the gap: under 1, most of the adapter cannot be stored

    def line(self) -> str:
        return (
            f"{self.below_half_step:.1%} of the adapter's {self.entries:,} weight changes are under half a "
            f"4-bit step (median change / half step {self.median_ratio:.2f}); requantized, "
            f"{self.same_code:.1%} of those weights keep the base's 4-bit code"
        )


def codes(weight) -> torch.Tensor:
    """The 4-bit code (0..15) of each weight of a bitsandbytes Params4bit, in the weight's order."""
    packed = weight.data.reshape(-1)
    both = torch.stack([(packed >> 4) & 0xF, packed & 0xF], dim=-1).reshape(-1)
    return both[: weight.quant_state.shape.numel()].reshape(weight.quant_state.shape)


def half_steps(weight: torch.Tensor, quant_state) -> torch.Tensor:
    """Half the gap between the two 4-bit levels each weight lies between, in the weight's units: the
    largest change that may round back to where the weight was."""
    levels = quant_state.code.float().sort().values  # the 16 levels in [-1, 1] (NF4 or FP4)
    blocksize = quant_state.blocksize
    absmax = quant_state.absmax
    if getattr(quant_state, "nested", False):  # double quantization: the scales are quantized too
        from bitsandbytes.functional import dequantize_blockwise

        absmax = dequantize_blockwise(quant_state.absmax, quant_state.state2) + quant_state.offset
    flat = weight.reshape(-1)
    scale = absmax.float().repeat_interleave(blocksize)[: flat.numel()]
    normalised = (flat / scale.clamp_min(1e-12)).clamp(-1, 1)
    upper = torch.bucketize(normalised, levels).clamp(1, len(levels) - 1)
    gap = levels[upper] - levels[upper - 1]
    return (gap * scale / 2).reshape(weight.shape)


def merge_4bit_in_place(model, adapter: str = "default"):
    """PEFT's merge into the 4-bit layers (what Unsloth's `merged_4bit_forced` calls), measured: returns
    (the plain 4-bit model, RoundedAway). The adapter is gone from `model` afterwards."""
    import warnings

    before = {}
    for name, module in lora_layers(model):
        weight = module.base_layer.weight
        before[name] = (
            dequantized(module.base_layer),
            delta(module, adapter),
            weight.quant_state,
            codes(weight),
        )
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # PEFT's "may get different generations due to rounding": measured here
        merged = model.merge_and_unload()
    modules = dict(merged.named_modules())
    entries, below, same, ratios = 0, 0, 0, []
    for name, (base, change, state, code) in before.items():
        moved = change != 0
        half = half_steps(base, state)
        entries += int(moved.sum())
        below += int(((change.abs() < half) & moved).sum())
        same += int(((codes(modules[name].weight) == code) & moved).sum())
        ratios.append((change.abs() / half.clamp_min(1e-12))[moved])
    ratio = torch.cat(ratios).median().item() if ratios else float("nan")
    return merged, RoundedAway(entries, below / max(entries, 1), same / max(entries, 1), ratio)
