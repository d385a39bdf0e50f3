"""Before anything loads: the device, the settings, the sheet, the card it is checked against, the
rehearsal checkpoint, the prompts. Every refusal here is one line (LabSettingsError, BudgetError)
and leaves nothing written; nothing here imports Unsloth or touches CUDA (grpolab.model.cuda_env comes
after), except `prompts`, which runs once the process is set up.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from grpolab.config.settings import FLAGS, LabSettings, LabSettingsError, check, lab_settings, overrides_from
from grpolab.judging import task_check


def prepare(lab_dir: Path, args: argparse.Namespace, resume=None):
    """Device, settings and sheet, checked before anything loads; prints the sheet. A resumed run
    (`resume`: grpolab.lifecycle.resume.Resume) takes the settings it logged, on the profile it ran."""
    from budgets import compute
    from grpolab.memory.device import DeviceError, detect

    try:
        device = detect()
    except DeviceError as err:
        raise LabSettingsError(str(err)) from None
    if args.profile == "gpu" and not device.on_gpu:
        raise LabSettingsError(
            "--profile gpu needs a CUDA GPU and torch sees none: run on a machine with an NVIDIA GPU, or drop "
            "--profile to use the CPU stand-in"
        )
    profile = (
        "gpu"
        if args.profile == "auto" and device.on_gpu
        else ("cpu" if args.profile == "auto" else args.profile)
    )
    if resume is not None:
        profile = _resumed_profile(resume, args.profile, device.on_gpu)
    if profile == "cpu":  # before torch computes anything: the same bits on every machine
        from grpolab.config import numerics

        numerics.pin()
    if resume is not None:
        settings = resume.settings(lab_dir, overrides_from(args))
    else:
        settings = lab_settings(lab_dir, profile, overrides_from(args))
    check(settings)
    # The task before anything loads: a reward that raises, runs the completion or pays a non-answer.
    task_check.preflight(settings, getattr(args, "ignore_task_check", False))
    cannot: list[str] = []
    if args.rehearse:
        from grpolab.model.rehearsal import rehearsal_settings

        settings, cannot = rehearsal_settings(settings)
    plan, card_note, other_note = card_plan(settings, device, profile)
    if profile == "cpu" and not args.rehearse:  # first: it says whose sheet follows
        announce_cpu(settings)
    if other_note:
        print(other_note, flush=True)
    sheet = compute(plan)
    print(sheet.table(accepts=FLAGS), f"\nbudget card: {card_note}", flush=True)
    if not args.ignore_budget:
        sheet.require_fits(accepts=FLAGS)
    if args.rehearse:
        settings = rehearse(settings, cannot, args.rehearsal_dir or args.output_dir / "rehearsal")
    return device, settings, sheet, card_note


def _resumed_profile(resume, asked: str, on_gpu: bool) -> str:
    """The profile a run resumes on: the one it trained on, which this machine must be able to run."""
    if asked not in ("auto", resume.profile):
        raise LabSettingsError(
            f"resume: run {resume.run_id} trained on the {resume.profile} profile: drop --profile {asked}"
        )
    if resume.profile == "gpu" and not on_gpu:
        raise LabSettingsError(
            f"resume: run {resume.run_id} trained on a GPU and torch sees none here: resume it on a machine with "
            "an NVIDIA GPU"
        )
    return resume.profile


def card_plan(settings: LabSettings, device, profile: str):
    """The settings' budget Plan on the card the run is checked against, and how it was chosen: on a
    GPU the card the run is really on (unless --gpu names another), with what other processes hold
    on it (measured before this process touched CUDA, never below what the user gave), and the line
    that says which figure of other processes it took; else lab.toml's card."""
    from budgets import get_card
    from budgets.cards import card_for_device
    from grpolab.memory.device import resolve_other_processes

    plan = settings.plan()
    card_note, other_note = f"{settings.gpu} (lab.toml)", ""
    if device.on_gpu and "gpu" not in settings.overridden:
        card, card_note = card_for_device(device.name, device.total_bytes)
        given_by = "--other-processes-gib" if "other_processes_gib" in settings.overridden else "lab.toml"
        other_gib, other_note = resolve_other_processes(device, settings.other_processes_gib, given_by)
        plan = plan.with_(gpu=card, other_processes_gib=other_gib)
    elif profile == "gpu" and "gpu" in settings.overridden:
        card_note = f"{get_card(settings.gpu).name} (--gpu)"
    return plan, card_note, other_note


