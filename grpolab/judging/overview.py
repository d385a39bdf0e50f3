"""The run's Overview in MLflow: its description, in Markdown, tells what the run found.

In order: the one-line verdict, the Overview's figure (each reward's mean per step beside the
budget-vs-measured chart: an image of the run's own artifact, which MLflow's Markdown renders from a
relative `get-artifact` link), the table of the total and each line (budget, measured, difference,
how measured), the run doctor's findings, the held-out evaluation before and after, and where the
completions are. Every memory figure is in the run's unit (`memory_unit`: MiB on the CPU, GiB on a
GPU). The builders talk to no one; `log` writes it all to the active MLflow run: the measured lines
beside the budget's, the description as the tag `mlflow.note.content`, the figure as `FIGURE`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from grpolab.judging.doctor import REWARD_METRIC, step_rows
from grpolab.lifecycle import tracking
from grpolab.lifecycle.tracking import glance
from grpolab.memory import comparison
from grpolab.memory.comparison import HOW_MEASURED, Comparison
from grpolab.memory.names import MEMORY_UNITS, memory_key

CHART = "memory/budget_vs_measured.png"
TABLE = "memory/budget_vs_measured.md"
FIGURE = "overview/rewards_and_memory.png"  # what the Overview opens with: the rewards, then the memory
HELD_OUT = "completions/held_out.json"


def chart_link(run_id: str, path: str = FIGURE, alt: str = "Rewards per step, budget vs measured") -> str:
    """Markdown that shows the run's artifact `path` as an image in its description."""
    return f"![{alt}]({'get-artifact?path=' + quote(path, safe='')}&run_uuid={run_id})"


def reward_curves(history: Sequence[Mapping[str, float]]) -> dict[str, tuple[list[int], list[float]]]:
    """Each reward's mean per step, from the rows TRL logged (`rewards/<name>/mean`): name -> (steps, means).

    Example:
        >>> reward_curves([{"step": 1, "rewards/correctness_reward/mean": 0.25, "loss": 0.1},
        ...                {"step": 2, "rewards/correctness_reward/mean": 0.5, "loss": 0.1}])
        {'correctness_reward': ([1, 2], [0.25, 0.5])}
    """
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for row in step_rows(history):
        for key, value in row.items():
            if (name := REWARD_METRIC.fullmatch(key)) is not None:
                steps, means = curves.setdefault(name[1], ([], []))
                steps.append(int(row["step"]))
                means.append(value)
    return curves


def figure(c: Comparison, history: Sequence[Mapping[str, float]], step_peaks, budget_total: int):
    """The Overview's figure: what the run learned beside what it cost. Each reward's mean per step
    (what a reader came for: chapter 1's correctness climbing), then the budget-vs-measured chart
    (grpolab.memory.comparison: each line, and the peak per step against the sheet's)."""
    from matplotlib.figure import Figure  # a bare Figure: no pyplot backend switched

    # 1200 x 380 pixels: MLflow shows a description's image at its own size (its sanitizer drops width
    # and style), and the Overview of a 1500-pixel window is about 1260 wide.
    fig = Figure(figsize=(12, 3.8), dpi=100)
    rewards, bars, curve = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2, 3, 2]})
    for name, (steps, means) in reward_curves(history).items():
        rewards.plot(steps, means, marker=".", label=name)
    rewards.set_xlabel("step")
    rewards.set_ylabel("mean reward")
    rewards.set_title("Rewards per step")
    if rewards.lines:
        rewards.legend(fontsize=8)
    else:
        rewards.text(0.5, 0.5, "no step logged", ha="center", va="center", transform=rewards.transAxes)
    comparison.draw_lines(bars, c)
    comparison.draw_peaks(curve, c, step_peaks, budget_total)
    fig.tight_layout()
    return fig


