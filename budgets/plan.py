"""The inputs of a budget: one `Plan` names the model, the card, the layout and the GRPO settings.

Settings keep the names TRL's `GRPOConfig` and Unsloth's `FastLanguageModel` give them
(`num_generations`, `per_device_train_batch_size`, `gpu_memory_utilization`, ...), so a lab's
lab.toml, its flags, the budget CLI's flags and the sheet's inputs are one vocabulary. Settings
with no library name (the card, the layout, the number of cards) are the budget's own.

`resolve(plan)` is the one place that checks a plan: it raises BudgetError naming the setting at
fault, and returns the derived quantities every module reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .cards import Card, get_card
from .errors import BudgetError
from .shapes import LINEARS, ModelShape, load_shape
from .units import GIB
from .vocabulary import GRPO_TRAINERS, LAYOUTS, SHARDING


def setting(default: Any, **extra: Any) -> Any:
    """A Plan field with its default; its help is the vocabulary's (budgets.vocabulary.HELP)."""
    return field(default=default, metadata=extra)


@dataclass
class Plan:
    """Everything the sheet is computed from. Lengths are in tokens, batch sizes in completions.

    Parameters that control the model:
        model, load_in_4bit, dtype, lora_rank, max_lora_rank, target_modules, full_finetuning
    Parameters that control training:
        optim, per_device_train_batch_size, gradient_accumulation_steps, beta,
        use_gradient_checkpointing, chunked_logits, grpo_trainer, trainable_dtype_bytes
    Parameters that control generation:
        num_generations, max_prompt_length, max_completion_length, max_seq_length, fast_inference,
        gpu_memory_utilization, unsloth_vllm_standby, max_num_seqs, enforce_eager
    Parameters that control the cards:
        gpu, gpus, layout, vllm_gpus, trainer_sharding, link_gbps, other_processes_gib
    """

    # --- the model ---------------------------------------------------------------------------
    model: str | ModelShape = setting("qwen3-4b")
    load_in_4bit: bool = setting(True)
    dtype: str = setting("auto")
    lora_rank: int | None = setting(16)
    max_lora_rank: int | None = setting(None)
    target_modules: tuple[str, ...] = setting(LINEARS)
    full_finetuning: bool = setting(False)
    # --- training ----------------------------------------------------------------------------
    optim: str = setting("adamw_8bit")
    per_device_train_batch_size: int = setting(8)
    gradient_accumulation_steps: int = setting(1)
    beta: float = setting(0.0)
    use_gradient_checkpointing: str | bool = setting("unsloth")
    chunked_logits: bool = setting(True)
    grpo_trainer: str = setting("unsloth")
    trainable_dtype_bytes: int | None = setting(None)
    # --- generation --------------------------------------------------------------------------
    num_generations: int = setting(8)
    max_prompt_length: int = setting(256)
    max_completion_length: int = setting(768)
    max_seq_length: int | None = setting(None)
    fast_inference: bool = setting(True)
    gpu_memory_utilization: float = setting(0.45)
    unsloth_vllm_standby: bool = setting(False)
    unsloth_vllm_standby_util_override: bool = setting(False)
    max_num_seqs: int | None = setting(None)
    enforce_eager: bool = setting(False)
    # --- the cards ---------------------------------------------------------------------------
    gpu: str | Card = setting("rtx-5080", card=True)
    gpus: int = setting(1)
    layout: str = setting("shared")
    vllm_gpus: int = setting(0)
    trainer_sharding: str = setting("ddp")
    link_gbps: float = setting(100.0)
    other_processes_gib: float = setting(0.0)

    def with_(self, **changes: Any) -> Plan:
        return replace(self, **changes)

    def with_num_generations(self, g: int) -> Plan:
        """A new group size, keeping the prompts per step: the batch follows the group."""
        return replace(self, **follow_group(self.__dict__, g))


PLAN_FIELDS = tuple(f.name for f in fields(Plan))
# TRL / transformers optimizer names -> the state they keep per trainable parameter.
OPTIMIZERS = {
    "adamw": "adamw_torch",
    "adamw_torch": "adamw_torch",
    "adamw_torch_fused": "adamw_torch",
    "adamw_8bit": "adamw_8bit",
    "adamw_bnb_8bit": "adamw_8bit",
    "paged_adamw_8bit": "adamw_8bit",
}
CHECKPOINTING = {"unsloth": "unsloth", "true": "standard", "false": "none"}
DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "float32": 4}


