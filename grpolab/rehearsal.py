"""A rehearsal checkpoint: the model's exact shape with random weights, saved in 4-bit, built offline.

`train.py --rehearse` runs the lab on it before anything is downloaded: the same loader (Unsloth,
reading a pre-quantized bitsandbytes checkpoint, vLLM in the same process on a GPU), the same
trainer, the same budget lines measured and compared. The weights are random, so the rewards mean
nothing; the memory is the real model's: every tensor has its shape and dtype, and random weights
never emit the end-of-turn token, so every completion runs to max_completion_length (the worst case).

The shape comes from the checkpoint's own config.json when it is in the local Hugging Face cache
(its quantization_config included), else from the shipped config in budgets/models/. The tokenizer
is the CPU stand-in's character-level one, padded with filler tokens to the model's vocabulary so
every id the random model samples decodes: a character per token makes prompts longer than a BPE
tokenizer would, which errs on the side of memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from budgets.shapes import catalog, hub_cache_config, load_shape
from grpolab.atomic import save_pretrained_atomically
from grpolab.settings import LabSettings
from grpolab.tiny_model import CACHE_ROOT, build_tokenizer

REHEARSAL_SEED = 0
REHEARSAL_STEPS = 3  # enough for every phase to reach its peak: load, generate, train, optimizer step


def source_config(model: str) -> tuple[dict, str]:
    """The config.json to rebuild `model` from: the cached checkpoint's, else the shipped shape's."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text()), str(path / "config.json")
    cached = hub_cache_config(model)
    if cached is not None:
        return json.loads(cached.read_text()), str(cached)
    shape = load_shape(model)  # BudgetError names the known models when there is no match
    shipped = catalog()[Path(shape.source).stem.lower()]
    config = {k: v for k, v in json.loads(shipped.read_text()).items() if not k.startswith("_")}
    return config, str(shipped)


def rehearsal_tokenizer(vocab_size: int):
    """The character-level tokenizer, padded to `vocab_size` with filler tokens."""
    tokenizer = build_tokenizer()
    fillers = vocab_size - len(tokenizer)
    if fillers > 0:
        tokenizer.add_tokens([f"<|r{i}|>" for i in range(fillers)], special_tokens=True)
    return tokenizer


def build(model: str, root: Path = CACHE_ROOT / "rehearsal") -> tuple[Path, str]:
    """The rehearsal checkpoint of `model` (built once, under a lock, atomically): its folder, and the
    config.json its shape was read from."""
    config, source = source_config(model)
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    final = root / f"{load_shape(model).name.replace('/', '--')}-{key}"
    if (final / "config.json").is_file():
        return final, source
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "config.json").is_file():
            save_pretrained_atomically(_random_4bit(config), rehearsal_tokenizer(config["vocab_size"]), final)
    return final, source


def _random_4bit(config: dict):
    """Random weights of the config's shape, quantized to NF4 by bitsandbytes as they load."""
    import tempfile

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    config = {k: v for k, v in config.items() if k != "quantization_config"}
    hf_config = AutoConfig.for_model(**config)
    torch.manual_seed(REHEARSAL_SEED)
    with tempfile.TemporaryDirectory() as staging:
        AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).save_pretrained(staging)
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return AutoModelForCausalLM.from_pretrained(
            staging, quantization_config=quant, dtype=torch.bfloat16, device_map=device
        )


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # absent, or built for another torch / CUDA
        return False
    return True


def rehearsal_settings(s: LabSettings) -> tuple[LabSettings, list[str]]:
    """The lab's settings for a rehearsal: a few steps (unless --max-steps says otherwise), no
    held-out evaluation (random weights answer nothing), and transformers' generate where vLLM
    cannot be imported. Returns the settings and what the rehearsal cannot measure."""
    changes: dict = {}
    if "max_steps" not in s.overridden:
        changes["max_steps"] = REHEARSAL_STEPS
    if "eval_prompts" not in s.overridden:
        changes["eval_prompts"] = 0
    cannot: list[str] = []
    if s.fast_inference and not vllm_importable():
        changes["fast_inference"] = False
        cannot.append(
            "vLLM cannot be imported here: generation runs through transformers, so the lines of vLLM's share "
            "(kv_cache, vllm_lora_slots, vllm_profile_activations, cuda_graphs) are not measured"
        )
    return s.replace(**changes), cannot
