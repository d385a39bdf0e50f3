"""The symbolic VRAM budget of a GRPO run: every gigabyte a step holds, as a line with its formula.

    from budgets import Plan, compute, plan_from_lab
    sheet = compute(plan_from_lab("labs/grpo-first"))
    print(sheet.table())
    sheet.require_fits()          # BudgetError naming the line that does not fit

Modules, one job each: shapes (model configs), cards (the card catalog), plan (inputs and their
checks), arithmetic (byte counts), vllm_rules (how vLLM and Unsloth size the engine), trainer and
engine (the lines of each side), compute (the sheet), roofline (throughput), headroom (what fits),
lab (lab.toml), sheet (lines, table, JSON), cli.
"""

from .cards import Card, card_names, custom_card, get_card
from .compute import compute
from .errors import BudgetError
from .headroom import Headroom, headroom, largest, suggest_vllm_util
from .lab import plan_from_lab
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
    "plan_from_lab",
    "suggest_vllm_util",
]
