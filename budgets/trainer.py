"""The trainer's lines: base weights, what it trains (LoRA or all parameters), activations, logits,
the reference policy. The same on one card and on each trainer card of a multi-card layout."""

from __future__ import annotations

from .arithmetic import (
    UNSLOTH_BYTES_PER_LOGIT,
    adam_state_bytes,
    base_weight_parts,
    ceil_div,
    lora_params,
    lora_tensor_sizes,
    saved_elems_per_token,
    unsloth_logit_rows,
)
from .plan import Resolved
from .sheet import Line

GIB = 1 << 30
MIB = 1 << 20
TRAIN = ("train",)
GEN_TRAIN = ("generate", "train")
ALL = ("start", "generate", "train")

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
    lines = []
    if r.card.cuda:
        lines.append(
            Line(
                "cuda_context",
                CUDA_CONTEXT_BYTES,
                "0.50 GiB per process (driver context, kernel images, cuBLAS workspaces)",
                True,
                "measure: NVML used memory after torch.cuda.init() and one matmul",
                ALL,
            )
        )
    else:
        lines.append(
            Line(
                "host_runtime",
                HOST_RUNTIME_BYTES,
                "1.25 GiB: Python + torch + transformers + unsloth + TRL imported (measured RSS 1.08-1.13 GiB)",
                True,
                "",
                ALL,
            )
        )
        lines.append(
            Line(
                "host_shape_caches",
                HOST_SHAPE_CACHE_BYTES,
                "0.25 GiB: oneDNN's kernel cache (one JIT kernel per new tensor shape) + malloc's free lists",
                True,
                "grows as completion lengths vary; measured as the resident set's growth over the training steps",
                GEN_TRAIN,
            )
        )
    if r.plan.other_use_bytes:
        lines.append(
            Line(
                "other_processes", r.plan.other_use_bytes, "given (desktop, other processes)", False, "", ALL
            )
        )
    return lines


def weight_bytes(r: Resolved) -> tuple[int, str]:
    """The trainer's copy of the base model (LoRA: frozen nf4/bf16; full: fp32 master weights)."""
    s, dt = r.shape, r.plan.compute_dtype_bytes
    if not r.lora:
        n = s.total_params()
        return n * 4, f"params {n:,} x 4 B (fp32 master weights; bf16 compute under autocast)"
    parts = base_weight_parts(s, r.quant, r.plan.compute_dtype_bytes)
    total = sum(parts.values())
    if r.quant == "nf4":
        formula = (
            f"{s.layers} layers x 7 linears NF4 (n/2 + n/64 + ceil(n/64/256) x 4 + 1092 B) "
            f"= {parts['linears_nf4']:,}"
        )
        if parts["linears_16bit"]:
            formula += f" + skipped linears x {dt} B = {parts['linears_16bit']:,}"
    else:
        formula = f"linears {s.layers * s.linear_params_per_layer():,} x {dt} B = {parts['linears_16bit']:,}"
    formula += f" + embeddings {s.vocab} x {s.hidden} x {dt} B = {parts['embeddings']:,}"
    formula += f" + lm_head {parts['lm_head']:,}" if parts["lm_head"] else " (lm_head tied)"
    formula += f" + norms {parts['norms']:,}"
    return total, formula