def line_table(c: Comparison) -> str:
    """The total first (the figure that decides whether the plan fits), then each line."""
    rows = [
        "| line | budget | measured | diff | how measured |",
        "|---|---:|---:|---:|---|",
        f"| **total (peak)** | {c.bytes(c.total_budget)} | {c.bytes(c.total_measured)} | "
        f"{c.bytes(c.total_measured - c.total_budget, sign=True)} | {HOW_MEASURED['total']} |",
    ]
    for name, budget in c.budget.items():
        measured, diff = (
            (c.bytes(c.measured[name]), c.bytes(c.diff(name), sign=True))
            if name in c.measured
            else ("not measured", "")
        )
        rows.append(f"| {name} | {c.bytes(budget)} | {measured} | {diff} | {HOW_MEASURED.get(name, '')} |")
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
    run_id: str,
    c: Comparison,
    doctor: str,
    evals: Mapping,
    status: str = "FINISHED",
    chart: bool = True,
    task: str = "",
) -> str:
    """The run's description: verdict, figure (rewards beside memory), table, doctor, held-out, the
    task check's verdict (`task`), where the completions are."""
    verdict = c.verdict() + ("" if status == "FINISHED" else f" (run ended {status}: figures so far)")
    # The verdict before the figure: MLflow 3.17 folds a description to its first 100 pixels until
    # "Show more" is clicked, and the sentence (the total's budget beside its measured peak) fits them.
    parts = [f"**{verdict}**"]
    parts += [chart_link(run_id)] if chart else []
    parts += [
        line_table(c),
        f"Full table with each line's formula: `{TABLE}`; the memory chart alone: `{CHART}`.",
        doctor,
        held_out_table(evals),
        f"{task[:1].upper()}{task[1:]} (every check: `task_check/table.md`)." if task else "",
        "What the model wrote: the **Traces** tab, one trace per group of a logged step (its prompt, every "
        "completion with each reward and its advantage; each reward's group mean as an assessment, and a "
        "span per completion with its own); the held-out prompts answered by base and adapter side by "
        f"side: the trace tagged `kind = held-out` and `{HELD_OUT}`.",
    ]
    return "\n\n".join(p for p in parts if p)


def log(
    c,
    figure,
    extra_metrics: dict[str, float],
    labels: dict[str, str],
    note: str,
    step: int = 0,
    opening=None,
) -> None:
    """`<line>/measured_<unit>`, `/diff_<unit>`, `/rel_error` beside each `<line>/budget_<unit>`, the
    totals, the table, the chart, and the run's Overview as its description, with the figure it opens
    with (`opening`: `figure`, the rewards beside the memory). At `step`: 0 for a run in one
    piece; a resumed run measures each process again and logs its figures at the step it reached."""
    import mlflow

    unit = c.unit  # the unit its table and its Overview are written in: the keys say the same
    size = MEMORY_UNITS[unit]
    metrics = dict(extra_metrics)
    for name in c.paired:
        metrics[memory_key(name, "measured", unit)] = c.measured[name] / size
        metrics[memory_key(name, "diff", unit)] = c.diff(name) / size
        metrics[f"{name}/rel_error"] = c.rel_error(name)
    for name, value in c.unpaired_measured.items():
        metrics[f"unpaired/{name}_{unit}"] = value / size
    metrics[memory_key("total", "measured", unit)] = c.total_measured / size
    metrics[memory_key("total", "budget_compared", unit)] = c.total_budget / size
    metrics["total/rel_error"] = c.total_rel_error
    metrics[memory_key("total", "unattributed", unit)] = c.unattributed / size
    metrics |= glance(metrics, unit)
    mlflow.log_metrics(metrics, step=step)
    mlflow.set_tags(
        {
            "memory_labels": json.dumps(labels),
            "budget_unmeasured_lines": ",".join(c.unmeasured) or "none",
            "measured_unpaired": ",".join(c.unpaired_measured) or "none",
            # why the run ended when it did not finish, and its resumes, then the verdict
            "mlflow.note.content": tracking.description(mlflow.active_run().info.run_id, note),
        }
    )
    mlflow.log_text(comparison.table(c), TABLE)
    if figure is not None:
        mlflow.log_figure(figure, CHART)
    if opening is not None:
        mlflow.log_figure(opening, FIGURE)
