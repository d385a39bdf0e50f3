"""`python -m budgets`: the sheet of a plan, or of a lab's settings, as a table or JSON.

Every flag is a Plan setting under its own name (`--num-generations`, `--gpu-memory-utilization`),
generated from the Plan's fields, so the flags, lab.toml and the sheet's inputs share one vocabulary.
`gather` computes the numbers, `render` prints them.
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
from .plan import LAYOUTS, SHARDING, Plan, follow_group
from .sheet import Sheet

EXAMPLES = """examples:
  python -m budgets --lab labs/grpo-first                 the first lab's sheet (its gpu profile)
  python -m budgets --lab labs/grpo-first --profile cpu   the same lab on CPU
  python -m budgets --lab labs/grpo-first --gpu t4 --suggest-util --headroom
  python -m budgets --model qwen3-8b --gpu rtx-4090 --num-generations 16 --json
  python -m budgets --model qwen3-8b --gpu-memory-gb 24 --gpu-bandwidth-gbs 1008 --headroom
  python -m budgets --model qwen3-32b --load-in-4bit false --gpu h100-sxm --gpus 4 --layout server \\
      --vllm-gpus 2 --gpu-memory-utilization 0.9 --link-gbps 400
"""
CHOICES = {
    "layout": LAYOUTS,
    "trainer_sharding": SHARDING,
    "grpo_trainer": ("unsloth", "trl"),
    "use_gradient_checkpointing": ("unsloth", "true", "false"),
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "trainable_dtype_bytes": (2, 4),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, exit 2, like every other bad input
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_setting(
    group: argparse._ActionsContainer, name: str, annotation: Any, help: str, choices=None
) -> None:
    """One flag for one setting: --name-with-dashes, typed from the dataclass annotation.
    Defaults stay None so that only the settings given on the command line override."""
    flag = "--" + name.replace("_", "-")
    text = str(annotation)
    if text in ("bool", "<class 'bool'>"):
        group.add_argument(flag, type=parse_bool, metavar="{true,false}", help=help)
    elif "tuple" in text:
        group.add_argument(flag, type=parse_list, metavar="A,B,...", help=help)
    elif choices is not None:
        kind = int if all(isinstance(c, int) for c in choices) else str
        group.add_argument(flag, type=kind, choices=choices, help=help)
    elif "float" in text:
        group.add_argument(flag, type=float, help=help)
    elif text.startswith("int") or "<class 'int'>" in text:
        group.add_argument(flag, type=int, help=help)
    else:
        group.add_argument(flag, help=help)


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m budgets",
        description="The VRAM budget sheet of a GRPO run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--lab", help="read a lab's settings from LAB/lab.toml (the flags below override them)")
    ap.add_argument("--profile", default="gpu", help="the lab.toml profile: gpu (default) or cpu")
    ap.add_argument(
        "--task", help="the task whose longest prompt sets max_prompt_length (a lab's setting with --lab)"
    )
    settings = ap.add_argument_group("settings (Plan fields; lab.toml uses the same names)")
    hints = typing.get_type_hints(Plan)
    for f in fields(Plan):
        help = f.metadata.get("help", "")
        if f.name == "gpu":
            help = f"the card: {', '.join(card_names())}"
        add_setting(settings, f.name, hints[f.name], help, CHOICES.get(f.name))
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
    if args.lab:
        from grpolab.settings import FLAGS, LabSettingsError, check, lab_settings

        lab_given = {k: v for k, v in given.items() if k in FLAGS}
        if args.task:
            lab_given["task"] = args.task
        try:
            settings = lab_settings(args.lab, args.profile, lab_given)
            check(settings)  # the lab's own checks: what the lab would refuse, the sheet refuses
        except LabSettingsError as err:
            raise BudgetError(str(err)) from None
        return settings.plan().with_(**{k: v for k, v in given.items() if k not in FLAGS})
    if args.task and "max_prompt_length" not in given:
        from grpolab.settings import chatml_chars
        from task import UnknownTaskError, get_task

        try:
            given["max_prompt_length"] = chatml_chars(get_task(args.task).worst_case_prompt())
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
    sheet = compute(plan)
    extra: dict[str, Any] = {}
    if args.headroom:
        extra["headroom"] = [h.to_dict() for h in headroom(plan)]
    if args.suggest_util:
        util, why = suggest_vllm_util(plan)
        extra["suggested_gpu_memory_utilization"] = {"gpu_memory_utilization": util, "reasoning": why}
    return sheet, extra


def render(sheet: Sheet, extra: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps({**sheet.to_dict(), **extra}, indent=2)
    rows = [sheet.table()]
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