def trainer_lines(r: Resolved, shard: int = 1, shared_with_vllm: bool = False) -> list[Line]:
    """Lines of one trainer card; `shard` > 1 splits weights, grads and states (FSDP)."""
    p, s = r.plan, r.shape
    lines: list[Line] = []
    sh = f" / {shard} cards (FSDP)" if shard > 1 else ""

    wbytes, wformula = weight_bytes(r)
    note = "held once: Unsloth's vLLM engine uses the same tensors" if shared_with_vllm else ""
    lines.append(Line("base_weights", ceil_div(wbytes, shard), wformula + sh, False, note, ALL))

    if r.lora:
        n = lora_params(s, r.lora_rank, p.target_modules)
        per_layer = n // s.layers // r.lora_rank
        tb, dtype, why, note = trainable_dtype(r)
        base = f"{s.layers} layers x r {r.lora_rank} x sum(in+out) {per_layer:,} = {n:,} params"
        lines.append(
            Line("lora_params", n * tb // shard, f"{base} x {tb} B ({why})" + sh, False, note, GEN_TRAIN)
        )
        lines.append(
            Line(
                "lora_grads",
                n * tb // shard,
                f"{n:,} x {tb} B ({dtype} like the params, freed by zero_grad)" + sh,
                False,
                "",
                TRAIN,
            )
        )
        sizes = lora_tensor_sizes(s, r.lora_rank, p.target_modules)
        state = adam_state_bytes(sizes, r.optimizer, tb)
        if r.optimizer == "adamw_8bit":
            formula = (
                "bitsandbytes AdamW8bit: per matrix 2 x 1 B + 2 x 4 B per 256 (fp32 if < 4096 "
                "elements) + 2 KiB maps"
            )
        else:
            formula = f"{n:,} x 2 states x {tb} B ({dtype} AdamW: exp_avg, exp_avg_sq like the params)"
        lines.append(
            Line(
                "optimizer_states",
                ceil_div(state, shard),
                formula + sh,
                False,
                "allocated at the first step, kept after",
                GEN_TRAIN,
            )
        )
    else:
        n = s.total_params()
        lines.append(
            Line("full_grads", ceil_div(n * 4, shard), f"{n:,} x 4 B (fp32 grads)" + sh, False, "", TRAIN)
        )
        state = (
            adam_state_bytes([n], r.optimizer)
            if r.optimizer == "adamw_torch"
            else 2 * n + 8 * ceil_div(n, 256)
        )
        formula = (
            f"{n:,} x 2 x 4 B (fp32 AdamW)"
            if r.optimizer == "adamw_torch"
            else f"{n:,} x (2 x 1 B + 8 B / 256) (8-bit AdamW)"
        )
        lines.append(
            Line(
                "optimizer_states",
                ceil_div(state, shard),
                formula + sh,
                False,
                "mixed-precision AdamW: 4 + 4 + 8 = 16 B per parameter",
                GEN_TRAIN,
            )
        )

    lines.append(activation_line(r))
    lines.append(logits_line(r))
    ref = reference_line(r, shard)
    if ref is not None:
        lines.append(ref)
    return lines


def activation_line(r: Resolved) -> Line:
    """Activations of one micro-batch (batch x T tokens) through forward and backward. Estimate."""
    p, s = r.plan, r.shape
    dt = p.compute_dtype_bytes
    tokens = p.batch * r.seq_len
    saved = saved_elems_per_token(s, r.lora_rank, p.target_modules) * dt
    ckpt = s.hidden * dt  # one checkpointed hidden state per token per layer
    saved_f = f"(4h+3q+4kv+4ffn+{len(p.target_modules)}r) x {dt} B = {saved:,} B"
    if r.checkpointing == "none":
        total = (s.layers + 1) * tokens * saved
        formula = f"(L {s.layers} + 1 backward) x tokens {tokens:,} x {saved_f}"
    elif r.checkpointing == "standard":
        total = tokens * (s.layers * ckpt + 2 * saved)
        formula = (
            f"tokens {tokens:,} x (L {s.layers} x h x {dt} B checkpoints + 2 x one layer "
            f"recomputed with grads {saved_f})"
        )
    else:  # unsloth: the checkpoints go to CPU RAM; the card holds the layer being recomputed
        total = tokens * (2 * ckpt + 2 * saved)
        formula = f"tokens {tokens:,} x (2 x h x {dt} B in flight + 2 x one layer {saved_f})"
        if not r.card.cuda:  # offloaded to the same RAM
            total += tokens * s.layers * ckpt
            formula += f" + offloaded checkpoints L x tokens x h x {dt} B"
    note = ""
    if not r.card.cuda:
        # CPU attention runs the math SDPA path: it materialises batch x heads x T x T scores.
        scores = p.batch * s.heads * r.seq_len**2 * dt
        layers_held = s.layers + 1 if r.checkpointing == "none" else 2
        total += layers_held * scores
        formula += f" + {layers_held} x attention scores batch x heads x T^2 x {dt} B (CPU math SDPA)"
        note = "GPU attention (flash / memory-efficient) keeps no T^2 scores"
    return Line("train_activations", total, formula, True, note, TRAIN)


def logits_line(r: Resolved) -> Line:
    """Logits of the completion tokens: the log-prob of each sampled token needs a vocab-wide row."""
    p, s = r.plan, r.shape
    rows_all = p.batch * p.completion_len
    if p.chunked_logits:
        rows = unsloth_logit_rows(s.vocab, rows_all)
        formula = (
            f"chunk of min(2 GiB / (vocab x 8 B), max(512, rows {rows_all:,} / 8)) = {rows:,} rows "
            f"x vocab {s.vocab:,} x {UNSLOTH_BYTES_PER_LOGIT} B"
        )
        note = "Unsloth's chunked log-prob kernel (unsloth_zoo chunked_logprob_rows)"
    else:
        rows = rows_all
        formula = (
            f"batch {p.batch} x completion {p.completion_len} = {rows:,} rows x vocab {s.vocab:,} x "
            f"{UNSLOTH_BYTES_PER_LOGIT} B (bf16 logits + bf16 grad + fp32 working copy)"
        )
        note = "whole-batch logits"
    return Line("logits", rows * s.vocab * UNSLOTH_BYTES_PER_LOGIT, formula, True, note, TRAIN)


def trainable_dtype(r: Resolved) -> tuple[int, str, str, str]:
    """Bytes, dtype name, reason and note of the trainable LoRA parameters (and their grads and
    torch AdamW states, which torch allocates like the parameters)."""
    tb = r.trainable_bytes
    dtype = "fp32" if tb == 4 else "bf16"
    if r.plan.trainable_dtype_bytes is not None:
        return tb, dtype, f"{dtype}: trainable_dtype_bytes {tb}", ""
    if tb == 4:
        return tb, dtype, "fp32: PEFT upcasts adapters", ""
    return (
        tb,
        dtype,
        "bf16: Unsloth's CPU path trains LoRA in bf16",
        "measured on CPU: once train() starts, Unsloth casts the 'default' adapter to bf16 (grads and "
        "AdamW states follow), even when the model is loaded in float32",
    )


def reference_line(r: Resolved, shard: int = 1) -> Line | None:
    p, s = r.plan, r.shape
    if p.beta <= 0:
        return None
    logps = r.local_gen_batch * p.completion_len * 4
    if r.lora:
        # TRL >= 1.x (grpo_trainer.__init__): a model that is already a PeftModel (Unsloth's
        # get_peft_model) with beta != 0 gets a frozen "ref" adapter, a copy of "default", and the
        # reference log-probs come from it. PEFT's add_adapter upcasts it to fp32, and Unsloth's CPU
        # bf16 cast touches "default" only. Unsloth's patch that comments this block out matches
        # `if is_peft_available() and is_peft_model(model) and args.beta != 0.0:`, which TRL 1.15
        # spells `elif is_peft_model(model) and args.beta != 0.0:`, so the copy is made.
        n = lora_params(s, r.lora_rank, p.target_modules)
        return Line(
            "reference_policy",
            n * 4 // shard,
            f"frozen 'ref' adapter, a copy of 'default': {n:,} params x 4 B (fp32: PEFT's add_adapter "
            "upcasts it)" + (f" / {shard} cards (FSDP)" if shard > 1 else ""),
            False,
            "TRL adds it when the model is already a PEFT model and beta != 0 (measured on CPU: TRL 1.15, "
            f"PEFT 0.21, Unsloth 2026.10); ref log-probs {r.local_gen_batch} x {p.completion_len} x 4 B "
            f"= {logps:,} B ride with the batch, not counted",
            GEN_TRAIN,
        )
    n = s.total_params()
    return Line(
        "reference_policy",
        ceil_div(n * 2, shard) + logps,
        f"second model copy {n:,} x 2 B (bf16)"
        + (f" / {shard} (FSDP)" if shard > 1 else "")
        + " + ref log-probs",
        False,
        "",
        ALL,
    )


def generate_kv_line(r: Resolved, kv_per_token: int) -> Line:
    """No vLLM: HF generate keeps a DynamicCache for the whole local generation batch."""
    n = r.local_gen_batch
    return Line(
        "generate_kv_cache",
        n * r.seq_len * kv_per_token,
        f"{n} sequences x T {r.seq_len} x 2 x L x kv_heads x head_dim x {r.plan.compute_dtype_bytes} B "
        f"= {kv_per_token:,} B/token",
        False,
        "HF generate's DynamicCache",
        ("generate",),
    )
