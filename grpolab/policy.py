"""Loading the policy: a 4-bit base model through Unsloth plus a LoRA adapter to train.

On a CUDA GPU this is the real thing: the base weights are loaded once, in 4-bit, and
shared between the trainer and the vLLM engine Unsloth starts in the same process
(`fast_inference=True`). On a CPU Unsloth still loads real bitsandbytes 4-bit layers and
trains LoRA through them, but generation runs through transformers' `generate`.

Import order matters: Unsloth patches transformers and TRL when it is imported, so
callers import this module (or `unsloth`) before either.
"""

from __future__ import annotations

from pathlib import Path

from unsloth import FastLanguageModel

from grpolab.settings import LabSettings
from grpolab.tiny_model import ensure_tiny_model


def resolve_model_path(s: LabSettings) -> str:
    """The tiny CPU model is built and cached on first use; anything else is a path or a Hub id."""
    if s.model == "tiny-qwen3":
        return str(ensure_tiny_model())
    return str(Path(s.model).expanduser()) if Path(s.model).expanduser().exists() else s.model


def load_policy(s: LabSettings):
    """Return (model, tokenizer): the 4-bit base with trainable LoRA adapters attached."""

    import torch

    dtype = None if s.dtype == "auto" else getattr(torch, s.dtype)
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=resolve_model_path(s),
        max_seq_length=s.max_seq_length,
        load_in_4bit=s.load_in_4bit,
        dtype=dtype,
        # vLLM in the same process, sharing the 4-bit weights with the trainer (GPU only).
        fast_inference=s.fast_inference,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_lora_rank=s.max_lora_rank,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=s.lora_rank,
        lora_alpha=s.lora_alpha,
        target_modules=list(s.target_modules),
        # "unsloth": checkpoint each layer and offload the saved activations to CPU memory.
        use_gradient_checkpointing=s.gradient_checkpointing,
        random_state=s.seed,
    )
    return model, tokenizer


def vllm_engine(model):
    """The in-process vLLM engine Unsloth attached to the model, or None (CPU profile)."""
    return getattr(model, "vllm_engine", None)


def vllm_kv_cache_bytes(model) -> dict[str, int]:
    """What vLLM actually reserved for its KV cache, read from the engine (GPU only)."""
    engine = vllm_engine(model)
    if engine is None:
        return {}
    llm_engine = getattr(engine, "llm_engine", engine)
    cache = llm_engine.vllm_config.cache_config
    model_config = llm_engine.vllm_config.model_config
    hf = model_config.hf_text_config
    kv_heads = model_config.get_num_kv_heads(llm_engine.vllm_config.parallel_config)
    layers = hf.num_hidden_layers
    head_dim = getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    element = 1 if str(cache.cache_dtype).startswith("fp8") else 2
    per_token = 2 * layers * kv_heads * head_dim * element
    blocks = int(cache.num_gpu_blocks or 0)
    return {
        "kv_cache_blocks": blocks,
        "kv_cache_block_size": int(cache.block_size),
        "kv_cache_tokens": blocks * int(cache.block_size),
        "kv_cache_bytes": blocks * int(cache.block_size) * per_token,
    }
