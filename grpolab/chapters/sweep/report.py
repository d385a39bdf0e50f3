"""The sweep's report: the verdict, the table and the chart, from what became of each cell.

Pure: it reads the cells' outcomes (their sheets, and the figures of the result file each cell's run
wrote, grpolab.memory.run_result) and returns text, numbers and a figure. No MLflow, no processes; the
sweep's loop logs what it returns.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from budgets.units import GIB, human_bytes
from grpolab.chapters.sweep.grid import KNOBS, WALK_LIMIT, Planned
from grpolab.chapters.sweep.host import Host
from grpolab.config.settings import FLAGS
from grpolab.memory.names import in_unit


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


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """A cell's figures from its run's result file: the total and every measured line, budget beside
    measured in GiB; the rollouts vLLM held against the sheet's count; generation time per step
    against the sheet's. A run that ran out of memory has its peak, and no comparison."""
    total = result["total"]
    measured, load = total["measured_bytes"], total["load_peak_bytes"]
    lines = {
        name: {
            "budget_gib": line["budget_bytes"] / GIB,
            "measured_gib": line["measured_bytes"] / GIB,
            "diff_gib": (line["measured_bytes"] - line["budget_bytes"]) / GIB,
            "rel_error": line["rel_error"],
        }
        for name, line in result["lines"].items()
        if line["measured_bytes"] is not None
    }
    seconds = result["generation_seconds"]
    steady = seconds[1:] or seconds  # the first generation also compiles and warms caches
    oom = result["oom"] or {}
    return {
        "budget_gib": total["budget_bytes"] / GIB,
        "capacity_gib": total["capacity_bytes"] / GIB,
        "measured_gib": _in_gib(measured),
        "rel_error": total["rel_error"],
        "unattributed_gib": _in_gib(total["unattributed_bytes"]),
        "growth_after_load_gib": (measured - load) / GIB
        if total["compared"] and load is not None and measured is not None
        else None,
        "lines": lines,
        "vllm": result["vllm"],
        "rollouts_in_kv_sheet": result["rollouts_in_kv_sheet"],
        "max_concurrent_rollouts_sheet": result["max_concurrent_rollouts_sheet"],
        "rollouts_in_kv_measured": result["rollouts_in_kv_measured"],
        "generation_seconds_estimate": result["generation_seconds_estimate"],
        "generation_seconds_measured": statistics.median(steady) if steady else None,
        "oom_phase": oom.get("phase"),
        "oom_line": oom.get("line"),
        "oom_peak_gib": _in_gib(oom.get("peak_bytes")),
    }


def _in_gib(value: int | None) -> float | None:
    return None if value is None else value / GIB


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
            mean, worst = one_unit([miss["mean_diff_gib"] * GIB, miss["worst_diff_gib"] * GIB], sign=True)
            text += (
                f" The line that missed most: {line}, by {mean} on average ({miss['mean_rel_error']:+.1%}; "
                f"at worst {worst} in cell {miss['worst_cell']})."
            )
    if edge is not None:
        text += f" {edge_sentence(edge)}"
    else:
        text += f" No cell within {WALK_LIMIT} doublings of the group past the grid is refused on this card."
    return text, metrics


def edge_sentence(edge: Outcome) -> str:
    p = edge.planned
    # One unit in the sentence: GiB, as the peaks below are written.
    total, capacity = (in_unit(n, "gib") for n in (p.sheet.total_bytes, p.sheet.capacity_bytes))
    text = f"The sheet refuses cell {p.cell.name} ({p.binding}: {total} > {capacity})"
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


def one_unit(values: list[float], sign: bool = False) -> list[str]:
    """Byte counts for one sentence, all in the unit of the largest: GiB from 1 GiB up, else MiB."""
    unit = "gib" if max(abs(v) for v in values) >= GIB else "mib"
    return [in_unit(v, unit, sign) for v in values]


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


# The knobs a cell sets, in the order the chart prefers them on its x axis, with their axis labels.
AXES = {
    "max_completion_length": "max_completion_length (tokens)",
    "num_generations": "num_generations (completions per prompt)",
    "prompts_per_step": "prompts per step",
}


def chart_axis(outcomes: list[Outcome]) -> str:
    """The knob the peaks are plotted against: the first of AXES that takes more than one value among
    the cells. A GPU grid varies the completion length (256, 512, 768); the CPU grid holds it at 32
    tokens and varies the group (8, 16, and the edge's 32), so its cells spread along the group."""
    for knob in AXES:
        if len({getattr(o.planned.cell, knob) for o in outcomes}) > 1:
            return knob
    return "max_completion_length"


def chart(outcomes: list[Outcome], host: Host):
    """Peak memory against the knob the grid varies (`chart_axis`: completion length on a GPU, the group
    on the CPU), one colour per setting of the other two; budget dashed, measured solid, refused cells as
    crosses, the card's capacity; and each line's miss per cell."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4.8))
    peaks, misses = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    knob = chart_axis(outcomes)
    others = [k for k in KNOBS if k != knob]
    series: dict[tuple[int, int], list[Outcome]] = {}
    for o in outcomes:
        series.setdefault(tuple(getattr(o.planned.cell, k) for k in others), []).append(o)
    colours = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
    for i, (key, group) in enumerate(sorted(series.items())):
        colour = colours[i % len(colours)]
        group = sorted(group, key=lambda o: getattr(o.planned.cell, knob))
        x = [getattr(o.planned.cell, knob) for o in group]
        label = series_label(dict(zip(others, key, strict=True)))
        peaks.plot(x, [o.planned.sheet.total_bytes / GIB for o in group], "--o", color=colour, alpha=0.6)
        done = [o for o in group if o.figures.get("measured_gib") is not None and o.status == "ran"]
        if done:
            peaks.plot(
                [getattr(o.planned.cell, knob) for o in done],
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
                    getattr(o.planned.cell, knob), o.planned.sheet.total_bytes / GIB, "x", color=colour, ms=12
                )
                peaks.annotate(
                    f"refused: {o.planned.binding}",
                    (getattr(o.planned.cell, knob), o.planned.sheet.total_bytes / GIB),
                    textcoords="offset points",
                    xytext=(-10, 8),
                    fontsize=8,
                    ha="right",
                )
    capacity = outcomes[0].planned.sheet.capacity_bytes / GIB if outcomes else 0
    peaks.axhline(capacity, color="grey", linestyle=":", label=f"capacity {capacity:.2f} GiB")
    peaks.set_xticks(sorted({getattr(o.planned.cell, knob) for o in outcomes}))  # each cell's value
    peaks.margins(x=0.08, y=0.15)  # room for the refused cell's note
    peaks.set_xlabel(AXES[knob])
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


def series_label(fixed: dict[str, int]) -> str:
    """A series by the knobs it holds fixed: `1 prompt(s) x 8`, `4 prompt(s) at 32 tokens`."""
    words = []
    if "prompts_per_step" in fixed:
        words.append(f"{fixed['prompts_per_step']} prompt(s)")
    if "num_generations" in fixed:
        words.append(f"x {fixed['num_generations']}" if words else f"groups of {fixed['num_generations']}")
    if "max_completion_length" in fixed:
        words.append(f"at {fixed['max_completion_length']} tokens")
    return " ".join(words)


def cells_record(outcomes: list[Outcome], host: Host, text: str, edge: Outcome | None) -> dict[str, Any]:
    """The grid as data (the sweep's sweep/cells.json): every cell, its sheet, its status, its figures."""
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
    return {"profile": host.profile, "card": host.note, "verdict": text, "cells": cells}
