"""The byte counts the sheet is made of, one function per quantity.

Exact ones repeat what the library allocates (bitsandbytes' NF4 layout, PEFT's LoRA matrices,
bitsandbytes' 8-bit Adam state, vLLM's KV page); the tests check them against the real libraries.
Estimates say where their constants come from.
"""

from __future__ import annotations

import math

from .formula import Term, nbytes, num
from .shapes import ModelShape
from .units import ceil_div

# --- Base weights: bitsandbytes NF4 ------------------------------------------------------------

NF4_BLOCK = 64  # bitsandbytes' 4-bit blocksize: one absmax per 64 weights
NESTED_BLOCK = 256  # double quantization: the absmaxes are themselves 8-bit, one fp32 scale per 256
NF4_CODE_BYTES = 16 * 4  # the 16-entry NF4 code book (fp32), one per quantized weight
NESTED_CODE_BYTES = 256 * 4  # the 8-bit dynamic map of the nested absmax (fp32), one per weight
NESTED_OFFSET_BYTES = 4  # mean subtracted from the absmaxes before quantizing them (fp32)


def nf4_bytes(numel: int) -> int:
    """Bytes bitsandbytes holds for one weight quantized to NF4 with double quantization.

    packed 4-bit values ceil(n/2) + absmax ceil(n/64) x 1 B (8-bit after double quant)
    + nested absmax ceil(ceil(n/64)/256) x 4 B + offset 4 B + code books 64 B + 1024 B.
    """
    blocks = ceil_div(numel, NF4_BLOCK)
    return (
        ceil_div(numel, 2)
        + blocks
        + ceil_div(blocks, NESTED_BLOCK) * 4
        + NESTED_OFFSET_BYTES
        + NF4_CODE_BYTES
        + NESTED_CODE_BYTES
    )


def base_weight_parts(shape: ModelShape, quant: str, dtype_bytes: int = 2) -> dict[str, int]:
    """Bytes of the base model by part. With nf4, bitsandbytes quantizes the decoder's linear layers
    only: embeddings, norms, the lm_head and any skip_modules stay in 16 bit."""
    quantized = sixteen = 0
    for layer in range(shape.layers):
        for module, (n_in, n_out) in shape.linear_shapes().items():
            if quant == "nf4" and not shape.is_skipped(layer, module):
                quantized += nf4_bytes(n_in * n_out)
            else:
                sixteen += n_in * n_out * dtype_bytes
    norms = (shape.layers * shape.norm_params_per_layer() + shape.hidden) * dtype_bytes
    return {
        "linears_nf4": quantized,
        "linears_16bit": sixteen,
        "embeddings": shape.embedding_params() * dtype_bytes,
        "lm_head": shape.lm_head_params() * dtype_bytes,  # 0 when tied to the embeddings
        "norms": norms,
    }


def linear_params(shape: ModelShape) -> int:
    return shape.layers * shape.linear_params_per_layer()


# --- LoRA and the optimizer ----------------------------------------------------------------------


