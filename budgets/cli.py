"""`python -m budgets`: print the sheet of a plan (a table, or JSON with --json)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .cards import custom_card
from .compute import compute
from .errors import BudgetError
from .headroom import headroom, suggest_vllm_util
from .lab import plan_from_lab
from .plan import Plan

EXAMPLES = """examples:
  python -m budgets --lab labs/grpo-first                 the first lab's sheet (its gpu profile)
  python -m budgets --lab labs/grpo-first --profile cpu   the same lab on CPU
  python -m budgets --model qwen3-8b --gpu rtx-4090 --generations 16 --json
  python -m budgets --model qwen3-8b --gpu-memory-gb 24 --gpu-bandwidth-gbs 1008 --headroom
  python -m budgets --model qwen3-32b --quant bf16 --gpu h100-sxm --gpus 4 --layout server \\
      --vllm-gpus 2 --vllm-util 0.9 --link-gbps 400
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        print(f"budgets: {message}", file=sys.stderr)
        raise SystemExit(2)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m budgets",
        description="The VRAM budget sheet of a GRPO run.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--lab", help="read a lab's settings from LAB/lab.toml (flags below override them)")
    ap.add_argument("--profile", default="gpu", help="the lab.toml profile: gpu (default) or cpu")
    ap.add_argument("--model", help="a shipped name (any case), an HF-style id, or a config.json / folder")
    ap.add_argument(
        "--gpu",
        help="a catalog card: rtx-5080, rtx-4060-ti-16gb, t4, rtx-3090, rtx-4090, "
        "rtx-5090, rtx-pro-6000, h100-sxm, h200, cpu",
    )
    ap.add_argument("--gpu-memory-gb", type=float, help="a card by its memory in 10^9 bytes")
    ap.add_argument("--gpu-bandwidth-gbs", type=float, help="... and its bandwidth in 10^9 bytes/s")
    ap.add_argument("--gpus", type=int, help="cards in all (default 1)")
    ap.add_argument("--layout", choices=("shared", "colocate", "server"))
    ap.add_argument("--vllm-gpus", type=int, help="server layout: cards for vLLM (tensor parallel)")
    ap.add_argument("--vllm-util", type=float, help="vLLM's gpu_memory_utilization, in (0, 1]")
    ap.add_argument("--quant", choices=("nf4", "bf16"))
    ap.add_argument("--lora-rank", type=int)
    ap.add_argument("--full", action="store_true", default=None, help="full-parameter training")
    ap.add_argument("--optimizer", help="adamw_torch (fp32 states) or adamw_8bit")
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--completion-len", type=int)
    ap.add_argument("--generations", type=int, help="completions per prompt (num_generations)")
    ap.add_argument("--batch", type=int, help="completions per micro-batch per trainer card")
    ap.add_argument("--grad-accum", type=int)
    ap.add_argument("--max-seq-length", type=int)
    ap.add_argument("--beta", type=float)
    ap.add_argument("--gradient-checkpointing", choices=("unsloth", "true", "none"))
    ap.add_argument("--chunked-logits", type=_bool, metavar="{true,false}")
    ap.add_argument("--standby", type=_bool, metavar="{true,false}", help="Unsloth's UNSLOTH_VLLM_STANDBY")
    ap.add_argument("--fast-inference", type=_bool, metavar="{true,false}", help="false: HF generate")
    ap.add_argument("--trainer-sharding", choices=("ddp", "fsdp"))
    ap.add_argument(
        "--trainable-dtype-bytes",
        type=int,
        choices=(2, 4),
        help="bytes per LoRA param, grad and AdamW state (default: 4 on CUDA, 2 on cpu)",
    )
    ap.add_argument("--link-gbps", type=float, help="trainer -> vLLM link in 10^9 bits/s (server)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument(
        "--headroom",
        action="store_true",
        help="also the largest generations, completion length and batch that fit",
    )
    ap.add_argument("--suggest-util", action="store_true", help="also the vLLM share to use on this card")
    return ap


FLAG_TO_FIELD = {
    "model": "model",
    "gpu": "gpu",
    "gpus": "gpus",
    "layout": "layout",
    "vllm_gpus": "vllm_gpus",
    "vllm_util": "vllm_util",
    "quant": "quant",
    "lora_rank": "lora_rank",
    "full": "full",
    "optimizer": "optimizer",
    "prompt_len": "prompt_len",
    "completion_len": "completion_len",
    "generations": "generations",
    "batch": "batch",
    "grad_accum": "grad_accum",
    "max_seq_length": "max_seq_length",
    "beta": "beta",
    "gradient_checkpointing": "gradient_checkpointing",
    "chunked_logits": "chunked_logits",
    "standby": "standby",
    "fast_inference": "fast_inference",
    "trainer_sharding": "trainer_sharding",
    "trainable_dtype_bytes": "trainable_dtype_bytes",
    "link_gbps": "link_gbps",
}


def plan_from_args(args: argparse.Namespace) -> Plan:
    given: dict[str, Any] = {
        FLAG_TO_FIELD[k]: v for k, v in vars(args).items() if k in FLAG_TO_FIELD and v is not None
    }
    if args.gpu_memory_gb is not None or args.gpu_bandwidth_gbs is not None:
        if args.gpu:
            raise BudgetError("gpu: give --gpu or --gpu-memory-gb with --gpu-bandwidth-gbs, not both")
        if args.gpu_memory_gb is None or args.gpu_bandwidth_gbs is None:
            raise BudgetError(
                "gpu_memory_gb: a custom card needs both --gpu-memory-gb and --gpu-bandwidth-gbs"
            )
        given["gpu"] = custom_card(args.gpu_memory_gb, args.gpu_bandwidth_gbs)
    if given.get("full"):
        given.setdefault("lora_rank", None)
    if args.lab:
        # A changed completion length moves the lab's prompt bound unless a prompt length is given.
        if "completion_len" in given and "prompt_len" not in given:
            given["max_completion_length"] = given.pop("completion_len")
        return plan_from_lab(args.lab, args.profile, **given)
    if given.get("gpu") == "cpu" and "fast_inference" not in given:
        given["fast_inference"] = False
    return Plan(**given)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        plan = plan_from_args(args)
        sheet = compute(plan)
        extra: dict[str, Any] = {}
        if args.headroom:
            extra["headroom"] = [h.to_dict() for h in headroom(plan)]
        if args.suggest_util:
            util, why = suggest_vllm_util(plan)
            extra["suggested_vllm_util"] = {"util": util, "reasoning": why}
    except BudgetError as exc:
        print(f"budgets: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**sheet.to_dict(), **extra}, indent=2))
    else:
        print(sheet.table())
        for h in extra.get("headroom", []):
            print(
                f"headroom: largest {h['knob']} = {h['largest']} (now {h['current']}); binds {h['binding']}"
            )
        if "suggested_vllm_util" in extra:
            print(f"suggested vllm_util: {extra['suggested_vllm_util']['reasoning']}")
    return 0
