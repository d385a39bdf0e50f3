"""The inputs of a budget: one `Plan` names the model, the card, the layout and the GRPO settings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .cards import Card, get_card
from .errors import BudgetError
from .shapes import LINEARS, ModelShape, load_shape

LAYOUTS = ("shared", "colocate", "server")
QUANTS = ("nf4", "bf16")
# TRL / transformers optimizer names -> the state they keep per trainable parameter.
OPTIMIZERS = {
    "adamw": "adamw_torch",
    "adamw_torch": "adamw_torch",
    "adamw_torch_fused": "adamw_torch",
    "adamw_8bit": "adamw_8bit",
    "adamw_bnb_8bit": "adamw_8bit",
    "paged_adamw_8bit": "adamw_8bit",
}
CHECKPOINTING = {
    "unsloth": "unsloth",
    "true": "standard",
    "standard": "standard",
    "none": "none",
    "false": "none",
}
SHARDING = ("ddp", "fsdp")


@dataclass
class Plan:
    """Everything the sheet is computed from. Lengths are in tokens, batch sizes in completions."""

    model: str | ModelShape = "qwen3-4b"
    gpu: str | Card = "rtx-5080"
    layout: str = "shared"  # shared: Unsloth's in-process vLLM on the trainer's weights
    gpus: int = 1  # cards in all
    vllm_gpus: int = 0  # server layout: cards given to vLLM (tensor parallel), the rest train
    vllm_util: float = 0.45  # vLLM's gpu_memory_utilization
    quant: str = "nf4"
    lora_rank: int | None = 16
    full: bool = False  # full-parameter training instead of LoRA
    target_modules: tuple[str, ...] = LINEARS
    optimizer: str = "adamw_8bit"
    prompt_len: int = 256
    completion_len: int = 768
    generations: int = 8  # num_generations: completions per prompt (the group)
    batch: int = 8  # per_device_train_batch_size: completions per micro-batch per trainer card
    grad_accum: int = 1  # gradient_accumulation_steps (= steps_per_generation)
    max_seq_length: int | None = None  # None: prompt_len + completion_len
    beta: float = 0.0  # KL weight; > 0 needs the reference policy
    gradient_checkpointing: str = "unsloth"  # unsloth (offload to CPU) | true | none
    chunked_logits: bool = True  # Unsloth's chunked log-prob kernel; False: whole-batch logits
    standby: bool = False  # UNSLOTH_VLLM_STANDBY=1 (shared) / TRL vllm_enable_sleep_mode (colocate)
    standby_util_override: bool = False  # UNSLOTH_VLLM_STANDBY_UTIL_OVERRIDE=1: keep vllm_util
    link_gbps: float = 100.0  # trainer -> vLLM link in 10^9 bits/s (server layout weight sync)
    fast_inference: bool = True  # False: no vLLM, HF generate with its own KV cache
    max_lora_rank: int | None = None  # vLLM's LoRA slot rank; None: lora_rank
    enforce_eager: bool = False  # vLLM without CUDA graphs
    max_num_seqs: int | None = None  # vLLM batch; None: what Unsloth / TRL pick
    trainer_sharding: str = "ddp"  # how trainer cards split the model: ddp (replicas) | fsdp
    other_use_bytes: int = 0  # memory other processes (a desktop) hold on the card at start
    compute_dtype_bytes: int = 2  # bf16 activations, KV cache and 16-bit weights
    # LoRA params, their grads and AdamW (torch) states: None = what the backend does on this card:
    # 4 (fp32, PEFT upcasts adapters) on CUDA, 2 on the cpu card (Unsloth's CPU path casts the
    # trainable adapter to bf16 when training starts; measured with TRL 1.15, Unsloth 2026.10.9).
    trainable_dtype_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # lab keys the budget does not read

    def with_(self, **changes: Any) -> Plan:
        return replace(self, **changes)


@dataclass(frozen=True)
class Resolved:
    """A validated plan with its derived quantities, written once so every module reads the same."""

    plan: Plan
    shape: ModelShape
    card: Card
    layout: str
    quant: str
    optimizer: str
    checkpointing: str
    lora_rank: int  # 0 for full training
    max_lora_rank: int
    seq_len: int  # T = prompt_len + completion_len: one rollout, prompt plus completion
    max_seq_length: int
    trainer_cards: int
    vllm_cards: int
    gen_batch: int  # completions generated per optimizer step across all trainer cards
    trainable_bytes: int  # bytes per LoRA parameter, grad and torch AdamW state (4 fp32, 2 bf16)
    local_gen_batch: int  # completions one trainer card generates (colocate / shared / HF generate)
    prompts_per_step: int

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def uses_vllm(self) -> bool:
        return self.plan.fast_inference and self.card.cuda


def _positive_int(name: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BudgetError(f"{name}: must be a whole number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise BudgetError(f"{name}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return int(value)


def resolve(plan: Plan) -> Resolved:
    """Check every input; raise BudgetError naming the first bad one."""
    shape = load_shape(plan.model)
    card = get_card(plan.gpu)
    layout = str(plan.layout).lower()
    if layout not in LAYOUTS:
        raise BudgetError(f"layout: must be one of {', '.join(LAYOUTS)}, got {plan.layout!r}")
    quant = str(plan.quant).lower()
    if quant not in QUANTS:
        raise BudgetError(f"quant: must be one of {', '.join(QUANTS)}, got {plan.quant!r}")
    optimizer = OPTIMIZERS.get(str(plan.optimizer).lower())
    if optimizer is None:
        raise BudgetError(f"optimizer: must be one of {', '.join(OPTIMIZERS)}, got {plan.optimizer!r}")
    checkpointing = CHECKPOINTING.get(str(plan.gradient_checkpointing).lower())
    if checkpointing is None:
        raise BudgetError(
            f"gradient_checkpointing: must be unsloth, true or none, got {plan.gradient_checkpointing!r}"
        )
    if str(plan.trainer_sharding).lower() not in SHARDING:
        raise BudgetError(f"trainer_sharding: must be ddp or fsdp, got {plan.trainer_sharding!r}")

    prompt_len = _positive_int("prompt_len", plan.prompt_len)
    completion_len = _positive_int("completion_len", plan.completion_len)
    generations = _positive_int("generations", plan.generations)
    batch = _positive_int("batch", plan.batch)
    grad_accum = _positive_int("grad_accum", plan.grad_accum)
    gpus = _positive_int("gpus", plan.gpus)
    vllm_gpus = _positive_int("vllm_gpus", plan.vllm_gpus, allow_zero=True)
    seq_len = prompt_len + completion_len
    max_seq = seq_len if plan.max_seq_length is None else _positive_int("max_seq_length", plan.max_seq_length)
    if seq_len > max_seq:
        raise BudgetError(
            f"max_seq_length: prompt_len + completion_len = {seq_len} exceeds "
            f"max_seq_length = {max_seq}; raise max_seq_length or shorten the prompt"
        )
    if shape.max_position and max_seq > shape.max_position:
        raise BudgetError(
            f"max_seq_length: {max_seq} exceeds {shape.name}'s max_position_embeddings {shape.max_position}"
        )

    util = plan.vllm_util
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not (0 < util <= 1):
        raise BudgetError(f"vllm_util: must be in (0, 1], got {util!r}")
    if not isinstance(plan.beta, (int, float)) or plan.beta < 0:
        raise BudgetError(f"beta: must be >= 0, got {plan.beta!r}")
    if not isinstance(plan.link_gbps, (int, float)) or plan.link_gbps <= 0:
        raise BudgetError(f"link_gbps: must be > 0, got {plan.link_gbps!r}")
    if plan.other_use_bytes < 0:
        raise BudgetError(f"other_use_bytes: must be >= 0, got {plan.other_use_bytes}")

    # LoRA or full training: a rank of 0 (or None) only makes sense with full=True.
    rank = plan.lora_rank
    if plan.full:
        if rank:
            raise BudgetError(f"lora_rank: {rank} given with full training; drop --lora-rank or --full")
        if quant == "nf4":
            raise BudgetError("quant: full-parameter training cannot update 4-bit weights; use --quant bf16")
        rank = 0
    else:
        if rank is None or rank == 0:
            raise BudgetError(
                "lora_rank: 0 trains nothing; give a rank > 0 or pass --full for full-parameter training"
            )
        rank = _positive_int("lora_rank", rank)
    max_lora_rank = rank if plan.max_lora_rank is None else _positive_int("max_lora_rank", plan.max_lora_rank)
    if rank and max_lora_rank < rank:
        raise BudgetError(f"max_lora_rank: {max_lora_rank} is below lora_rank {rank}")
    targets = tuple(plan.target_modules)
    bad = [t for t in targets if t not in LINEARS]
    if bad or not targets:
        raise BudgetError(
            f"target_modules: must be a non-empty subset of {', '.join(LINEARS)}, got {bad or targets}"
        )

    # Cards: the server layout splits them; the others put a trainer (and maybe vLLM) on each.
    if layout == "server":
        if not plan.fast_inference:
            raise BudgetError("layout: server mode is vLLM on its own cards; it needs fast_inference")
        if vllm_gpus < 1 or vllm_gpus >= gpus:
            raise BudgetError(
                f"vllm_gpus: server layout needs 1 <= vllm_gpus < gpus, got {vllm_gpus} of {gpus}"
            )
        if quant == "nf4":
            raise BudgetError(
                "quant: TRL server mode merges the adapter and sends full weights each step; "
                "it does not work with a 4-bit base, use --quant bf16"
            )
        trainer_cards = gpus - vllm_gpus
    else:
        if vllm_gpus:
            raise BudgetError(f"vllm_gpus: only the server layout dedicates cards to vLLM (layout={layout})")
        trainer_cards = gpus
    if not card.cuda and (gpus != 1 or layout != "shared" or plan.fast_inference):
        raise BudgetError(
            "gpu: the cpu card runs one process without vLLM: use --layout shared, "
            "--gpus 1 and fast_inference false"
        )
    if card.cuda and not plan.fast_inference and layout != "shared":
        raise BudgetError(f"layout: {layout} is a vLLM layout; fast_inference false means HF generate")

    # TRL: generation_batch_size = per_device_train_batch_size x processes x steps_per_generation,
    # and it must split into whole groups of num_generations.
    gen_batch = batch * trainer_cards * grad_accum
    if gen_batch % generations:
        raise BudgetError(
            f"batch: batch x trainer cards x grad_accum = {gen_batch} is not divisible by "
            f"generations = {generations}"
        )
    if plan.compute_dtype_bytes not in (2, 4):
        raise BudgetError(
            f"compute_dtype_bytes: must be 2 (bf16) or 4 (fp32), got {plan.compute_dtype_bytes}"
        )
    if plan.max_num_seqs is not None:
        _positive_int("max_num_seqs", plan.max_num_seqs)
    trainable_bytes = plan.trainable_dtype_bytes
    if trainable_bytes is None:
        trainable_bytes = 4 if card.cuda else 2  # Unsloth's CPU path trains the adapter in bf16
    elif trainable_bytes not in (2, 4) or isinstance(trainable_bytes, bool):
        raise BudgetError(
            f"trainable_dtype_bytes: must be 2 (bf16) or 4 (fp32), got {plan.trainable_dtype_bytes!r}"
        )
    elif not rank:
        raise BudgetError(
            "trainable_dtype_bytes: applies to LoRA only; full training keeps fp32 master weights, "
            "grads and AdamW states"
        )

    return Resolved(
        plan=plan,
        shape=shape,
        card=card,
        layout=layout,
        quant=quant,
        optimizer=optimizer,
        checkpointing=checkpointing,
        lora_rank=rank,
        max_lora_rank=max_lora_rank if rank else 0,
        seq_len=seq_len,
        max_seq_length=max_seq,
        trainer_cards=trainer_cards,
        vllm_cards=vllm_gpus if layout == "server" else 0,
        gen_batch=gen_batch,
        trainable_bytes=trainable_bytes if rank else 4,
        local_gen_batch=batch * grad_accum,
        prompts_per_step=gen_batch // generations,
    )


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
