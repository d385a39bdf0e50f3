"""Units, rounding and the phases of a GRPO step: defined once, read by every module of the budget."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

# The moments of a GRPO step at which memory peaks. Every line of the sheet lists the phases that
# hold it; the sheet's total is the largest phase.
#   start    vLLM has profiled its forward pass and allocated its KV cache
#   generate rollouts are decoded
#   train    forward and backward through the trainer's model
PHASES = ("start", "generate", "train")
ALL = PHASES
START_GEN = ("start", "generate")
GEN_TRAIN = ("generate", "train")
TRAIN = ("train",)
GENERATE = ("generate",)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gib(n: float) -> float:
    return n / GIB


def human_bytes(n: float, sign: bool = False) -> str:
    """1.23 GiB, 45.6 MiB, 7.8 KiB: the tiny model's lines are kilobytes, the real ones gigabytes."""
    plus = "+" if sign else ""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:{plus}.2f} {unit}"
    return f"{n:{plus}.0f} B"
