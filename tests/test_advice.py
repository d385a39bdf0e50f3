"""Every piece of advice the sheet or the lab prints names a setting the printing command accepts,
and never advises what is already set: each advice path is run and its flags parsed by the
command's own parser."""

from __future__ import annotations

import re

import pytest

from budgets import Plan, advice, compute
from budgets.cli import parser as budget_parser
from budgets.plan import PLAN_FIELDS
from grpolab.config.settings import FLAGS, lab_settings
from grpolab.lab.session import parser as lab_parser

from suite import LAB_DIR

COMMANDS = {
    "python -m budgets": (budget_parser, set(PLAN_FIELDS)),
    "labs/*/train.py": (lambda: lab_parser(""), set(FLAGS)),
}
# One change as advice renders it: `set --flag value`, `lower --flag (now 8)`, `lower --flag (now 0.99) to <= 0.93`.
CHANGE = re.compile(
    r"\b(set|lower|raise) (--[a-z0-9-]+)(?: (?!\(|or\b)([^\s(]+))?(?: \(now ([^)]*)\))?(?: to [<>]= ([^\s:]+))?"
)


def assert_flags_parse(text: str, make_parser) -> int:
    """Parse every change the advice names with the command's parser; returns how many it named."""
    ap = make_parser()
    named = 0
    for _verb, flag, value, now, bound in CHANGE.findall(text):
        argv = [flag, value or bound or now or "1"]
        try:
            ap.parse_args(argv)
        except SystemExit:
            pytest.fail(f"advice names {' '.join(argv)}, which the command does not accept: {text}")
        named += 1
    assert named == len(re.findall(r"--[a-z0-9-]+", text)), text  # no flag outside a change
    return named


def lab_values() -> dict:
    return compute(lab_settings(LAB_DIR, "gpu").plan()).inputs


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("line", sorted(advice.BY_LINE))
def test_each_lines_advice_names_flags_the_command_accepts(command, line):
    make_parser, accepts = COMMANDS[command]
    text = advice.for_line(line, lab_values(), accepts)
    assert "\n" not in text
    assert_flags_parse(text, make_parser)


def test_advice_never_suggests_what_is_already_set():
    values = lab_values()  # the lab already uses unsloth checkpointing and chunked logits
    text = advice.for_line("train_activations", values, set(PLAN_FIELDS))
    assert "--use-gradient-checkpointing" not in text and "--per-device-train-batch-size (now 8)" in text
    assert "--chunked-logits" not in advice.for_line("logits", values, set(PLAN_FIELDS))
    values = {**values, "use_gradient_checkpointing": "false"}
    assert "set --use-gradient-checkpointing unsloth" in advice.for_line(
        "train_activations", values, set(PLAN_FIELDS)
    )


def test_advice_the_lab_cannot_follow_is_left_out():
    # The lab has no --trainer-sharding (one card): the budget CLI's advice names it, the lab's does not.
    values = {**lab_values(), "load_in_4bit": True}
    assert "--trainer-sharding" in advice.for_line("base_weights", values, set(PLAN_FIELDS))
    assert "--trainer-sharding" not in advice.for_line("base_weights", values, set(FLAGS))


PROBLEM_PLANS = {
    "peak": Plan(
        model="qwen3-8b", gpu="t4", load_in_4bit=False, max_completion_length=4096, max_prompt_length=512
    ),
    "vllm_refuses": Plan(
        model="qwen3-1.7b", gpu="rtx-4090", layout="colocate", load_in_4bit=False, gpu_memory_utilization=0.95
    ),
    "no_kv_cache": Plan(model="qwen3-8b", gpu="t4", gpu_memory_utilization=0.2),
    "kv_too_small": Plan(
        model="qwen3-4b", gpu="rtx-5080", gpu_memory_utilization=0.2, max_completion_length=3840
    ),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", PROBLEM_PLANS)
def test_every_problem_the_sheet_reports_names_accepted_flags(command, case):
    make_parser, accepts = COMMANDS[command]
    sheet = compute(PROBLEM_PLANS[case])
    assert not sheet.fits, case
    for problem in sheet.problems:
        assert_flags_parse(problem.text(sheet.inputs, accepts), make_parser)
    verdict = sheet.verdict(accepts)
    assert verdict.startswith("does not fit: ") and "\n" not in verdict


def test_every_change_names_a_plan_setting():
    """Advice is filtered by what a command accepts; a misspelt setting would vanish silently."""
    changes = [c for cs in advice.BY_LINE.values() for c in cs]
    changes += [c for plan in PROBLEM_PLANS.values() for p in compute(plan).problems for c in p.changes]
    assert changes
    for change in changes:
        assert change.setting in PLAN_FIELDS, change
