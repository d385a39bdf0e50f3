"""A sweep: one chapter run per cell of a grid, each in a fresh process, nested under one MLflow run.

Sizing comes first. Every cell's budget sheet is computed on the card the cells will run on before
any of them starts: a cell the sheet refuses is not started (its binding line is logged on the
sweep's run, never as an empty FAILED child), and the first cell past the largest that fits can be
run anyway (`run_refused`) to record how it runs out of memory.

Each cell is the chapter's own train.py in a process of its own (`train.py cell --num-generations 8
--per-device-train-batch-size 32 --max-completion-length 64 --parent-run-id <sweep>`), so its peak
is its own: the probe reads the process's resident set (CPU) or its device memory (GPU), which a
previous cell in the same process would have left high. The harness opens the cell's run as a child
of the sweep's (MLflow's tag `mlflow.parentRunId`) and logs its budget and measured lines under
chapter 1's names. The sweep reads them back, puts the grid side by side (a table, a chart, the
verdict: how far the sheet was off, at worst and on average, and on which line) and logs that on
its own run.

The sweep's process never creates a CUDA context (it would sit on the card under every cell): the
card is read through NVML alone (grpolab.device). Nothing here imports Unsloth, TRL or transformers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from budgets import BudgetError, compute, get_card
from budgets.cards import card_for_device
from budgets.units import GIB, human_bytes
from budgets.vocabulary import OneLineErrorParser
from grpolab.settings import (
    FLAGS,
    LabSettingsError,
    add_flags,
    check,
    flag,
    flag_text,
    lab_settings,
    overrides_from,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
KNOBS = ("prompts_per_step", "num_generations", "max_completion_length")
# The settings a cell sets itself: the sweep takes them as grids (--grid-num-generations 4,8,16).
CELL_SETTINGS = ("num_generations", "per_device_train_batch_size", "max_completion_length")
WALK_LIMIT = 4  # past the grid, the group is doubled at most this many times looking for the edge
VLLM_BLOCK = 16  # tokens per vLLM KV block (budgets/engine.py)
EXIT_BAD_INPUT, EXIT_CELL_FAILED = 2, 1


def load_chapter(name: str):
    """labs/<name>/train.py as a module (chapter folders have hyphens): another chapter's lesson."""
    path = REPO_ROOT / "labs" / name / "train.py"
    spec = importlib.util.spec_from_file_location(f"{name.replace('-', '_')}_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the grid --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    """The values each knob takes; the sweep runs every combination."""

    prompts_per_step: tuple[int, ...]
    num_generations: tuple[int, ...]
    max_completion_length: tuple[int, ...]

    def cells(self) -> list[Cell]:
        return [
            Cell(p, g, c)
            for p in self.prompts_per_step
            for g in self.num_generations
            for c in self.max_completion_length
        ]


@dataclass(frozen=True)
class Cell:
    """One GRPO step's shape: prompts per step x completions per prompt x completion length."""

    prompts_per_step: int
    num_generations: int
    max_completion_length: int

    @property
    def name(self) -> str:
        return f"{self.prompts_per_step}x{self.num_generations}x{self.max_completion_length}"

    def settings(self) -> dict[str, int]:
        """The cell as lab settings: the batch holds whole groups, one optimizer step per batch."""
        return {
            "num_generations": self.num_generations,
            "per_device_train_batch_size": self.prompts_per_step * self.num_generations,
            "max_completion_length": self.max_completion_length,
        }

    def flags(self) -> list[str]:
        return [word for name, value in self.settings().items() for word in (flag(name), str(value))]

    def doubled(self) -> Cell:
        return replace(self, num_generations=2 * self.num_generations)


# --- sizing: the sheet of every cell, before any of them runs ---------------------------------------
@dataclass
class Host:
    """Where the cells run: the card the sheets are computed on, and how it was chosen."""

    profile: str
    card: Any = None  # a budgets Card; None: the settings' own `gpu`
    other_processes_gib: float = 0.0
    note: str = ""
    memory_cap_gib: float | None = None  # the cap a refused cell runs under when it runs anyway


@dataclass
class Planned:
    cell: Cell
    settings: Any
    sheet: Any
    where: str = "grid"  # "grid", or "past the grid" (the walk to the edge)

    @property
    def fits(self) -> bool:
        return self.sheet.fits

    @property
    def binding(self) -> str | None:
        """The line the sheet blames when the cell does not fit."""
        return self.sheet.problems[0].name if self.sheet.problems else None

    def summary(self) -> str:
        gib = self.sheet.total_bytes / GIB, self.sheet.capacity_bytes / GIB
        if self.fits:
            return f"{self.cell.name:<12} fits     peak {gib[0]:6.2f} of {gib[1]:.2f} GiB ({self.where})"
        return f"{self.cell.name:<12} REFUSED  {self.sheet.verdict(accepts=FLAGS).removeprefix('does not fit: ')}"


def plan_cell(
    lab_dir: Path, host: Host, overrides: dict[str, Any], cell: Cell, where: str = "grid"
) -> Planned:
    settings = lab_settings(lab_dir, host.profile, {**overrides, **cell.settings()})
    check(settings)  # a cell that cannot work at all (a completion longer than the sequence) is bad input
    plan = settings.plan()
    if host.card is not None:
        plan = plan.with_(gpu=host.card, other_processes_gib=host.other_processes_gib)
    return Planned(cell, settings, compute(plan), where)


def plan_sweep(
    lab_dir: Path, host: Host, overrides: dict[str, Any], grid: Grid
) -> tuple[list[Planned], Planned | None]:
    """Every cell's sheet, and the edge: the first cell past the largest that fits.

    When the grid has refused cells the edge is the refused one the sheet misses by least. When all
    fit, the group of the grid's largest cell is doubled until the sheet refuses (at most WALK_LIMIT
    times); the cells found on the way still fit and run too ("past the grid")."""
    planned = [plan_cell(lab_dir, host, overrides, cell) for cell in grid.cells()]
    refused = [p for p in planned if not p.fits]
    if refused:
        return planned, min(refused, key=lambda p: p.sheet.total_bytes)
    fitting = max(planned, key=lambda p: p.sheet.total_bytes).cell
    for _ in range(WALK_LIMIT):
        fitting = fitting.doubled()
        try:
            nxt = plan_cell(lab_dir, host, overrides, fitting, "past the grid")
        except (LabSettingsError, BudgetError):
            return planned, None
        planned.append(nxt)
        if not nxt.fits:
            return planned, nxt
    return planned, None


def cpu_host(lab_dir: Path, overrides: dict[str, Any], cap_gib: float) -> Host:
    """A small host for the CPU sweep: what the sheet says the process holds once loaded (the start
    phase: runtime and weights), the kernel caches it keeps for a long run, plus `cap_gib` for what the
    knobs move. The real host has tens of GiB: against it, no cell of the tiny model is ever refused."""
    sheet = compute(lab_settings(lab_dir, "cpu", overrides).plan())
    caches = sheet.line("host_shape_caches")
    held = sheet.phases["start"] + (caches.bytes if caches else 0)
    card = replace(
        get_card("cpu"),
        name="cpu-capped",
        label=f"this CPU host, capped: {held / GIB:.2f} GiB held + {cap_gib:g} GiB for the step",
        memory_bytes=held + int(cap_gib * GIB),
        note="the sweep's own host: the start phase + host_shape_caches + --memory-cap-gib",
    )
    return Host("cpu", card, 0.0, card.label, cap_gib)


def find_host(lab_dir: Path, profile: str, overrides: dict[str, Any], cap_gib: float) -> Host:
    """The card every cell's sheet is computed on, as the harness's `prepare` picks it for a run (with
    what other processes hold on it, read through NVML: detect() creates no CUDA context, so nothing
    of this process sits on the card under the cells); on a CPU, the sweep's capped host (`cap_gib`)."""
    from grpolab.device import DeviceError, detect, resolve_other_processes

    if profile in ("auto", "gpu"):
        try:
            found = detect()
        except DeviceError as err:
            raise LabSettingsError(str(err)) from None
        if found.on_gpu:
            given = lab_settings(lab_dir, "gpu", overrides).other_processes_gib
            given_by = "--other-processes-gib" if "other_processes_gib" in overrides else "lab.toml"
            other_gib, other_note = resolve_other_processes(found, given, given_by)
            print(other_note, flush=True)
            if "gpu" in overrides:
                card = get_card(overrides["gpu"])
                return Host("gpu", card, other_gib, f"{card.name} (--gpu)")
            card, note = card_for_device(found.name, found.total_bytes)
            return Host("gpu", card, other_gib, note)
        if profile == "gpu":
            raise LabSettingsError(
                "--profile gpu needs a CUDA GPU and torch sees none: run on a machine with an NVIDIA GPU, or "
                "drop --profile to sweep the CPU stand-in"
            )
    if cap_gib <= 0:
        raise LabSettingsError(f"memory_cap_gib: the CPU sweep needs a positive cap, got {cap_gib}")
    return cpu_host(lab_dir, overrides, cap_gib)


# --- running a cell --------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What became of one planned cell."""

    planned: Planned
    status: str  # ran, refused, ran anyway, refused by its own sheet, failed
    exit_code: int | None = None
    run_id: str | None = None
    run_status: str | None = None
    last_line: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


def run_cell(
    lab_dir: Path, planned: Planned, parent_run_id: str, forward: list[str], extra: Sequence[str] = ()
) -> tuple[int, str]:
    """The chapter's `train.py cell ...` in a fresh process, its output passed through; returns the
    exit code and its last line (the one-line refusal or out-of-memory message, when there is one)."""
    command = [
        sys.executable,
        str(lab_dir / "train.py"),
        "cell",
        "--profile",
        planned.settings.profile,
        *planned.cell.flags(),
        *forward,
        *extra,
        "--parent-run-id",
        parent_run_id,
    ]
    print(f"\n=== cell {planned.cell.name}: {' '.join(command[2:])}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    tail: deque[str] = deque(maxlen=20)
    try:
        for line in process.stdout:
            sys.stdout.write(line)
            if line.strip():
                tail.append(line.strip())
        code = process.wait()
    except KeyboardInterrupt as stop:  # Ctrl-C reaches the cell too; SIGTERM/SIGHUP are passed on
        process.send_signal(getattr(stop, "signum", 2))
        process.wait(timeout=120)
        raise
    errors = [line for line in tail if line.startswith("error:")]
    return code, (errors[-1] if errors else (tail[-1] if tail else ""))


def read_cell(client, run, planned: Planned) -> dict[str, Any]:
    """A cell's figures from its MLflow run: the total and every line, budget beside measured; the
    rollouts vLLM held against the sheet's count; generation time per step against the sheet's."""
    import mlflow

    m = run.data.metrics
    try:
        sheet = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/budget/sheet.json")
    except Exception:  # a run that died before logging its sheet: the sweep's own sheet of the cell
        sheet = planned.sheet.to_dict()
    lines = {}
    for line in sheet["lines"]:
        name = line["name"]
        if f"{name}/measured" in m:
            lines[name] = {
                "budget_gib": line["bytes"] / GIB,
                "measured_gib": m[f"{name}/measured"],
                "diff_gib": m.get(f"{name}/diff", m[f"{name}/measured"] - line["bytes"] / GIB),
                "rel_error": m.get(f"{name}/rel_error"),
            }
    vllm = sheet.get("vllm") or {}
    seconds = [
        p.value
        for p in sorted(
            client.get_metric_history(run.info.run_id, "perf/generation_seconds"), key=lambda p: p.step
        )
    ]
    steady = seconds[1:] or seconds  # the first generation also compiles and warms caches
    measured_rollouts = None
    if "kv_cache/measured" in m and sheet.get("kv_cache_bytes_per_token"):
        inputs = sheet["inputs"]
        tokens = m["kv_cache/measured"] * GIB / sheet["kv_cache_bytes_per_token"]
        per_rollout = math.ceil((inputs["max_prompt_length"] + inputs["max_completion_length"]) / VLLM_BLOCK)
        measured_rollouts = round(tokens) // VLLM_BLOCK // per_rollout
    load_peak = m.get("memory/phase/load/process_peak_gib")
    return {
        "budget_gib": sheet["total_bytes"] / GIB,
        "capacity_gib": sheet["capacity_bytes"] / GIB,
        "measured_gib": m.get("total/measured", m.get("oom/peak_gib")),
        "rel_error": m.get("total/rel_error"),
        "unattributed_gib": m.get("total/unattributed"),
        "growth_after_load_gib": (m["total/measured"] - load_peak)
        if load_peak is not None and "total/measured" in m
        else None,
        "lines": lines,
        "vllm": bool(vllm),
        "rollouts_in_kv_sheet": vllm.get("rollouts_in_kv"),
        "max_concurrent_rollouts_sheet": sheet.get("max_concurrent_rollouts"),
        "rollouts_in_kv_measured": measured_rollouts,
        "generation_seconds_estimate": sheet.get("generation_seconds_estimate"),
        "generation_seconds_measured": statistics.median(steady) if steady else None,
        "oom_phase": run.data.tags.get("oom_phase"),
        "oom_line": run.data.tags.get("oom_line"),
        "oom_peak_gib": m.get("oom/peak_gib"),
    }


# --- the verdict, the table, the chart ----------------------------------------------------------------
def ran(outcomes: list[Outcome]) -> list[Outcome]:
    """The cells that ran within the budget and finished: the ones the verdict judges the sheet on."""
    return [o for o in outcomes if o.status == "ran" and o.figures.get("measured_gib") is not None]


def line_misses(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    """Per budget line, over the cells that ran: the mean difference and relative error, the worst cell."""
    by_line: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for o in ran(outcomes):
        for name, pair in o.figures["lines"].items():
            by_line.setdefault(name, []).append((o.planned.cell.name, pair))
    out = {}
    for name, pairs in by_line.items():
        worst_cell, worst = max(pairs, key=lambda cp: abs(cp[1]["diff_gib"]))
        rels = [p["rel_error"] for _, p in pairs if p["rel_error"] is not None]
        out[name] = {
            "cells": len(pairs),
            "mean_abs_diff_gib": statistics.fmean(abs(p["diff_gib"]) for _, p in pairs),
            "mean_diff_gib": statistics.fmean(p["diff_gib"] for _, p in pairs),
            "mean_rel_error": statistics.fmean(rels) if rels else 0.0,
            "worst_cell": worst_cell,
            "worst_diff_gib": worst["diff_gib"],
        }
    return out


def verdict(outcomes: list[Outcome], edge: Outcome | None) -> tuple[str, dict[str, float]]:
    """How far the sheet was off across the grid, at worst and on average, and on which line."""
    done = ran(outcomes)
    metrics: dict[str, float] = {"verdict/cells_ran": len(done)}
    if not done:
        text = "No cell ran to the end: the sheet could not be compared with anything."
    else:
        rels = [(o.figures["rel_error"], o.planned.cell.name) for o in done]
        worst_rel, worst_cell = max(rels, key=lambda rc: abs(rc[0]))
        mean_rel = statistics.fmean(r for r, _ in rels)
        mean_abs = statistics.fmean(abs(r) for r, _ in rels)
        misses = line_misses(outcomes)
        line = max(misses, key=lambda n: misses[n]["mean_abs_diff_gib"], default=None)
        metrics.update(
            {
                "verdict/total_rel_error_mean": mean_rel,
                "verdict/total_abs_rel_error_mean": mean_abs,
                "verdict/total_rel_error_worst": worst_rel,
            }
        )
        held = sum(o.figures["measured_gib"] <= o.figures["budget_gib"] for o in done)
        text = (
            f"Across {len(done)} cells the sheet's peak was off by {mean_rel:+.1%} on average "
            f"({mean_abs:.1%} in size) and {worst_rel:+.1%} at worst (cell {worst_cell}); "
            f"the budget held in {held} of {len(done)}."
        )
        if line is not None:
            miss = misses[line]
            metrics["verdict/line_mean_abs_diff_gib"] = miss["mean_abs_diff_gib"]
            text += (
                f" The line that missed most: {line}, by {human_bytes(miss['mean_diff_gib'] * GIB, sign=True)} on "
                f"average ({miss['mean_rel_error']:+.1%}; at worst {human_bytes(miss['worst_diff_gib'] * GIB, sign=True)} "
                f"in cell {miss['worst_cell']})."
            )
    if edge is not None:
        text += f" {edge_sentence(edge)}"
    else:
        text += f" No cell within {WALK_LIMIT} doublings of the group past the grid is refused on this card."
    return text, metrics


def edge_sentence(edge: Outcome) -> str:
    p = edge.planned
    text = f"The sheet refuses cell {p.cell.name} ({p.binding}: {human_bytes(p.sheet.total_bytes)} > {human_bytes(p.sheet.capacity_bytes)})"
    f = edge.figures
    if edge.status == "refused":
        return text + "; not run (--run-refused runs it anyway)."
    if edge.run_status == "FAILED" and f.get("oom_phase"):
        return (
            text
            + f"; run anyway it ran out of memory during {f['oom_phase']} at {f['oom_peak_gib']:.2f} GiB "
            f"(line blamed: {f['oom_line']})."
        )
    if edge.run_status == "FINISHED":
        return (
            text
            + f"; run anyway it finished at a peak of {f['measured_gib']:.2f} GiB: the sheet was conservative there."
        )
    return text + f"; run anyway it ended {edge.run_status or 'without a run'}: {edge.last_line}"


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


def table(outcomes: list[Outcome], host: Host, text: str) -> str:
    """Markdown: one row per cell (budget vs measured peak, the line that missed most, vLLM's rollouts,
    generation time), then one row per line across the cells."""
    on_gpu = host.profile == "gpu"
    rows = [
        text,
        "",
        f"Cells: prompts per step x completions per prompt x completion tokens. Card: {host.note}.",
        ""
        if on_gpu
        else "CPU profile: the tiny random Qwen3, not Qwen3-4B; its numbers are the tiny model's.",
        "",
        "| cell | status | budget peak (GiB) | measured peak (GiB) | off by | line that missed most | "
        + ("" if on_gpu else f"step after loading (GiB): sheet / measured, cap {host.memory_cap_gib:g} | ")
        + "rollouts in KV: sheet / vLLM | generation s/step: sheet / measured |",
        "|---|---|---:|---:|---:|---|" + ("" if on_gpu else "---|") + "---|---|",
    ]
    for o in outcomes:
        p, f = o.planned, o.figures
        budget = p.sheet.total_bytes / GIB
        measured = f.get("measured_gib")
        off = f"{f['rel_error']:+.1%}" if f.get("rel_error") is not None else ""
        worst = ""
        if f.get("lines"):
            name, pair = max(f["lines"].items(), key=lambda kv: abs(kv[1]["diff_gib"]))
            worst = f"{name} ({human_bytes(pair['diff_gib'] * GIB, sign=True)})"
        if p.sheet.metrics.get("vllm"):
            held = f.get("rollouts_in_kv_measured")
            rollouts = (
                f"{p.sheet.metrics['vllm']['rollouts_in_kv']} / {held if held is not None else 'not read'}"
            )
        else:
            rollouts = "no vLLM (CPU: transformers' generate)" if not on_gpu else "no vLLM"
        estimate = p.sheet.metrics.get("generation_seconds_estimate")
        gen = f.get("generation_seconds_measured")
        generation = f"{estimate:.3g} / {gen:.3g}" if gen is not None else f"{estimate:.3g} / not run"
        step = ""
        if not on_gpu:
            grew = f.get("growth_after_load_gib")
            step = f"{step_budget_gib(p.sheet):.3f} / {_gib(grew) or 'not measured'} | "
        rows.append(
            f"| {p.cell.name} | {status_text(o)} | {budget:.2f} | {_gib(measured)} | {off} | {worst} | "
            f"{step}{rollouts} | {generation} |"
        )
    misses = line_misses(outcomes)
    if misses:
        rows += [
            "",
            "Per line, over the cells that ran (measured - budget):",
            "",
            "| line | cells | mean diff | mean rel. error | worst cell | worst diff |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for name, miss in sorted(misses.items(), key=lambda kv: -kv[1]["mean_abs_diff_gib"]):
            rows.append(
                f"| {name} | {miss['cells']} | {human_bytes(miss['mean_diff_gib'] * GIB, sign=True)} | "
                f"{miss['mean_rel_error']:+.1%} | {miss['worst_cell']} | {human_bytes(miss['worst_diff_gib'] * GIB, sign=True)} |"
            )
    if not on_gpu:
        rows += [
            "",
            "No vLLM on a CPU: there is no KV cache to read, and the sheet's generation estimate is a memory-"
            "bandwidth roofline (50 GB/s nominal) that a tiny model's decoding, bound by per-token overheads, "
            "does not approach.",
        ]
    return "\n".join(rows) + "\n"


def step_budget_gib(sheet) -> float:
    """What the sheet says a step adds once the model is loaded, besides the kernel caches it keeps for
    a long run: the lines the knobs move (the CPU host's cap is held against this)."""
    phases, caches = sheet.phases, sheet.line("host_shape_caches")
    peak = max(phases["generate"], phases["train"])
    return (peak - phases["start"] - (caches.bytes if caches else 0)) / GIB


def status_text(o: Outcome) -> str:
    p = o.planned
    if o.status == "ran":
        return "ran" if p.where == "grid" else "ran (past the grid)"
    if o.status == "refused":
        return f"refused: {p.binding}"
    if o.status == "ran anyway":
        if o.figures.get("oom_phase"):
            return f"refused ({p.binding}); ran anyway: out of memory in {o.figures['oom_phase']}"
        return f"refused ({p.binding}); ran anyway: {o.run_status}"
    return f"{o.status}: {o.last_line}"


def chart(outcomes: list[Outcome], host: Host):
    """Peak memory against completion length (one colour per prompts x group; budget dashed, measured
    solid, refused cells as crosses, the card's capacity), and each line's miss per cell."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4.8))
    peaks, misses = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    series: dict[tuple[int, int], list[Outcome]] = {}
    for o in outcomes:
        series.setdefault((o.planned.cell.prompts_per_step, o.planned.cell.num_generations), []).append(o)
    colours = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
    for i, ((p, g), group) in enumerate(sorted(series.items())):
        colour = colours[i % len(colours)]
        group = sorted(group, key=lambda o: o.planned.cell.max_completion_length)
        x = [o.planned.cell.max_completion_length for o in group]
        label = f"{p} prompt(s) x {g}"
        peaks.plot(x, [o.planned.sheet.total_bytes / GIB for o in group], "--o", color=colour, alpha=0.6)
        done = [o for o in group if o.figures.get("measured_gib") is not None and o.status == "ran"]
        if done:
            peaks.plot(
                [o.planned.cell.max_completion_length for o in done],
                [o.figures["measured_gib"] for o in done],
                "-s",
                color=colour,
                label=f"{label}: measured (budget dashed)",
            )
        else:
            peaks.plot([], [], "--o", color=colour, label=f"{label}: budget")
        for o in group:
            if o.status != "ran":
                peaks.plot(
                    o.planned.cell.max_completion_length,
                    o.planned.sheet.total_bytes / GIB,
                    "x",
                    color=colour,
                    ms=12,
                )
                peaks.annotate(
                    f"refused: {o.planned.binding}",
                    (o.planned.cell.max_completion_length, o.planned.sheet.total_bytes / GIB),
                    textcoords="offset points",
                    xytext=(-10, 8),
                    fontsize=8,
                    ha="right",
                )
    capacity = outcomes[0].planned.sheet.capacity_bytes / GIB if outcomes else 0
    peaks.axhline(capacity, color="grey", linestyle=":", label=f"capacity {capacity:.2f} GiB")
    peaks.set_xlabel("max_completion_length (tokens)")
    peaks.set_ylabel("GiB")
    peaks.set_title("Peak per cell: budget (dashed) vs measured (solid)")
    peaks.legend(fontsize=8)

    lines = line_misses(outcomes)
    names = sorted(lines, key=lambda n: -lines[n]["mean_abs_diff_gib"])[:8]
    cells = [o for o in ran(outcomes)]
    width = 0.8 / max(len(cells), 1)
    for j, o in enumerate(cells):
        values = [o.figures["lines"].get(n, {}).get("diff_gib", 0.0) * 1024 for n in names]
        misses.bar([i + j * width for i in range(len(names))], values, width=width, label=o.planned.cell.name)
    misses.axhline(0, color="black", linewidth=0.8)
    misses.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right")
    misses.set_ylabel("measured - budget (MiB)")
    misses.set_title("Each line's miss, per cell")
    if cells:
        misses.legend(fontsize=8, title="cell")
    fig.suptitle(
        f"Budget vs measured across the grid ({host.profile}: {host.note})"
        + ("" if host.profile == "gpu" else "; the tiny model's numbers"),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# --- the sweep ---------------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, got {text!r}")
    return values


def parser(description: str, grids: dict[str, Grid], cpu_cap_gib: float) -> argparse.ArgumentParser:
    ap = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--profile",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: the real grid (fails at once without CUDA); cpu: the tiny stand-in's grid; auto: gpu if present",
    )
    sweep = ap.add_argument_group("the sweep")
    for knob in KNOBS:
        shown = {profile: ",".join(map(str, getattr(g, knob))) for profile, g in grids.items()}
        sweep.add_argument(
            f"--grid-{knob.replace('_', '-')}",
            type=_ints,
            metavar="N,N,...",
            help=f"the {knob} values to sweep (gpu: {shown.get('gpu')}; cpu: {shown.get('cpu')})",
        )
    sweep.add_argument(
        "--run-refused",
        action="store_true",
        help="also run the first cell past the largest that fits, which the sheet refuses, to record how it "
        "runs out of memory (a FAILED cell with the peak, the phase and the line to blame)",
    )
    sweep.add_argument(
        "--memory-cap-gib",
        type=float,
        help=f"CPU: the sweep's small host lets a cell's step add this much once the model is loaded (default "
        f"{cpu_cap_gib:g}); the refused cell runs anyway under it. GPU: the card is the limit; if given, the "
        "refused cell runs anyway under this cap as well",
    )
    sweep.add_argument(
        "--output-dir", type=Path, default=REPO_ROOT / "outputs", help="each cell's adapter, as a lab run's"
    )
    add_flags(ap)  # every other setting of lab.toml, passed on to every cell
    return ap


def main(
    lab_dir: Path, grids: dict[str, Grid], argv: list[str] | None, doc: str = "", cpu_cap_gib: float = 0.5
) -> int:
    """Plan every cell, run those that fit (and, with --run-refused, the edge), log the grid."""
    args = parser(doc.split("\n\n")[0] if doc else "", grids, cpu_cap_gib).parse_args(argv)
    overrides = overrides_from(args)
    given = sorted(set(overrides) & set(CELL_SETTINGS))
    if given:
        grid_flag = {"per_device_train_batch_size": "--grid-prompts-per-step"}
        return _refuse(
            f"{given[0]}: the sweep sets it per cell; pass "
            f"{grid_flag.get(given[0], '--grid-' + given[0].replace('_', '-'))} with the values to sweep"
        )
    try:
        cap = cpu_cap_gib if args.memory_cap_gib is None else args.memory_cap_gib
        host = find_host(lab_dir, args.profile, overrides, cap)
        if host.profile == "gpu":
            host.memory_cap_gib = args.memory_cap_gib  # the card is the limit; a cap only if asked for
        base = grids[host.profile]
        grid = Grid(*(getattr(args, f"grid_{knob}") or getattr(base, knob) for knob in KNOBS))
        planned, edge = plan_sweep(lab_dir, host, overrides, grid)
    except (LabSettingsError, BudgetError) as err:
        return _refuse(str(err))
    settings = planned[0].settings
    announce(host, settings, grid, planned, edge)
    return _sweep(lab_dir, args, host, grid, planned, edge, overrides)


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def announce(host: Host, settings, grid: Grid, planned: list[Planned], edge: Planned | None) -> None:
    if host.profile == "cpu":
        print(
            "\n=== No CUDA GPU: sweeping the CPU stand-in ===\n"
            f"  model: {settings.model} (a tiny random-weight Qwen3, not Qwen3-4B): every number below is the tiny "
            "model's.\n"
            "  No vLLM on a CPU: no KV-cache rollouts to read; generation is transformers' generate.\n"
            f"  The host: {host.note} (the sweep's cap: the real machine would refuse nothing).\n",
            flush=True,
        )
    print(
        f"Sizing {len(planned)} cells (prompts x group x completion tokens) on {host.note}, before any runs:"
    )
    for p in planned:
        print("  " + p.summary())
    if edge is not None:
        print(f"\nThe edge: cell {edge.cell.name}, refused by its sheet:\n")
        print(edge.sheet.table(accepts=FLAGS))
    print(flush=True)


def _forwarded(output_dir: Path, overrides: dict[str, Any]) -> list[str]:
    """What every cell is given besides its own settings: the sweep's folder and the settings the
    sweep's command line changed."""
    words = ["--output-dir", str(output_dir)]
    for name, value in overrides.items():
        words += [flag(name), flag_text(value)]
    return words


def _sweep(lab_dir, args, host: Host, grid: Grid, planned, edge, overrides) -> int:
    import mlflow

    from grpolab import tracking

    settings = planned[0].settings
    tags = {
        "profile": host.profile,
        "chapter": settings.chapter,
        "model_id": settings.model,
        "run_kind": "sweep",
        "budget_card": host.note,
        "sweep.grid": json.dumps({k: list(getattr(grid, k)) for k in KNOBS}),
        "sweep.edge": edge.cell.name if edge is not None else "none",
    }
    outcomes: list[Outcome] = []
    with tracking.lab_run(settings.chapter, f"sweep-{tracking.run_name(host.profile)}", tags) as parent:
        client = tracking.client()
        # Every cell's adapter under the sweep's own folder: outputs/<chapter>/<sweep>/<chapter>/<cell run>.
        forward = _forwarded(args.output_dir / settings.chapter / parent.info.run_name, overrides)
        params = {k: v for k, v in settings.as_params().items() if k not in CELL_SETTINGS}
        params.update({f"grid.{k}": ",".join(map(str, getattr(grid, k))) for k in KNOBS})
        params["run_refused"] = str(args.run_refused).lower()
        if host.memory_cap_gib is not None:
            params["memory_cap_gib"] = str(host.memory_cap_gib)
        mlflow.log_params(params)
        mlflow.log_text("\n".join(p.summary() for p in planned) + "\n", "sweep/plan.txt")
        for p in planned:
            if not p.fits:
                mlflow.log_text(p.sheet.table(accepts=FLAGS), f"sweep/refused/{p.cell.name}.txt")
        seen: set[str] = set()
        for p in planned:
            is_edge = edge is not None and p is edge
            if not p.fits and not (is_edge and args.run_refused):
                outcomes.append(Outcome(p, "refused"))
                continue
            extra = []
            if not p.fits:  # the edge, run anyway
                extra = ["--ignore-budget"]
                if host.memory_cap_gib is not None:
                    extra += ["--memory-cap-gib", f"{host.memory_cap_gib:g}"]
            code, last = run_cell(lab_dir, p, parent.info.run_id, forward, extra)
            outcome = Outcome(p, "ran" if p.fits else "ran anyway", code, last_line=last)
            child = _new_child(client, parent, seen)
            if child is None:
                outcome.status = "refused by its own sheet" if code == EXIT_BAD_INPUT else "failed"
            else:
                outcome.run_id, outcome.run_status = child.info.run_id, child.info.status
                outcome.figures = read_cell(client, child, p)
                client.update_run(child.info.run_id, name=f"cell {p.cell.name}")
                client.set_tag(child.info.run_id, "sweep.cell", p.cell.name)
                client.set_tag(child.info.run_id, "sweep.status", status_text(outcome))
                if p.fits and child.info.status != "FINISHED":
                    outcome.status = "failed"
            outcomes.append(outcome)
        edge_outcome = next((o for o in outcomes if edge is not None and o.planned is edge), None)
        text, metrics = verdict(outcomes, edge_outcome)
        _log_sweep(outcomes, host, text, metrics, edge_outcome)
        print("\n" + table(outcomes, host, text))
        print(f"MLflow sweep run {parent.info.run_id} in {tracking.tracking_uri()} (its cells nest under it)")
        print(
            f"Open it: uv run mlflow ui --backend-store-uri {tracking.tracking_uri()}, then {tracking.run_url(parent)}"
        )
    failed = [o for o in outcomes if o.status in ("failed", "refused by its own sheet")]
    return EXIT_CELL_FAILED if failed else 0


def _new_child(client, parent, seen: set[str]):
    """The cell run that just ended: the one child of the sweep not seen before (cells run one at a time)."""
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        order_by=["attributes.start_time DESC"],
    )
    new = [run for run in children if run.info.run_id not in seen]
    if not new:
        return None
    seen.add(new[0].info.run_id)
    return new[0]


def _log_sweep(outcomes: list[Outcome], host: Host, text: str, metrics: dict[str, float], edge) -> None:
    import mlflow

    for step, o in enumerate(outcomes):
        values = {"sweep/total_budget_gib": o.planned.sheet.total_bytes / GIB}
        if o.status == "ran":
            values["sweep/total_measured_gib"] = o.figures["measured_gib"]
            values["sweep/total_rel_error"] = o.figures["rel_error"]
        mlflow.log_metrics(values, step=step)
    mlflow.log_metrics(
        {
            **metrics,
            "sweep/cells": len(outcomes),
            "sweep/cells_refused": sum(not o.planned.fits for o in outcomes),
        }
    )
    cells = [
        {
            **asdict(o.planned.cell),
            "name": o.planned.cell.name,
            "where": o.planned.where,
            "status": o.status,
            "status_text": status_text(o),
            "fits": o.planned.fits,
            "binding": o.planned.binding,
            "sheet_verdict": o.planned.sheet.verdict(accepts=FLAGS),
            "sheet_total_gib": o.planned.sheet.total_bytes / GIB,
            "sheet_capacity_gib": o.planned.sheet.capacity_bytes / GIB,
            "edge": edge is not None and o is edge,
            "exit_code": o.exit_code,
            "run_id": o.run_id,
            "run_status": o.run_status,
            "figures": o.figures,
        }
        for o in outcomes
    ]
    mlflow.log_dict(
        {"profile": host.profile, "card": host.note, "verdict": text, "cells": cells}, "sweep/cells.json"
    )
    mlflow.log_text(table(outcomes, host, text), "sweep/budget_vs_measured.md")
    mlflow.log_figure(chart(outcomes, host), "sweep/budget_vs_measured.png")
    refused = [o for o in outcomes if not o.planned.fits]
    mlflow.set_tags(
        {
            "sweep.refused": ", ".join(f"{o.planned.cell.name}: {o.planned.binding}" for o in refused)
            or "none",
            "mlflow.note.content": text,
        }
    )
