"""The trainer's lines: the base weights, what it trains (LoRA or all parameters), activations,
logits and the reference policy. The same on one card and on each trainer card of a multi-card
layout (`shard` > 1 splits weights, grads and states over FSDP cards)."""

from __future__ import annotations

from .arithmetic import (
    FUSED_BYTES_PER_LOGIT,
    UNSLOTH_BYTES_PER_LOGIT,
    adam_state_bytes,
    base_weight_parts,
    fused_linear_rows,
    kv_per_token_term,
    lora_params,
    lora_tensor_sizes,
    saved_elems_per_token,
)
from .formula import Term, given, nbytes, num, total
from .plan import Resolved
from .sheet import Line
from .units import ALL, GEN_TRAIN, GENERATE, GIB, MIB, TRAIN, gib

# Driver context, kernel images (lazy loading) and cuBLAS workspaces of one CUDA process: the part
# of the card no allocator reports (torch.cuda.max_memory_allocated misses it; NVML sees it).
CUDA_CONTEXT_BYTES = 512 * MIB
# RSS of a Python process after importing torch, transformers, unsloth and TRL, measured on two
# 2-core CPU boxes (1.08 and 1.13 GiB) and rounded up: the CPU profile's equivalent of the CUDA context.
HOST_RUNTIME_BYTES = int(1.25 * GIB)
# What the CPU process grows by once the loop runs: oneDNN JIT-compiles and caches one kernel per new
# tensor shape (up to 1024), and every completion length is a new shape. The CPU lab's resident set
# grew 0.18 GiB from the first step's peak over 60 steps as completion lengths varied, 0.08 GiB with
# ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 (measured 2026-11-29, two runs each); rounded up.
HOST_SHAPE_CACHE_BYTES = int(0.25 * GIB)


def overhead_lines(r: Resolved) -> list[Line]:
    """What the process holds before any model: the CUDA context (or the Python runtime on a CPU),
    and what other processes hold on the card."""
    if r.card.cuda:
        lines = [
            Line(
                name="cuda_context",
                term=given(
                    CUDA_CONTEXT_BYTES,
                    f"{gib(CUDA_CONTEXT_BYTES):.2f} GiB per process (driver context, kernel images, cuBLAS workspaces)",
                ),
                estimate=True,
                note="measured: NVML process memory after CUDA init, less torch's reservation",
            )
        ]
    else:
        lines = [
            Line(
                name="host_runtime",
                term=given(
                    HOST_RUNTIME_BYTES,
                    f"{gib(HOST_RUNTIME_BYTES):.2f} GiB: Python + torch + transformers + unsloth + TRL imported "
                    "(measured RSS 1.08-1.13 GiB)",
                ),
                estimate=True,
            ),
            Line(
                name="host_shape_caches",
                term=given(
                    HOST_SHAPE_CACHE_BYTES,
                    f"{gib(HOST_SHAPE_CACHE_BYTES):.2f} GiB: oneDNN's kernel cache (one JIT kernel per new "
                    "tensor shape) + malloc's free lists",
                ),
                estimate=True,
                note="grows as completion lengths vary; measured as the resident set's growth over the steps",
                phases=GEN_TRAIN,
            ),
        ]
    if r.other_bytes:
        lines.append(
            Line(
                name="other_processes",
                term=given(r.other_bytes, f"other_processes_gib {r.plan.other_processes_gib:g} GiB"),
                estimate=False,
                note="memory other processes held on the card at start",
            )
        )
    return lines


def weights_term(r: Resolved) -> Term:
    """The trainer's copy of the base model (LoRA: frozen NF4 or 16-bit; full: fp32 master weights)."""
    s, dt = r.shape, r.dtype_bytes
    if not r.lora:
        return num(s.total_params(), "params") * nbytes(4, "fp32 master weights; bf16 compute under autocast")
    parts = base_weight_parts(s, r.quant, dt)
    linears = s.layers * len(s.linear_shapes())
    skipped = sum(s.is_skipped(layer, m) for layer in range(s.layers) for m in s.linear_shapes())
    terms = []
    if r.quant == "nf4":
        terms.append(
            given(
                parts["linears_nf4"],
                f"{linears - skipped} NF4 linears (n/2 + ceil(n/64) + 4 ceil(n/16384) + 1092 B each)",
            )
        )
        if skipped:
            terms.append(
                given(parts["linears_16bit"], f"{skipped} linears kept in 16 bit x {dt} B per weight")
            )
    else:
        terms.append(num(s.layers * s.linear_params_per_layer(), "linear params") * nbytes(dt))
    terms.append(num(s.vocab, "vocab") * num(s.hidden, "h") * nbytes(dt))
    if s.lm_head_params():
        terms.append(num(s.vocab, "vocab") * num(s.hidden, "h") * nbytes(dt, "lm_head"))
    terms.append(given(parts["norms"], "norms"))
    term = total(terms)
    assert term.value == sum(parts.values())
    return term.plus_note("(lm_head tied)" if s.tied else "")