def lora_tensor_sizes(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> list[int]:
    """Element counts of every LoRA matrix PEFT creates: A is r x in, B is out x r, per target per layer."""
    sizes = []
    for _ in range(shape.layers):
        for module, (n_in, n_out) in shape.linear_shapes().items():
            if module in targets:
                sizes += [rank * n_in, n_out * rank]
    return sizes


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable parameters = layers x sum over targets of r x (in + out)."""
    return sum(lora_tensor_sizes(shape, rank, targets))


BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit state for tensors smaller than this
BNB_STATE_BLOCK = 256  # blockwise 8-bit state: one fp32 absmax per 256 values and state
BNB_QMAP_BYTES = 2 * 256 * 4  # the signed and unsigned dynamic maps, shared by all parameters


def adam_state_bytes(sizes: list[int], optimizer: str, param_bytes: int = 4) -> int:
    """AdamW keeps exp_avg and exp_avg_sq per parameter.

    adamw_torch: 2 x param_bytes per parameter (torch allocates the states like the parameter: fp32
    states for fp32 parameters, bf16 for bf16 ones; the 0-dim fp32 `step` tensors are not counted).
    adamw_8bit (bitsandbytes): 2 x 1 B + 2 x 4 B per 256-block, fp32 for tensors < 4096 elements
    whatever the parameter's dtype, plus the two 256-entry quantization maps.
    """
    if optimizer == "adamw_torch":
        return 2 * param_bytes * sum(sizes)
    total, any8 = 0, False
    for n in sizes:
        if n < BNB_MIN_8BIT_SIZE:
            total += 8 * n
        else:
            total += 2 * n + 2 * 4 * ceil_div(n, BNB_STATE_BLOCK)
            any8 = True
    return total + (BNB_QMAP_BYTES if any8 else 0)


# --- KV cache --------------------------------------------------------------------------------------


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int = 2, tp: int = 1) -> int:
    """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes. Under tensor parallel each
    card holds kv_heads / tp heads (at least one: vLLM replicates a head when tp > kv_heads)."""
    heads = max(1, shape.kv_heads // tp)
    return 2 * shape.layers * heads * shape.head_dim * dtype_bytes


VLLM_BLOCK = 16  # vLLM's default block_size (tokens per KV page)


# --- Training activations (estimates) ----------------------------------------------------------


def saved_elems_per_token(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Values one decoder layer saves for backward per token, in compute-dtype elements.

    attention: input + normed input (2h), q and k before and after q/k-norm and RoPE (2q + 2kv),
    v (kv), attention output (q); MLP: residual + normed (2h), gate, up, silu(gate), product (4 ffn);
    LoRA: the r-wide output of each target's A matrix, which B needs for its gradient.
    """
    h, q, kv, f = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn
    return 4 * h + 3 * q + 4 * kv + 4 * f + rank * len(targets)


# --- Logits: Unsloth's fused linear log-probs ---------------------------------------------------
# Unsloth's GRPO trainer computes each completion token's log-prob from the hidden states through
# unsloth_zoo.fused_losses.fused_linear (the default since UNSLOTH_FUSED_LINEAR is unset): chunks of
# rows of hidden states times lm_head, fp32 logits, never the whole batch's. Its chunk rule, ported
# from fused_linear_rows with its defaults (the test runs the installed function):
FUSED_MIN_LOGITS = 512 * 151936  # a chunk holds at least this many logits (512 rows of Qwen's vocab)
FUSED_MAX_ROWS = 4096
FUSED_BYTES_PER_LOGIT = 4  # UNSLOTH_LOGPROB_FP32_LOGITS=1 (the default): fp32 logits
FUSED_CHUNK_BYTES = 2 << 30  # UNSLOTH_LOGPROB_CHUNK_GB=2, or half the free memory when less


def _pow2(x: float) -> int:
    return 1 << max(math.ceil(math.log2(max(x, 1))), 0)


def fused_linear_rows(
    n_rows: int, hidden: int, vocab: int, bytes_per_logit: int = FUSED_BYTES_PER_LOGIT
) -> int:
    """Rows per chunk: the power of two at or below n_rows x hidden / vocab (as Liger's kernel),
    at least the rows of FUSED_MIN_LOGITS (at least 512), at most 4096 and what 2 GiB of logits hold."""
    ideal = n_rows * hidden / max(vocab, 1)
    rows = _pow2(ideal)
    if rows > ideal:
        rows //= 2
    floor = _pow2(FUSED_MIN_LOGITS / max(vocab, 1))
    if floor > FUSED_MIN_LOGITS / max(vocab, 1):
        floor //= 2
    floor = min(max(floor, 512), FUSED_MAX_ROWS)
    rows = min(max(rows, floor), FUSED_MAX_ROWS)
    rows = min(rows, max(FUSED_CHUNK_BYTES // max(vocab * bytes_per_logit, 1), 2))
    return max(min(rows, max(n_rows, 1)), 1)


# Whole-batch logits (chunked_logits false): bf16 logits + their fp32 copy + bf16 grad per logit.
UNSLOTH_BYTES_PER_LOGIT = 8


# --- The same quantities as formulas, for the lines of the sheet ----------------------------------


def kv_per_token_term(shape: ModelShape, dtype_bytes: int = 2, tp: int = 1) -> Term:
    """kv_bytes_per_token, printed: 2 (K and V) x layers x kv_heads (per card) x head_dim x bytes."""
    heads = num(max(1, shape.kv_heads // tp), "kv_heads per card" if tp > 1 else "kv_heads")
    term = (
        num(2) * num(shape.layers, "layers") * heads * num(shape.head_dim, "head_dim") * nbytes(dtype_bytes)
    )
    assert term.value == kv_bytes_per_token(shape, dtype_bytes, tp)
    return term
