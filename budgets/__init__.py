"""The symbolic VRAM budget of a GRPO run: every gigabyte a step holds, as a line with its formula.

    from budgets import Plan, compute
    sheet = compute(Plan(model="qwen3-4b", gpu="rtx-5080", num_generations=8))
    print(sheet.table())
    sheet.require_fits()          # BudgetError naming the line that does not fit and what to change

A lab's plan comes from its settings: `grpolab.config.settings.lab_settings("labs/grpo-first", "gpu").plan()`.

Modules, one job each: units (bytes, phases), formula (numbers that print themselves), shapes
(model configs), cards (the card catalog), plan (the inputs and their checks), arithmetic (byte
counts), vllm_rules (how vLLM and Unsloth size the engine), trainer and engine (the lines of each
side), layouts/ (where trainer and vLLM sit, one module each), advice (what to change), compute
(the sheet), roofline (throughput), headroom (what fits), sheet (lines, table, JSON), cli.
"""

from .cards import Card, card_names, custom_card, get_card
from .compute import compute
from .errors import BudgetError
from .headroom import Headroom, headroom, largest, suggest_vllm_util
from .plan import Plan
from .shapes import ModelShape, load_shape
from .sheet import Line, Sheet

__all__ = [
    "BudgetError",
    "Card",
    "Headroom",
    "Line",
    "ModelShape",
    "Plan",
    "Sheet",
    "card_names",
    "compute",
    "custom_card",
    "get_card",
    "headroom",
    "largest",
    "load_shape",
    "suggest_vllm_util",
]
