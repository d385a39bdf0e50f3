"""How vLLM 0.31 and Unsloth size the rollout engine, written out so the sheet can follow them.

vLLM (vllm/v1/worker/utils.py `request_memory`, gpu_worker.py `determine_available_memory`):
    requested = ceil(total x gpu_memory_utilization); it refuses to start when free < requested.
    KV cache = requested - (weights + non-torch memory + activation peak of the profiling pass)
               - CUDA graph estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the default since
               0.21: graphs now come out of the share, not on top of it).
Unsloth (unsloth_zoo/vllm_utils.py `load_vllm`, `approximate_vllm_memory_usage`):
    standby replaces the requested util by a tier of the card's size x 0.95, and the engine's
    max_num_seqs / max_num_batched_tokens come from a tier table on its own KV estimate.
"""

from __future__ import annotations

import math

from .arithmetic import linear_params
from .shapes import ModelShape
from .units import GIB


def vllm_requested_bytes(total: int, util: float) -> int:
    """What vLLM claims for itself: ceil(total x util)."""
    return math.ceil(total * util)


def unsloth_standby_util(total: int) -> float:
    """The util Unsloth imposes under UNSLOTH_VLLM_STANDBY=1 (vLLM >= 0.11 branch of load_vllm):
    a tier on a tenth of the card in GiB, times 0.95."""
    ten_percent = total / GIB * 0.1
    if ten_percent >= 4.0:
        tier = 0.925
    elif ten_percent >= 2.5:
        tier = 0.9
    elif ten_percent >= 2.0:
        tier = 0.825
    elif ten_percent >= 1.4:
        tier = 0.8
    elif ten_percent >= 1.0:
        tier = 0.775
    else:
        tier = 0.75
    return tier * 0.95


def unsloth_cuda_graph_bytes(shape: ModelShape) -> int:
    """Unsloth's CUDA graph allowance: 172 graphs x hidden x layers x 4 B, between 0.15 and 1 GiB."""
    est = 172 * shape.hidden * shape.layers * 4
    return min(max(est, int(0.15 * GIB)), int(1.0 * GIB))


def unsloth_weight_bytes(shape: ModelShape, nf4: bool) -> int:
    """unsloth_zoo's vllm_weights_memory_usage for a dense model: quantized linears at 2 / (16/5)
    bytes per weight (5 bits, its rounding of NF4), everything else at 2 bytes."""
    quantized = linear_params(shape)
    rest = shape.total_params() - quantized
    return int(quantized * (2 / (16 / 5) if nf4 else 2) + rest * 2)


def unsloth_approximate(
    shape: ModelShape,
    *,
    free: int,
    total: int,
    util: float,
    max_seq_length: int,
    nf4: bool,
    max_lora_rank: int,
    enable_lora: bool = True,
    training: bool = True,
) -> tuple[int, int, float, float]:
    """unsloth_zoo.vllm_utils.approximate_vllm_memory_usage for a dense full-attention model, with
    the weight bytes load_vllm passes it. Returns (kv tokens, max seqs, actual util, KV GiB) as it does.
    The test checks this port against the installed function."""
    hd, n_kv, layers = shape.hidden, shape.kv_heads, shape.layers
    mlp = shape.ffn
    free_memory = util * free
    q_size, kv_size = shape.q_dim, shape.kv_dim
    # LoRA slots vLLM keeps: 2 bytes per element, "elements" as Unsloth counts them.
    r = max_lora_rank
    lora = (
        r * (hd * 3 + q_size)
        + r * (q_size + 2 * kv_size + hd)
        + hd * r * 2
        + mlp * r
        + r * (2 * mlp)
        + r * hd
    )
    lora = lora * layers * 2 if enable_lora else 0
    act = unsloth_activation_allowance(shape, max_seq_length) if training else 0
    if total - free_memory < act:
        free_memory = total - act
    actual_util = free_memory / total
    left = free_memory - (unsloth_weight_bytes(shape, nf4) + lora) - unsloth_cuda_graph_bytes(shape)
    left = max(left, 0)
    kv_per_token = 2 * shape.head_dim * n_kv * layers * 2
    tokens = int(0.95 * left / kv_per_token) if left > 0 else 0
    tokens = tokens // 256 * 256
    return tokens, int(tokens / max_seq_length), actual_util, left / GIB


