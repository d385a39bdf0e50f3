"""`python -m budgets`: the sheet of a plan, as a table or JSON.

Every flag is a Plan setting under its own name (`--num-generations`, `--gpu-memory-utilization`),
generated from the Plan's fields with the vocabulary's help (budgets.vocabulary), so the flags,
lab.toml and the sheet's inputs share one vocabulary. The CLI takes a plan; a chapter's lab.toml is
the harness's to read (`train.py --budget-only` prints that chapter's sheet with `gather`'s and
`render`'s help). `gather` computes the numbers, `render` prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import fields
from typing import Any

from .cards import card_names, custom_card
from .compute import compute
from .errors import BudgetError
from .headroom import headroom, suggest_vllm_util
from .plan import Plan, follow_group
from .sheet import Sheet
from .vocabulary import HELP, OneLineErrorParser, add_setting

EXAMPLES = """examples:
  python -m budgets --model qwen3-8b --gpu rtx-4090 --num-generations 16 --json
  python -m budgets --model qwen3-8b --gpu-memory-gb 24 --gpu-bandwidth-gbs 1008 --headroom
  python -m budgets --model qwen3-32b --load-in-4bit false --gpu h100-sxm --gpus 4 --layout server \\
      --vllm-gpus 2 --gpu-memory-utilization 0.9 --link-gbps 400
  python -m budgets --model qwen3-4b --task countdown --suggest-util

A chapter's own sheet (its lab.toml, the card it finds) is the lab's to print:
  python labs/grpo-first/train.py --budget-only [--profile cpu] [--suggest-util] [--headroom] [--json]
"""


def parser() -> argparse.ArgumentParser:
    ap = OneLineErrorParser(
        prog="python -m budgets",
        description="The VRAM budget sheet of a GRPO run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--task", help=HELP["task"])
    ap.add_argument("--task-config", default=None, help=HELP["task_config"])
    settings = ap.add_argument_group("settings (Plan fields; lab.toml uses the same names)")
    hints = typing.get_type_hints(Plan)
    for f in fields(Plan):
        help = f"the card: {', '.join(card_names())}" if f.name == "gpu" else None
        add_setting(settings, f.name, hints[f.name], help)
    card = ap.add_argument_group("a card not in the catalog")
    card.add_argument("--gpu-memory-gb", type=float, help="its memory in 10^9 bytes")
    card.add_argument("--gpu-bandwidth-gbs", type=float, help="its bandwidth in 10^9 bytes/s")
    out = ap.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print JSON instead of the table")
    out.add_argument(
        "--headroom", action="store_true", help="also the largest group, completion and batch that fit"
    )
    out.add_argument(
        "--suggest-util", action="store_true", help="also the gpu_memory_utilization to use on this card"
    )
    return ap


def plan_from_args(args: argparse.Namespace) -> Plan:
    given = {f.name: getattr(args, f.name) for f in fields(Plan) if getattr(args, f.name) is not None}
    if args.gpu_memory_gb is not None or args.gpu_bandwidth_gbs is not None:
        if args.gpu:
            raise BudgetError("gpu: give --gpu or --gpu-memory-gb with --gpu-bandwidth-gbs, not both")
        if args.gpu_memory_gb is None or args.gpu_bandwidth_gbs is None:
            raise BudgetError(
                "gpu_memory_gb: a card not in the catalog needs --gpu-memory-gb and --gpu-bandwidth-gbs"
            )
        given["gpu"] = custom_card(args.gpu_memory_gb, args.gpu_bandwidth_gbs)
    if given.get("full_finetuning"):
        given.setdefault("lora_rank", None)
    if args.task and "max_prompt_length" not in given:
        from task import UnknownTaskError, get_task
        from task.dataset import chatml_chars

        try:
            given["max_prompt_length"] = chatml_chars(
                get_task(args.task, args.task_config).worst_case_prompt()
            )
        except UnknownTaskError as err:
            raise BudgetError(f"task: {err}") from None
    if given.get("gpu") == "cpu":
        given.setdefault("fast_inference", False)
    if "num_generations" in given and "per_device_train_batch_size" not in given:
        given = {**follow_group(vars(Plan()), given["num_generations"]), **given}
    return Plan(**given)


def gather(args: argparse.Namespace) -> tuple[Sheet, dict[str, Any]]:
    """The sheet and what --headroom and --suggest-util add."""
    plan = plan_from_args(args)
    return compute(plan), extras(plan, args.headroom, args.suggest_util)


def extras(plan: Plan, with_headroom: bool, suggest_util: bool) -> dict[str, Any]:
    """What --headroom (the largest group, completion and batch that fit) and --suggest-util (the
    vLLM share to use on this card) add to a plan's sheet."""
    extra: dict[str, Any] = {}
    if with_headroom:
        extra["headroom"] = [h.to_dict() for h in headroom(plan)]
    if suggest_util:
        util, why = suggest_vllm_util(plan)
        extra["suggested_gpu_memory_utilization"] = {"gpu_memory_utilization": util, "reasoning": why}
    return extra


def render(sheet: Sheet, extra: dict[str, Any], as_json: bool, accepts: Any = None) -> str:
    """The sheet as a table (its advice naming only flags in `accepts`, when given) or as JSON."""
    if as_json:
        return json.dumps({**sheet.to_dict(), **extra}, indent=2)
    rows = [sheet.table(accepts=accepts)]
    for h in extra.get("headroom", []):
        rows.append(
            f"headroom: largest {h['knob']} = {h['largest']} (now {h['current']}); binds {h['binding']}"
        )
    if "suggested_gpu_memory_utilization" in extra:
        rows.append(
            f"suggested gpu_memory_utilization: {extra['suggested_gpu_memory_utilization']['reasoning']}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        sheet, extra = gather(args)
    except BudgetError as exc:
        print(f"budgets: {exc}", file=sys.stderr)
        return 2
    print(render(sheet, extra, args.json))
    return 0
