"""The ship run's record: each stage's figures, the chart, and the verdict that opens its Overview."""

from __future__ import annotations

from grpolab.chapters.ship.stages import Stage

CHART = "ship/accuracy_by_stage.png"  # the chart on the ship run, and the chapter page's picture

# A stage keeps what GRPO taught when it answers the held-out prompts as the adapter did: the reload
# every answer the same (the same weights, the same arithmetic); a stage that rounds the weights within
# one prompt of the adapter's score (a 16-bit float moves a logit by about 1e-3, which can flip one close
# greedy choice). Beyond that it lost what was taught, or, scoring higher, it is another model than the
# one trained and evaluated: what it learned was not measured, it happened.
TOLERANCE_PROMPTS = {"reload": 0}
DEFAULT_TOLERANCE = 1


def outcome(stage: Stage, logged_right: int) -> str:
    """ "kept", "lost" or "changed" (another model, scoring higher)."""
    diff = stage.right - logged_right
    if abs(diff) <= TOLERANCE_PROMPTS.get(stage.name, DEFAULT_TOLERANCE):
        return "kept"
    return "lost" if diff < 0 else "changed"


def logged_right(found) -> int:
    """Held-out prompts the adapter answered right when it was trained, as its run logged it."""
    return round(found.adapter_accuracy * found.settings.eval_prompts)


def table(found, stages: list[Stage]) -> list[tuple[str, str, str, str, str]]:
    """(stage, held-out right, against the adapter, answers changed, verdict) per stage."""
    n, logged, reference = found.settings.eval_prompts, logged_right(found), stages[0].result
    rows = [("adapter (training run)", f"{logged}/{n} ({found.adapter_accuracy:.1%})", "", "", "")]
    for stage in stages:
        verdict = outcome(stage, logged)
        rows.append(
            (
                stage.name,
                f"{stage.right}/{n} ({stage.result.accuracy:.1%})",
                f"{stage.right - logged:+d} prompts",
                str(stage.changed(reference)),
                verdict if verdict == "kept" else verdict.upper(),
            )
        )
    return rows


def lines(found, stages: list[Stage]) -> list[str]:
    rows = [("stage", "held-out right", "vs the adapter", "answers changed", ""), *table(found, stages)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def verdict(found, stages: list[Stage]) -> str:
    n, logged, reference = found.settings.eval_prompts, logged_right(found), stages[0].result
    by = {o: [s for s in stages if outcome(s, logged) == o] for o in ("kept", "lost", "changed")}
    first = f"Kept what GRPO taught ({logged} of {n} held-out prompts right): {', '.join(s.name for s in by['kept']) or 'no stage'}."

    def said(s: Stage) -> str:
        return f"{s.name} ({s.right} of {n}, {s.right - logged:+d}; {s.changed(reference)} answers changed)"

    if by["lost"]:
        first += " Lost it: " + "; ".join(said(s) for s in by["lost"]) + "."
    if by["changed"]:
        first += " Another model than the one trained: " + "; ".join(said(s) for s in by["changed"]) + "."
    details = [f"- **{s.name}**: {s.note}" for s in stages if s.note]
    return "\n".join([first, "", *details])


def chart(found, stages: list[Stage]):
    from matplotlib.figure import Figure  # a bare Figure: no pyplot backend switched

    n, logged, reference = found.settings.eval_prompts, logged_right(found), stages[0].result
    names = [s.name for s in stages]
    right = [s.right for s in stages]
    colours = [{"kept": "#4c956c", "lost": "#c0504d"}.get(outcome(s, logged), "#d4a017") for s in stages]
    fig = Figure(figsize=(7.5, 3.6), dpi=100)
    ax = fig.subplots()
    ax.bar(names, right, color=colours)
    ax.axhline(
        logged, color="black", linestyle="--", linewidth=1, label=f"the adapter, as trained ({logged})"
    )
    if found.base_accuracy is not None:
        base = round(found.base_accuracy * n)
        ax.axhline(base, color="grey", linestyle=":", linewidth=1, label=f"the base, before GRPO ({base})")
    for x, (stage, value) in enumerate(zip(stages, right, strict=True)):
        changed = stage.changed(reference)
        label = f"{value}" + (f"\n{changed} answers\nchanged" if changed else "")
        ax.text(x, value + n * 0.01, label, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, n * 1.3)
    ax.set_ylabel(f"held-out prompts right, of {n}")
    ax.set_title("What each step of shipping kept of what GRPO taught")
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    fig.tight_layout()
    return fig


def log(found, stages: list[Stage], registered: str) -> str:
    """Every stage's metrics, the chart and the table as artifacts, the verdict as the Overview."""
    import mlflow

    from grpolab.judging.overview import chart_link

    reference = stages[0].result
    metrics = {"ship/adapter/accuracy": found.adapter_accuracy}
    for stage in stages:
        metrics |= stage.metrics(reference, found.adapter_accuracy)
    mlflow.log_metrics(metrics)
    fig = chart(found, stages)
    mlflow.log_figure(fig, CHART)
    rows = table(found, stages)
    mlflow.log_table(
        {
            k: [r[i] for r in rows]
            for i, k in enumerate(("stage", "held_out_right", "vs_adapter", "answers_changed", "kept"))
        },
        artifact_file="ship/stages.json",
    )
    text = verdict(found, stages)
    header = "| stage | held-out right | vs the adapter | answers changed | |\n|---|---|---|---|---|\n"
    body = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    mlflow.set_tag(
        "mlflow.note.content",
        f"{text}\n\n{header}{body}\n\nThe 16-bit merge is registered as `{registered}` "
        f"(its version's tag `training_run` = {found.run_id}).\n\n"
        + chart_link(mlflow.active_run().info.run_id, CHART, "Held-out prompts right at each stage"),
    )
    return text