def unsloth_activation_allowance(shape: ModelShape, max_seq_length: int) -> float:
    """What approximate_vllm_memory_usage leaves outside vLLM's share for the trainer: activations
    of a batch of 2 at max_seq_length, plus one MLP weight, x 1.25 margin x 2 bytes."""
    hd, mlp = shape.hidden, shape.ffn
    kv_hidden = hd // shape.heads * shape.kv_heads
    act = (
        max_seq_length * 2 * (hd + 2 * kv_hidden)
        + max_seq_length * 2 * 2
        + max_seq_length * 2 * (2 * mlp)
        + mlp * hd
    )
    return act * 1.25 * 2


def unsloth_vllm_share(
    shape: ModelShape, *, free: int, total: int, util: float, max_seq_length: int, training: bool = True
) -> tuple[float, int]:
    """The share of the card vLLM claims under Unsloth's fast_inference: (util handed to vLLM, bytes).

    unsloth_zoo.vllm_utils.approximate_vllm_memory_usage scales the util it is given by the free
    memory it measures (`free_memory = gpu_memory_utilization * free_memory`), keeps its activation
    allowance outside, and load_vllm passes `free_memory / total` to vLLM as gpu_memory_utilization;
    vLLM then claims ceil(total x that) (vllm/v1/worker/utils.py request_memory). So the share is
    util x free at start, not util x total.
    """
    free_memory = util * free
    act = unsloth_activation_allowance(shape, max_seq_length) if training else 0
    if total - free_memory < act:
        free_memory = total - act
    handed = free_memory / total
    return handed, vllm_requested_bytes(total, handed)


def unsloth_engine_limits(kv_gib: float, max_seq_length: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) load_vllm passes vLLM, from its KV estimate in GiB."""
    table = (
        (2, 2048, 8),
        (4, 2048, 16),
        (8, 4096, 32),
        (12, 4096, 48),
        (16, 6144, 64),
        (24, 6144, 80),
        (40, 8192, 96),
        (48, 8192, 112),
        (80, 8192, 128),
    )
    tokens, seqs = 8192, 256
    for bound, t, s in table:
        if kv_gib <= bound:
            tokens, seqs = t, s
            break
    tokens = min(tokens, seqs * max_seq_length)  # "reachable tokens"
    return max(tokens, seqs), seqs


# vLLM's profiling pass, fitted to the table Unsloth measured and keeps in load_vllm's source
# (Qwen3-4B, bf16): torch peak 0.18 / 0.32 / 0.62 / 1.20 / 2.38 GiB at 2k / 4k / 8k / 16k / 32k
# batched tokens = tokens x (3 x ffn + 4 x hidden) x 2 B within 0.03 GiB; past ~64 sequences the
# sampler's fp32 copies of the logits take over at ~38 B x vocab per sequence; plus 0.13 GiB of
# non-torch memory in the forward.
VLLM_NON_TORCH = int(0.13 * GIB)
SAMPLER_BYTES_PER_LOGIT = 38


def vllm_profile_bytes(
    shape: ModelShape, batched_tokens: int, max_num_seqs: int, nf4: bool, dtype_bytes: int = 2
) -> tuple[int, str]:
    forward = batched_tokens * (3 * shape.ffn + 4 * shape.hidden) * dtype_bytes
    sampler = max_num_seqs * shape.vocab * SAMPLER_BYTES_PER_LOGIT
    # bitsandbytes dequantizes a whole weight for a prefill matmul: the fused gate_up is the largest.
    dequant = 2 * shape.ffn * shape.hidden * dtype_bytes if nf4 else 0
    total = max(forward, sampler) + dequant + VLLM_NON_TORCH
    formula = (
        f"max(N_tok {batched_tokens} x (3 ffn + 4 h) x 2 B, seqs {max_num_seqs} x vocab x 38 B)"
        + (" + dequantized gate_up 2 ffn h x 2 B" if nf4 else "")
        + " + 0.13 GiB non-torch"
    )
    return total, formula
