"""Measuring the budget's exact lines on the live objects: the model's tensors by kind, the
gradients, the optimizer's states, and the KV cache vLLM really allocated."""

from __future__ import annotations


def tensor_bytes(t) -> int:
    return int(t.numel() * t.element_size())


def quant_state_bytes(param) -> int:
    """The bytes of a bitsandbytes 4-bit weight's quantization constants (absmax, code, nested)."""
    qs = getattr(param, "quant_state", None)
    if qs is None:
        return 0
    parts = [getattr(qs, name, None) for name in ("absmax", "code", "offset")]
    nested = getattr(qs, "state2", None)
    if nested is not None:
        parts += [getattr(nested, name, None) for name in ("absmax", "code")]
    return sum(tensor_bytes(t) for t in parts if t is not None and hasattr(t, "element_size"))


def model_bytes_by_kind(model) -> dict[str, int]:
    """Bytes of the base weights (packed 4-bit + constants + 16-bit leftovers), of the LoRA
    parameters, and of TRL's frozen "ref" adapter copy when there is one. Tied embeddings are one
    tensor and counted once."""
    seen: set[int] = set()
    kinds = {"base_weights": 0, "lora_params": 0, "reference_policy": 0}
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        size = tensor_bytes(p) + quant_state_bytes(p)
        if "lora_" in name and ".ref." in name:
            kinds["reference_policy"] += size  # TRL's frozen copy of the adapter (beta > 0)
        elif "lora_" in name:
            kinds["lora_params"] += size
        else:
            kinds["base_weights"] += size
    for _, b in model.named_buffers():
        if b is not None and id(b) not in seen:
            seen.add(id(b))
            kinds["base_weights"] += tensor_bytes(b)
    return {k: v for k, v in kinds.items() if v or k != "reference_policy"}


def grad_bytes(model) -> int:
    return sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer) -> int:
    """Every tensor the optimizer keeps per parameter (Adam's two moments, 8-bit quantization maps...)."""
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
    total = 0
    seen: set[int] = set()  # bitsandbytes' 8-bit Adam shares its quantization maps across parameters
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += tensor_bytes(value)
    return total


def vllm_engine(model):
    """The in-process vLLM engine Unsloth attached to the model, or None (no fast_inference)."""
    engine = getattr(model, "vllm_engine", None)
    if engine is None and hasattr(model, "base_model"):
        engine = getattr(getattr(model.base_model, "model", None), "vllm_engine", None)
    return engine


def vllm_kv_cache(model) -> dict[str, int]:
    """What vLLM really reserved for its KV cache, read from the engine's config (GPU only)."""
    engine = vllm_engine(model)
    if engine is None:
        return {}
    llm_engine = getattr(engine, "llm_engine", engine)
    config = llm_engine.vllm_config
    cache, model_config = config.cache_config, config.model_config
    hf = model_config.hf_text_config
    kv_heads = model_config.get_num_kv_heads(config.parallel_config)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    element = 1 if str(cache.cache_dtype).startswith("fp8") else 2
    per_token = 2 * hf.num_hidden_layers * kv_heads * head_dim * element
    blocks = int(cache.num_gpu_blocks or 0)
    tokens = blocks * int(cache.block_size)
    return {
        "kv_cache_blocks": blocks,
        "kv_cache_block_size": int(cache.block_size),
        "kv_cache_tokens": tokens,
        "kv_cache_bytes": tokens * per_token,
        "gpu_memory_utilization": float(cache.gpu_memory_utilization),
    }