def follow_group(values: Mapping[str, Any], num_generations: int) -> dict[str, Any]:
    """Settings after a new group size: per_device_train_batch_size keeps the same number of
    groups (prompts) per micro-batch, so the batch stays divisible by the group."""
    g, batch = values["num_generations"], values["per_device_train_batch_size"]
    groups = batch // g if g and batch % g == 0 else None
    if groups is None:
        return {"num_generations": num_generations}
    return {"num_generations": num_generations, "per_device_train_batch_size": groups * num_generations}


@dataclass(frozen=True)
class Resolved:
    """A validated plan with its derived quantities, written once so every module reads the same."""

    plan: Plan
    shape: ModelShape
    card: Card
    layout: str
    quant: str  # "nf4" or "bf16"
    optimizer: str  # "adamw_torch" or "adamw_8bit"
    checkpointing: str  # "unsloth", "standard" or "none"
    dtype_bytes: int  # activations, KV cache and 16-bit weights
    lora_rank: int  # 0 for full training
    max_lora_rank: int
    seq_len: int  # T = max_prompt_length + max_completion_length: one rollout
    max_seq_length: int
    trainer_cards: int
    vllm_cards: int
    gen_batch: int  # completions generated per optimizer step across all trainer cards
    local_gen_batch: int  # completions one trainer card generates (colocate / shared / HF generate)
    prompts_per_step: int
    trainable_bytes: int  # bytes per LoRA parameter, grad and torch AdamW state (4 fp32, 2 bf16)
    other_bytes: int  # memory other processes hold on the card

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def uses_vllm(self) -> bool:
        return self.plan.fast_inference and self.card.cuda