def budget_settings(lab_dir: Path, args: argparse.Namespace) -> tuple[LabSettings, Any]:
    """`--budget-only`'s settings, checked, and the device: the gpu profile's unless --profile cpu."""
    from grpolab.memory.device import Device, DeviceError, detect

    try:
        device = detect()
    except DeviceError:
        device = Device("cpu")  # a card this torch cannot use: the sheet on lab.toml's card
    profile = "cpu" if args.profile == "cpu" else "gpu"
    settings = lab_settings(lab_dir, profile, overrides_from(args))
    check(settings)
    return settings, device


def budget_only(lab_dir: Path, args: argparse.Namespace) -> str:
    """`--budget-only`: the sheet this chapter's run would be checked against, with what --headroom and
    --suggest-util add, as a table or JSON. The gpu profile's unless --profile cpu: the point is to
    see the real run's cost before there is a card to run it on."""
    settings, device = budget_settings(lab_dir, args)
    return budget_text(settings, device, args)


def budget_text(settings: LabSettings, device, args: argparse.Namespace) -> str:
    """`--budget-only`'s sheet of `settings` on the card the run is checked against (budget_settings')."""
    from budgets import compute
    from budgets.cli import extras, render

    plan, card_note, other_note = card_plan(settings, device, settings.profile)
    text = render(compute(plan), extras(plan, args.headroom, args.suggest_util), args.json, accepts=FLAGS)
    if args.json:
        return text
    return "\n".join(line for line in (other_note, text, f"budget card: {card_note}") if line)


def rehearse(s: LabSettings, cannot: list[str], root: Path) -> LabSettings:
    """Build (or reuse) the rehearsal checkpoint of the lab's model and point the settings at it."""
    from grpolab.model import rehearsal

    print(
        f"\n=== Rehearsal: {s.model} with random weights, built offline, {s.max_steps} steps ===\n"
        "  The shapes, the loader, the trainer and every budget line are the real run's; the rewards mean\n"
        "  nothing (random weights), and every completion runs to max_completion_length (the worst case).",
        flush=True,
    )
    for line in cannot:
        print(f"  {line}", flush=True)
    path, source = rehearsal.build(s.model, root)
    print(f"  shape: {source}\n  checkpoint: {path}\n", flush=True)
    return s.replace(model=str(path))


def announce_cpu(s: LabSettings) -> None:
    """The CPU banner, before the sheet it explains. It says the backend and the precision, so
    Unsloth's own lines about them, untrue here ("bfloat16 = True", "this GPU"), are dropped."""
    from grpolab.config import numerics
    from grpolab.lab import console

    print(
        "=== No CUDA GPU found: running the CPU stand-in of this lab ===\n"
        f"  model:   {s.model} (a tiny Qwen3 built offline: random weights, briefly warm-started; not Qwen3-4B)\n"
        f"  backend: {s.backend} (Unsloth's CPU backend: bitsandbytes' own 4-bit CPU kernels, generation by "
        "transformers, no vLLM)\n"
        f"  precision: {s.dtype} (the dtype the stand-in loads and trains in)\n"
        f"  arithmetic: {numerics.current().describe()}\n"
        "  The loop, the rewards, the tracking and the budget are the real ones;\n"
        "  the numbers (reward, memory, speed) are the tiny model's, not Qwen3-4B's.\n",
        flush=True,
    )
    console.said_by_the_lab(console.UNSLOTH_CPU_LINES)


def prompts(s: LabSettings):
    """The task's prompts, keeping those that leave room for a full completion.

    TRL 1.x has no max_prompt_length: a prompt is bounded by dropping the ones that do not fit in
    max_seq_length - max_completion_length before training. Unsloth is imported first: it patches
    transformers and TRL, which must not be imported before it.
    """
    from grpolab.model import policy

    # isort: split
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy.resolve_model_path(s.model, s.task, s.task_config))
    dataset = s.get_task().build_dataset(s.num_prompts, s.seed)

    def prompt_tokens(row: dict) -> dict:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        return {"prompt_tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"])}

    dataset = dataset.map(prompt_tokens)
    kept = dataset.filter(lambda row: row["prompt_tokens"] <= s.prompt_room)
    if len(kept) == 0:
        raise LabSettingsError(
            f"max_completion_length: every prompt is longer than max_seq_length - max_completion_length = "
            f"{s.prompt_room} tokens (longest: {max(dataset['prompt_tokens'])}): lower "
            "--max-completion-length or raise --max-seq-length"
        )
    return kept
