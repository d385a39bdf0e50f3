"""The run's Overview in MLflow: its description, in Markdown, tells what the run found.

In order: the one-line verdict, the budget-vs-measured chart (an image of the run's own artifact,
which MLflow's Markdown renders from a relative `get-artifact` link), the table of the total and each
line (budget, measured, difference, how measured), the run doctor's findings, the held-out evaluation
before and after, and where the completions are. Nothing here talks to MLflow: the harness logs it
as the run's description (tag `mlflow.note.content`).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from budgets.units import human_bytes
from grpolab.comparison import HOW_MEASURED, Comparison

CHART = "memory/budget_vs_measured.png"
TABLE = "memory/budget_vs_measured.md"
HELD_OUT = "completions/held_out.json"


def chart_link(run_id: str, path: str = CHART) -> str:
    """Markdown that shows the run's artifact `path` as an image in its description."""
    return f"![Budget vs measured]({'get-artifact?path=' + quote(path, safe='')}&run_uuid={run_id})"


def line_table(c: Comparison) -> str:
    """The total first (the figure that decides whether the plan fits), then each line."""
    rows = [
        "| line | budget | measured | diff | how measured |",
        "|---|---:|---:|---:|---|",
        f"| **total (peak)** | {human_bytes(c.total_budget)} | {human_bytes(c.total_measured)} | "
        f"{human_bytes(c.total_measured - c.total_budget, sign=True)} | {HOW_MEASURED['total']} |",
    ]
    for name, budget in c.budget.items():
        measured, diff = (
            (human_bytes(c.measured[name]), human_bytes(c.diff(name), sign=True))
            if name in c.measured
            else ("not measured", "")
        )
        rows.append(
            f"| {name} | {human_bytes(budget)} | {measured} | {diff} | {HOW_MEASURED.get(name, '')} |"
        )
    return "\n".join(rows)


def held_out_table(evals: Mapping) -> str:
    """Base (before training) beside adapter (after), on the held-out prompts."""
    if not evals:
        return "Held-out evaluation: not run (`--eval-prompts 0`)."
    order = [w for w in ("base", "adapter") if w in evals]
    header = "| held-out | " + " | ".join(order) + " |"
    rows = [header, "|---|" + "---:|" * len(order)]
    rows.append("| accuracy | " + " | ".join(f"{evals[w].accuracy:.1%}" for w in order) + " |")
    rows.append("| format rate | " + " | ".join(f"{evals[w].format_rate:.1%}" for w in order) + " |")
    rows.append("| mean length (tokens) | " + " | ".join(f"{evals[w].mean_length:.1f}" for w in order) + " |")
    prompts = next(iter(evals.values())).prompts
    return "\n".join(rows) + f"\n\n{prompts} held-out prompts, one greedy completion each."


def description(
    run_id: str, c: Comparison, doctor: str, evals: Mapping, status: str = "FINISHED", chart: bool = True
) -> str:
    """The run's description: verdict, chart, table, doctor, held-out, where the completions are."""
    verdict = c.verdict() + ("" if status == "FINISHED" else f" (run ended {status}: figures so far)")
    # The verdict before the chart: MLflow 3.17 folds a description to its first 100 pixels until
    # "Show more" is clicked, and the sentence (the total's budget beside its measured peak) fits them.
    parts = [f"**{verdict}**"]
    parts += [chart_link(run_id)] if chart else []
    parts += [
        line_table(c),
        f"Full table with each line's formula: `{TABLE}`.",
        doctor,
        held_out_table(evals),
        "What the model wrote: the **Traces** tab, one trace per group of a logged step (its prompt, every "
        "completion with each reward and its advantage; each reward's group mean as an assessment, and a "
        "span per completion with its own); the held-out prompts answered by base and adapter side by "
        f"side: the trace tagged `kind = held-out` and `{HELD_OUT}`.",
    ]
    return "\n\n".join(p for p in parts if p)