def _sharded(term: Term, shard: int) -> Term:
    return term.ceil_div(num(shard, "FSDP cards")) if shard > 1 else term


def trainer_lines(r: Resolved, shard: int = 1, weights_note: str = "") -> list[Line]:
    """Lines of one trainer card: weights, trained parameters, their grads and optimizer states,
    activations, logits and the reference policy."""
    p, s = r.plan, r.shape
    lines = [
        Line(name="base_weights", term=_sharded(weights_term(r), shard), estimate=False, note=weights_note)
    ]
    if r.lora:
        n = lora_params(s, r.lora_rank, p.target_modules)
        params = (
            num(s.layers, "layers") * num(r.lora_rank, "r") * num(n // s.layers // r.lora_rank, "sum(in+out)")
        )
        assert params.value == n
        tb, dtype, note = _trainable_dtype(r)
        lines.append(
            Line(
                name="lora_params",
                term=_sharded(params * nbytes(tb, dtype), shard),
                estimate=False,
                note=note,
                phases=GEN_TRAIN,
            )
        )
        lines.append(
            Line(
                name="lora_grads",
                term=_sharded(num(n, "params") * nbytes(tb, dtype), shard),
                estimate=False,
                note="like the params; freed by zero_grad",
                phases=TRAIN,
            )
        )
        if r.optimizer == "adamw_8bit":
            state = given(
                adam_state_bytes(lora_tensor_sizes(s, r.lora_rank, p.target_modules), "adamw_8bit", tb),
                "bitsandbytes AdamW8bit: per matrix 2 x 1 B + 2 x 4 B per 256 (fp32 if < 4096 elements) + 2 KiB maps",
            )
        else:
            state = num(n, "params") * num(2, "states") * nbytes(tb, f"{dtype} exp_avg, exp_avg_sq")
        lines.append(
            Line(
                name="optimizer_states",
                term=_sharded(state, shard),
                estimate=False,
                note="allocated at the first step, kept after",
                phases=GEN_TRAIN,
            )
        )
    else:
        n = s.total_params()
        lines.append(
            Line(
                name="full_grads",
                term=_sharded(num(n, "params") * nbytes(4, "fp32"), shard),
                estimate=False,
                phases=TRAIN,
            )
        )
        if r.optimizer == "adamw_torch":
            state = num(n, "params") * num(2, "states") * nbytes(4, "fp32")
        else:
            state = num(n, "params") * nbytes(2) + nbytes(8) * num(n).ceil_div(num(256))
        lines.append(
            Line(
                name="optimizer_states",
                term=_sharded(state, shard),
                estimate=False,
                note="mixed-precision AdamW: 4 + 4 + 8 = 16 B per parameter",
                phases=GEN_TRAIN,
            )
        )
    lines += [activation_line(r), logits_line(r)]
    ref = reference_line(r, shard)
    if ref is not None:
        lines.append(ref)
    return lines


def activation_line(r: Resolved) -> Line:
    """Activations of one micro-batch (batch x T tokens) through forward and backward. Estimate."""
    p, s, dt = r.plan, r.shape, r.dtype_bytes
    tokens = num(p.per_device_train_batch_size, "batch") * num(r.seq_len, "T")
    per_token = saved_elems_per_token(s, r.lora_rank, p.target_modules) * dt
    saved = num(per_token).named(
        f"one layer's saved tensors (4h+3q+4kv+4ffn+{len(p.target_modules)}r) x {dt} B"
    )
    hidden = num(s.hidden, "h") * nbytes(dt)
    if r.checkpointing == "none":
        term = num(s.layers + 1, "(layers + 1 for backward)") * tokens * saved
    elif r.checkpointing == "standard":
        term = tokens * (num(s.layers, "layers") * hidden + num(2) * saved)
    else:  # unsloth: the checkpoints go to CPU RAM; the card holds the layer being recomputed
        term = tokens * (num(2) * hidden + num(2) * saved)
        if not r.card.cuda:  # offloaded to the same RAM
            term = term + num(s.layers, "layers") * tokens * hidden
    note = ""
    if not r.card.cuda:
        # CPU attention runs the math SDPA path: it materialises batch x heads x T x T scores.
        held = s.layers + 1 if r.checkpointing == "none" else 2
        scores = (
            num(p.per_device_train_batch_size, "batch") * num(s.heads, "heads") * num(r.seq_len**2, "T^2")
        )
        term = term + num(held, "layers holding") * scores * nbytes(dt, "CPU math attention scores")
        note = "GPU attention (flash / memory-efficient) keeps no T^2 scores"
    return Line(name="train_activations", term=term.int(), estimate=True, note=note, phases=TRAIN)


def logits_line(r: Resolved) -> Line:
    """Logits of the completion tokens: the log-prob of each sampled token needs a vocab-wide row."""
    p, s = r.plan, r.shape
    rows_all = p.per_device_train_batch_size * p.max_completion_length
    if p.chunked_logits:
        rows = num(fused_linear_rows(rows_all, s.hidden, s.vocab)).named(
            f"chunk rows: the power of 2 at or below {rows_all:,} rows x h / vocab, at least 512, at most 4096"
        )
        term = rows * num(s.vocab, "vocab") * nbytes(FUSED_BYTES_PER_LOGIT, "fp32 logits")
        note = (
            "Unsloth's fused linear log-probs (unsloth_zoo fused_linear_rows); on CUDA cards of 24.5 GiB or "
            "less its tiled Triton pass holds less: an upper bound there"
        )
    else:
        rows = num(p.per_device_train_batch_size, "batch") * num(p.max_completion_length, "completion")
        term = (
            rows
            * num(s.vocab, "vocab")
            * nbytes(UNSLOTH_BYTES_PER_LOGIT, "bf16 logits + fp32 copy + bf16 grad")
        )
        note = "whole-batch logits"
    return Line(name="logits", term=term, estimate=True, note=note, phases=TRAIN)


def _trainable_dtype(r: Resolved) -> tuple[int, str, str]:
    """Bytes, dtype name and note of the trainable LoRA parameters (their grads and torch AdamW
    states follow: torch allocates them like the parameters)."""
    tb = r.trainable_bytes
    dtype = "fp32" if tb == 4 else "bf16"
    if r.plan.trainable_dtype_bytes is not None:
        return tb, dtype, "trainable_dtype_bytes"
    if tb == 4:
        return tb, dtype, "PEFT keeps adapters in fp32"
    return (
        tb,
        dtype,
        "measured on CPU: TRL's own GRPO trainer casts the 'default' adapter to bf16 (grads and AdamW states follow)",
    )


def reference_line(r: Resolved, shard: int = 1) -> Line | None:
    """The reference policy KL is measured against (beta > 0 only).

    LoRA under Unsloth's trainer: the base with the adapter disabled, nothing held. LoRA under TRL's:
    a frozen "ref" adapter copied from "default" (PEFT's add_adapter keeps it in fp32). Full training:
    a second copy of the model.
    """
    p, s = r.plan, r.shape
    if p.beta <= 0 or (r.lora and p.grpo_trainer == "unsloth"):
        return None
    if r.lora:
        n = lora_params(s, r.lora_rank, p.target_modules)
        return Line(
            name="reference_policy",
            term=_sharded(num(n, "params") * nbytes(4, "fp32 'ref' adapter"), shard),
            estimate=False,
            note="TRL adds a frozen copy of the adapter when the model is already a PEFT model and beta != 0",
            phases=GEN_TRAIN,
        )
    logps = (
        num(r.local_gen_batch, "completions")
        * num(p.max_completion_length, "tokens")
        * nbytes(4, "ref log-probs")
    )
    return Line(
        name="reference_policy",
        term=_sharded(num(s.total_params(), "params") * nbytes(2, "bf16 model copy"), shard) + logps,
        estimate=False,
        phases=ALL,
    )


def generate_kv_line(r: Resolved) -> Line:
    """No vLLM: transformers' generate keeps a DynamicCache for the whole local generation batch."""
    term = (
        num(r.local_gen_batch, "sequences")
        * num(r.seq_len, "T")
        * kv_per_token_term(r.shape, r.dtype_bytes).named("KV bytes per token")
    )
    return Line(
        name="generate_kv_cache",
        term=term,
        estimate=False,
        note="HF generate's DynamicCache",
        phases=GENERATE,
    )