def _whole(name: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BudgetError(f"{name}: must be a whole number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise BudgetError(f"{name}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return int(value)


def _number(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"in ({low:g}, {high:g}]" if high is not None else f"{'>' if low_open else '>='} {low:g}"
        raise BudgetError(f"{name}: must be {bound}, got {value!r}")
    return float(value)


def _choice(name: str, value: Any, table: Mapping[str, Any] | tuple[str, ...]) -> str:
    key = str(value).lower()
    if key not in table:
        raise BudgetError(f"{name}: must be one of {', '.join(table)}, got {value!r}")
    return key


def resolve(plan: Plan) -> Resolved:
    """Check every input; raise BudgetError naming the first bad one."""
    p = plan
    shape = load_shape(p.model)
    card = get_card(p.gpu)
    layout = _choice("layout", p.layout, LAYOUTS)
    optimizer = OPTIMIZERS[_choice("optim", p.optim, OPTIMIZERS)]
    checkpointing = CHECKPOINTING[
        _choice("use_gradient_checkpointing", p.use_gradient_checkpointing, CHECKPOINTING)
    ]
    _choice("trainer_sharding", p.trainer_sharding, SHARDING)
    _choice("grpo_trainer", p.grpo_trainer, GRPO_TRAINERS)
    dtype = _choice("dtype", str(p.dtype).removeprefix("torch."), DTYPES)
    dtype_bytes = DTYPES[dtype] or 2

    prompt = _whole("max_prompt_length", p.max_prompt_length)
    completion = _whole("max_completion_length", p.max_completion_length)
    generations = _whole("num_generations", p.num_generations)
    batch = _whole("per_device_train_batch_size", p.per_device_train_batch_size)
    grad_accum = _whole("gradient_accumulation_steps", p.gradient_accumulation_steps)
    gpus = _whole("gpus", p.gpus)
    vllm_gpus = _whole("vllm_gpus", p.vllm_gpus, allow_zero=True)
    seq_len = prompt + completion
    max_seq = seq_len if p.max_seq_length is None else _whole("max_seq_length", p.max_seq_length)
    if seq_len > max_seq:
        raise BudgetError(
            f"max_seq_length: max_prompt_length + max_completion_length = {prompt} + {completion} = "
            f"{seq_len} exceeds max_seq_length {max_seq}; raise max_seq_length or lower "
            "max_completion_length"
        )
    if shape.max_position and max_seq > shape.max_position:
        raise BudgetError(
            f"max_seq_length: {max_seq} exceeds {shape.name}'s max_position_embeddings {shape.max_position}"
        )
    _number("gpu_memory_utilization", p.gpu_memory_utilization, 0, 1, low_open=True)
    _number("beta", p.beta, 0)
    _number("link_gbps", p.link_gbps, 0, low_open=True)
    other = _number("other_processes_gib", p.other_processes_gib, 0)

    # LoRA or full training.
    rank = p.lora_rank
    if p.full_finetuning:
        if rank:
            raise BudgetError(f"lora_rank: {rank} given with full_finetuning; full training has no adapter")
        if p.load_in_4bit:
            raise BudgetError(
                "load_in_4bit: full-parameter training cannot update 4-bit weights; set load_in_4bit false"
            )
        rank = 0
    else:
        if not rank:
            raise BudgetError(
                "lora_rank: 0 trains nothing; give a rank > 0 or set full_finetuning for all parameters"
            )
        rank = _whole("lora_rank", rank)
    max_lora_rank = rank if p.max_lora_rank is None else _whole("max_lora_rank", p.max_lora_rank)
    if rank and max_lora_rank < rank:
        raise BudgetError(f"max_lora_rank: {max_lora_rank} is below lora_rank {rank}; raise max_lora_rank")
    bad = [t for t in p.target_modules if t not in LINEARS]
    if bad or not p.target_modules:
        raise BudgetError(
            f"target_modules: must be a non-empty subset of {', '.join(LINEARS)}, got {bad or list(p.target_modules)}"
        )

    # Cards: the server layout splits them; the others put a trainer (and maybe vLLM) on each.
    if layout == "server":
        if not p.fast_inference:
            raise BudgetError("fast_inference: the server layout is vLLM on its own cards; it needs vLLM")
        if vllm_gpus < 1 or vllm_gpus >= gpus:
            raise BudgetError(
                f"vllm_gpus: the server layout needs 1 <= vllm_gpus < gpus, got {vllm_gpus} of {gpus}"
            )
        if p.load_in_4bit:
            raise BudgetError(
                "load_in_4bit: TRL server mode merges the adapter and sends full weights each step; "
                "it does not work with a 4-bit base, set load_in_4bit false"
            )
        trainer_cards = gpus - vllm_gpus
    else:
        if vllm_gpus:
            raise BudgetError(f"vllm_gpus: only the server layout gives cards to vLLM (layout is {layout})")
        trainer_cards = gpus
    if not card.cuda and (gpus != 1 or layout != "shared" or p.fast_inference):
        raise BudgetError(
            "gpu: the cpu card runs one process without vLLM: layout shared, gpus 1, fast_inference false"
        )
    if card.cuda and not p.fast_inference and layout != "shared":
        raise BudgetError(f"layout: {layout} is a vLLM layout; with fast_inference false use layout shared")

    # TRL: generation_batch_size = per_device_train_batch_size x processes x steps_per_generation,
    # and it must split into whole groups of num_generations.
    gen_batch = batch * trainer_cards * grad_accum
    if gen_batch % generations:
        raise BudgetError(
            f"per_device_train_batch_size: {batch} x {trainer_cards} card(s) x gradient_accumulation_steps "
            f"{grad_accum} = {gen_batch} completions per step is not a whole number of groups of "
            f"num_generations {generations}; use a multiple of {generations}"
        )
    if p.max_num_seqs is not None:
        _whole("max_num_seqs", p.max_num_seqs)
    trainable = p.trainable_dtype_bytes
    if trainable is None:
        # PEFT keeps adapters in fp32; TRL's own trainer casts them to bf16 on a CPU (its
        # grpo_trainer.__init__), Unsloth's keeps fp32 (measured, tests/test_unsloth_trainer.py).
        trainable = 2 if not card.cuda and str(p.grpo_trainer).lower() == "trl" else 4
    elif isinstance(trainable, bool) or trainable not in (2, 4):
        raise BudgetError(f"trainable_dtype_bytes: must be 2 (bf16) or 4 (fp32), got {trainable!r}")
    elif not rank:
        raise BudgetError(
            "trainable_dtype_bytes: applies to LoRA only; full training keeps fp32 master weights, "
            "grads and AdamW states"
        )

    return Resolved(
        plan=p,
        shape=shape,
        card=card,
        layout=layout,
        quant="nf4" if p.load_in_4bit else "bf16",
        optimizer=optimizer,
        checkpointing=checkpointing,
        dtype_bytes=dtype_bytes,
        lora_rank=rank,
        max_lora_rank=max_lora_rank if rank else 0,
        seq_len=seq_len,
        max_seq_length=max_seq,
        trainer_cards=trainer_cards,
        vllm_cards=vllm_gpus if layout == "server" else 0,
        gen_batch=gen_batch,
        local_gen_batch=batch * grad_accum,
        prompts_per_step=gen_batch // generations,
        trainable_bytes=trainable if rank else 4,
        other_bytes=int(other * GIB),
    )
