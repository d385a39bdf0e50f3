"""Arms: one chapter trained several ways in one process, each arm a run nested under one MLflow run.

Chapter 4 trains the same policy from the same start under two rewards and, under the loose one, at
several betas. Each arm is an ordinary lab run through the harness (grpolab.lab.session: the budget, the
held-out evaluation before and after, the run doctor, a status that tells how it ended), opened as a
child of the chapter's parent run, and the parent holds the comparison: per arm, the reward it was
paid beside the task's exact reward on the same completions, held-out accuracy before and after,
KL to the reference, the doctor's findings, and a few held-out completions before and after.

Unlike chapter 2's cells (grpolab.chapters.sweep: a process each, so each cell's memory peak is its own), the
arms measure learning, not memory, and share one process and so one import of Unsloth (most of a
minute of CPU on 2 cores): that keeps the chapter within minutes on a CPU. What it costs: an arm's
measured peak is the process's, so an arm after the first also holds what the earlier ones left; the
parent run's description says so.

One job per function: `main` (flags, preparing, the parent run, each arm), `summary` (an arm's
numbers, from its run), `chart` and `completions_table` (pure), `log_report` (onto the parent run).
"""

from __future__ import annotations

import argparse
import statistics
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgets import BudgetError
from grpolab.config.errors import refuse
from grpolab.config.settings import FLAGS, LabSettingsError
from grpolab.judging.doctor import quarters, series, step_rows

CHART = "arms/reward_vs_held_out.png"
CAUSES_CHART = "arms/broken_and_mended.png"  # the chart of arms that each reproduce a cause (chapter 8)
COMPLETIONS = "arms/completions.md"
RECORD = "arms/arms.json"
VERDICT = "arms/verdict.md"
# MLflow cuts a tag longer than this (mlflow.utils.validation.MAX_TAG_VAL_LENGTH), the description too:
# a chapter of many arms writes its Overview to fit, and what does not fit is named by its artifact.
NOTE_LIMIT = 8000
SAMPLES = 4  # held-out completions shown per arm, before and after
PANELS_PER_ROW = 3  # chapter 8's picture: three causes a row, so the page shows it at a readable size


@dataclass(frozen=True)
class Arm:
    """One way of training the chapter: the rewards it is paid (a key the lesson's `train` reads) and
    the settings it changes from the chapter's (beta, ...). A key that names the rewards paid, joined
    by `+` (`answer_tag_reward+format_reward`), is one the doctor's reward swap can rewrite."""

    name: str
    reward: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    # The doctor's finding this arm is broken to provoke (chapter 8). After it, an arm `<name>-fixed`
    # trains with the next step that finding printed, parsed from its text: never a second copy.
    cause: str | None = None
    fixes: str | None = None  # on a fixed arm: the broken arm it mends


def parser(description: str, arms: Sequence[Arm]) -> argparse.ArgumentParser:
    """Every chapter's flags (grpolab.config.flags), and which arms to train."""
    from grpolab.config.flags import parser as lab_parser

    ap = lab_parser(description)
    ap.add_argument(
        "--arms",
        default=",".join(a.name for a in arms),
        help=f"the arms to train, comma-separated, in order (default: all: {', '.join(a.name for a in arms)})",
    )
    return ap


def main(
    lab_dir: Path,
    arms: Sequence[Arm],
    train: Callable[[Any, str], None],
    argv: list[str] | None = None,
    doc: str = "",
) -> int:
    """Every selected arm, one after another in this process, each nested under the chapter's run;
    then the comparison logged on that run. Returns the exit code (a lab's)."""
    from grpolab.lab import console
    from grpolab.lifecycle import endings

    args = parser(doc.split("\n\n")[0] if doc else "", arms).parse_args(argv)
    # signals recorded, acted on between phases; the screen as run_lab's
    with endings.STOPS.armed() as stops, console.screen():
        try:
            return _main(lab_dir, arms, train, args, stops)
        except KeyboardInterrupt as stop:
            return endings.exit_after(stop, stops)


def _main(lab_dir, arms, train, args, stops) -> int:
    from grpolab.lab import console
    from grpolab.lab.prepare import prepare, prompts
    from grpolab.lifecycle import store, tracking

    stops.enter("the run's preparation (imports, settings, budget)")
    console.quiet_library_noise()  # before Unsloth's import, as every lab does
    if args.resume is not None:
        return refuse(
            "--resume: the arms are compared from the same start, so a stopped chapter is run again; "
            "to train some arms only, pass --arms (e.g. --arms exact,loose)"
        )
    by_name = {a.name: a for a in arms}
    chosen = [name.strip() for name in args.arms.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in by_name]
    if unknown or not chosen:
        return refuse(
            f"--arms: unknown arm {unknown[0] if unknown else '(none)'}; known: {', '.join(by_name)}"
        )
    if args.budget_only:
        try:
            print(arms_budget(lab_dir, args, arms))
        except (LabSettingsError, BudgetError) as err:
            return refuse(err)
        return 0
    try:
        store.require(tracking.tracking_uri())
        device, settings, _, card_note = prepare(lab_dir, args)
        for name in chosen:  # every arm's settings and sheet are checked before the first one loads anything
            arm_settings = settings.replace(**by_name[name].changes)
            _check(arm_settings)
            arm_sheet(arm_settings, device).require_fits(accepts=FLAGS)
        from grpolab.model import cuda_env

        cuda = cuda_env.configure(settings.unsloth_vllm_standby)
        dataset = prompts(settings)
    except (LabSettingsError, BudgetError, store.StoreError) as err:
        return refuse(err)
    if cuda.note:
        print(cuda.note, flush=True)
    return _run(
        lab_dir, [by_name[n] for n in chosen], train, args, settings, device, card_note, cuda, dataset
    )


def _check(settings) -> None:
    from grpolab.config.settings import check

    check(settings)


def _run(lab_dir, chosen, train, args, settings, device, card_note, cuda, dataset) -> int:
    import mlflow

    from grpolab.lifecycle import tracking

    tags = {
        "profile": settings.profile,
        "chapter": settings.chapter,
        "model_id": settings.model,
        "run_kind": "arms",
        "arms": ",".join(a.name for a in chosen),
    }
    results: list[dict[str, Any]] = []
    parent_name = tracking.run_name(f"arms-{settings.profile}")
    with tracking.lab_run(settings.chapter, parent_name, tags) as parent:
        mlflow.log_params(settings.as_params())
        try:
            _arms(chosen, train, args, settings, device, card_note, cuda, dataset, parent_name, results)
        except KeyboardInterrupt as stop:
            _stopped(stop, chosen, results)
            raise
        text = log_report(results, parent.info.run_id)
    print("\n" + text)
    print(f"MLflow run {parent.info.run_id} in {tracking.tracking_uri()} (its arms nest under it)")
    print(
        f"Open it: uv run mlflow ui --backend-store-uri {tracking.tracking_uri()}, then {tracking.run_url(parent)}"
    )
    return 0


def _arms(chosen, train, args, settings, device, card_note, cuda, dataset, parent_name, results) -> None:
    """Each arm in turn, nested under the chapter's run; its summary appended to `results`."""
    import mlflow

    from grpolab.lab.session import session
    from grpolab.lifecycle.endings import STOPS

    queue = list(chosen)
    trained: dict[tuple, dict[str, Any]] = {}  # a mended arm's reward and settings -> its summary
    while queue:
        arm = queue.pop(0)
        STOPS.enter(f"the arms, before arm {arm.name}")
        arm_settings = settings.replace(**arm.changes)
        changed = ", ".join(f"{k} {v}" for k, v in arm.changes.items()) or "the chapter's settings"
        print(f"\n=== arm {arm.name}: {arm.reward} reward, {changed} ===", flush=True)
        key = (arm.reward, tuple(sorted(arm_settings.as_params().items())))
        if arm.fixes is not None and key in trained:
            # Several next steps lead back to the chapter's own recipe (chapter 8: a temperature, a
            # learning rate, a beta, a question each mended to the recipe's): the same reward, settings
            # and seed are the same run, trained once (on the CPU, bit for bit: its arithmetic is pinned).
            same = trained[key]
            results.append(
                {
                    **same,
                    "arm": arm.name,
                    "fixes": arm.fixes,
                    "changes": dict(arm.changes),
                    "same_run_as": same["arm"],
                }
            )
            print(
                f"The same reward, settings and seed as arm {same['arm']}: its run, not trained again",
                flush=True,
            )
            continue
        name = f"{arm.name}-{parent_name}"
        own_sheet, arm_dataset = _arm_inputs(arm_settings, settings, dataset, device)
        with session(
            arm_settings, own_sheet, device, args, arm_dataset, card_note, nested=True, cuda=cuda, name=name
        ) as run:
            train(run, arm.reward)
        client = mlflow.MlflowClient()
        client.set_tag(run.mlflow_run.info.run_id, "arm", arm.name)
        client.set_tag(run.mlflow_run.info.run_id, "arm.reward", arm.reward)
        results.append(summary(arm, run))
        if arm.fixes is not None:
            trained[key] = results[-1]
        print(
            "\n".join(line for line in run.summary if line.startswith(("Held-out", "Run doctor"))),
            flush=True,
        )
        if arm.cause is not None:
            fixed = fixed_arm(arm, run.findings, arm_settings)
            named = arm.cause in results[-1]["finding_names"]
            print(
                f"The doctor's next step for {arm.cause}: {results[-1]['fix']}"
                if fixed
                else f"The doctor named {arm.cause} on arm {arm.name} with no value to apply: no mended arm"
                if named
                else f"The doctor did not name {arm.cause} on arm {arm.name}: no next step to apply",
                flush=True,
            )
            if fixed is not None:
                queue.insert(0, fixed)


def _arm_inputs(arm_settings, settings, dataset, device):
    """An arm's budget sheet and prompts. The sheet is its own: an arm changes what a step holds
    (chapter 8's cut arm, two tokens a completion; its unsynced arm on a GPU, no vLLM). The prompts
    are the chapter's unless the arm asks another question (chapter 8's solved and unreachable arms)."""
    from grpolab.lab.prepare import prompts

    same_task = (arm_settings.task, arm_settings.task_config) == (settings.task, settings.task_config)
    return arm_sheet(arm_settings, device), dataset if same_task else prompts(arm_settings)


def arm_sheet(arm_settings, device):
    """The budget sheet of an arm's settings on the card its run is checked against."""
    from budgets import compute
    from grpolab.lab.prepare import card_plan

    plan, _, _ = card_plan(arm_settings, device, arm_settings.profile)
    return compute(plan)


def arms_budget(lab_dir: Path, args: argparse.Namespace, arms: Sequence[Arm]) -> str:
    """`--budget-only`: the chapter's sheet, then each arm's verdict on the same card, from the arm's
    own settings (a mended arm's settings come from the doctor's finding, so it has none until then)."""
    from grpolab.lab.prepare import budget_settings, budget_text

    settings, device = budget_settings(lab_dir, args)
    text = budget_text(settings, device, args)
    if args.json:
        return text
    rows = []
    for arm in arms:
        arm_settings = settings.replace(**arm.changes)
        _check(arm_settings)
        changed = ", ".join(f"{k} {v}" for k, v in arm.changes.items()) or f"paying {arm.reward}"
        rows.append(f"  {arm.name:<12} {changed}: {arm_sheet(arm_settings, device).verdict(accepts=FLAGS)}")
    return "\n".join([text, "", "each arm's sheet (its own settings, on the same card):", *rows])


def fixed_arm(arm: Arm, findings, settings) -> Arm | None:
    """The arm that applies the next step the doctor printed in `arm.cause`'s finding, on top of the
    broken arm's changes: the settings it names, or the reward it says to pay in place of another;
    None when the doctor did not name that cause, or named a step that is not there to apply."""
    from grpolab.judging.doctor import next_step, reward_swap

    finding = next((f for f in findings if f.name == arm.cause), None)
    if finding is None:
        return None
    swap = reward_swap(finding)
    if swap is not None:
        silent, instead = swap
        paid = arm.reward.split("+")
        if silent not in paid:  # a key that does not name its rewards: nothing to rewrite
            print(f"{arm.name}: the doctor's step swaps {silent}, which its key {arm.reward!r} does not name")
            return None
        reward = "+".join(instead if name == silent else name for name in paid)
        return Arm(f"{arm.name}-fixed", reward, dict(arm.changes), fixes=arm.name)
    try:
        step = next_step(finding, settings)
    except ValueError as err:  # a next step with no value: shown, not guessed
        print(err, flush=True)
        return None
    return Arm(f"{arm.name}-fixed", arm.reward, {**arm.changes, **step}, fixes=arm.name)


def _stopped(stop: KeyboardInterrupt, chosen, results: list[dict[str, Any]]) -> None:
    """A stopped chapter says which arms finished and which did not: on its run (its description,
    after the signal) and on stderr."""
    from grpolab.lifecycle import tracking

    finished = [r["arm"] for r in results]
    rest = [a.name for a in chosen if a.name not in finished]
    tracking.describe_stop(
        stop,
        f"Arms finished: {', '.join(finished) or 'none'}; stopped or not started: {', '.join(rest) or 'none'}.",
    )


def summary(arm: Arm, run) -> dict[str, Any]:
    """An arm's numbers from its finished run: the reward it was paid and the task's exact answer
    reward on the same completions (per step), held-out before and after, KL, the doctor's findings."""
    from task import RewardRole

    funcs, weights = run.reward_funcs()
    infos = [f.reward_info for f in funcs]
    weights = weights or [1.0] * len(infos)
    paid = [r for r, w in zip(infos, weights, strict=True) if w != 0 and r.role is RewardRole.ANSWER]
    exact = next(r for r in run.task.rewards if r.role is RewardRole.ANSWER)
    rows = step_rows(run.meter.history)
    before, after = run.evals.get("base"), run.evals.get("adapter")
    cause = next((f for f in run.findings if f.name == arm.cause), None)
    return {
        "arm": arm.name,
        "reward": arm.reward,
        "cause": arm.cause,
        "fixes": arm.fixes,
        "same_run_as": None,  # a mended arm trained as an earlier one (the same reward, settings, seed)
        "changes": {k: v for k, v in arm.changes.items()},
        # What the doctor printed as the next step, as the fixed arm applies it (`--flag value`).
        "fix": _fix(cause, run.settings),
        "run_id": run.mlflow_run.info.run_id,
        "beta": run.settings.beta,
        "loss_type": run.settings.loss_type,
        "paid_metric": paid[0].metric,
        "exact_metric": exact.metric,
        "steps": [row.get("step", i + 1) for i, row in enumerate(rows)],
        "paid": series(rows, paid[0].metric),
        "exact": series(rows, exact.metric),
        # Unsloth's trainer logs kl 0 without a reference (beta 0): not measured, not zero drift.
        "kl": series(rows, "kl") if run.settings.beta != 0 else [],
        "held_out": {
            which: {"accuracy": r.accuracy, "format_rate": r.format_rate, "rewards": r.reward_means()}
            for which, r in (("base", before), ("adapter", after))
            if r is not None
        },
        "questions": _questions(run.settings) if before is not None or after is not None else [],
        "completions": {
            which: list(r.completions[:SAMPLES]) for which, r in (("base", before), ("adapter", after)) if r
        },
        "findings": [str(f) for f in run.findings],
        "finding_names": sorted({f.name for f in run.findings}),
    }


def _fix(finding, settings) -> str | None:
    """The next step a broken arm's finding printed, as its mended arm applies it: flags, or the reward
    it pays in place of the one that never paid."""
    from grpolab.judging.doctor import next_step, reward_swap

    if finding is None:
        return None
    if (swap := reward_swap(finding)) is not None:
        return f"pay {swap[1]} in place of {swap[0]}"
    try:
        return _flags(next_step(finding, settings))
    except ValueError:
        return None


def _flags(changes: Mapping[str, Any]) -> str:
    from budgets.advice import value_text

    return " ".join(f"--{k.replace('_', '-')} {value_text(v)}" for k, v in changes.items())


def _questions(settings) -> list[str]:
    """The user turns of the held-out prompts the completions answer (the first SAMPLES)."""
    from grpolab.judging.evaluate import eval_rows

    return [prompt[-1]["content"] for prompt in eval_rows(settings)["prompt"][:SAMPLES]]


def _quarter(values: Sequence[float], which: int) -> float | None:
    return quarters(list(values))[which] if values else None


def verdict(results: Sequence[dict[str, Any]]) -> str:
    """One paragraph per arm: what it was paid, what the task's own check said, held out, KL, doctor."""
    lines = []
    for r in results:
        held = r["held_out"]
        acc = (
            f"held-out accuracy {held['base']['accuracy']:.1%} -> {held['adapter']['accuracy']:.1%}"
            if {"base", "adapter"} <= set(held)
            else "no held-out evaluation"
        )
        kl = (
            f", KL in the last quarter {_quarter(r['kl'], 3):.3f}"
            if r["kl"]
            else ", KL not measured (beta 0: no reference policy)"
        )
        paid = (
            f"{r['paid_metric']} {_quarter(r['paid'], 0):.3f} -> {_quarter(r['paid'], 3):.3f}"
            if r["paid"]
            else ""
        )
        exact = (
            f"the task's own {r['exact_metric']} on the same completions {_quarter(r['exact'], 0):.3f} -> "
            f"{_quarter(r['exact'], 3):.3f}"
            if r["exact"]
            else ""
        )
        doctor = "; ".join(r["findings"]) if r["findings"] else "The doctor found nothing"
        lines.append(
            f"- **{r['arm']}** ({r['reward']} reward, beta {r['beta']:g}): {paid} (first -> last quarter), "
            f"{exact}; {acc}{kl}. {doctor}."
        )
    return "\n".join(lines)


def causes_table(results: Sequence[dict[str, Any]]) -> str:
    """Per broken arm (chapter 8): its break, what the doctor named, the next step it printed, and
    held-out accuracy before and after, broken and mended. Empty when no arm was broken on purpose."""
    rows = []
    for r in results:
        if r.get("cause") is None:
            continue
        mended = next((m for m in results if m.get("fixes") == r["arm"]), None)
        broke = ", ".join(f"{k} {v}" for k, v in r["changes"].items()) or f"paying {r['reward']}"
        named = ", ".join(r["finding_names"]) or "nothing"
        rows.append(
            f"| {r['arm']} | {broke} | {r['cause']} | {named} | `{r['fix'] or 'none'}` | "
            f"{_held(r)} | {_mended(mended)} |"
        )
    if not rows:
        return ""
    return "\n".join(
        [
            "| arm | broken by | cause | the doctor named | its next step | held-out, broken | held-out, mended |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def _mended(mended: Mapping[str, Any] | None) -> str:
    if mended is None:
        return "not run"
    same = mended.get("same_run_as")
    return _held(mended) + (f" (arm {same}'s run)" if same else "")


def _held(r: Mapping[str, Any]) -> str:
    held = r["held_out"]
    if not {"base", "adapter"} <= set(held):
        return "not scored"
    return f"{held['base']['accuracy']:.1%} -> {held['adapter']['accuracy']:.1%}"


def chart(results: Sequence[dict[str, Any]]):
    """Per arm: the reward it was paid and the task's exact reward on the same completions, per step,
    with held-out accuracy before and after as markers; below it, KL to the reference per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One above the other, 7 inches wide: the run's description shows the image at its own width, and
    # side by side (12 inches) its right half was cut off there (MLflow 3.17).
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 9.5), height_ratios=(3, 2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(results):
        color = colors[i % len(colors)]
        steps = r["steps"][: len(r["paid"])]
        top.plot(
            steps,
            _smooth(r["paid"]),
            color=color,
            label=f"{r['arm']}: paid ({r['paid_metric'].split('/')[1]})",
        )
        if r["exact"] and r["exact_metric"] != r["paid_metric"]:
            top.plot(
                steps,
                _smooth(r["exact"]),
                color=color,
                linestyle=":",
                label=f"{r['arm']}: exact, same completions",
            )
        held = r["held_out"]
        if {"base", "adapter"} <= set(held):
            top.plot(
                [0, steps[-1] if steps else 1],
                [held["base"]["accuracy"], held["adapter"]["accuracy"]],
                color=color,
                linestyle="--",
                marker="o",
                label=f"{r['arm']}: held-out accuracy",
            )
        if r["kl"]:
            bottom.plot(
                r["steps"][: len(r["kl"])], r["kl"], color=color, label=f"{r['arm']} (beta {r['beta']:g})"
            )
    top.set(
        xlabel="step",
        ylabel="share of completions paid",
        title="paid vs the task's exact check",
        ylim=(-0.02, 1.02),
    )
    # Under the plot, not over the curves: four arms make twelve entries.
    top.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    bottom.set(xlabel="step", ylabel="KL to the reference (per token)", title="drift: how far each arm went")
    bottom.legend(fontsize=7)
    fig.tight_layout()
    return fig


def causes_chart(results: Sequence[dict[str, Any]]):
    """Chapter 8's picture: one panel per cause, the task's correctness per step on the broken arm
    beside the arm mended by the doctor's next step, with held-out accuracy before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    broken = [r for r in results if r.get("cause") is not None]
    columns = min(len(broken), PANELS_PER_ROW)
    rows = -(-len(broken) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.4 * rows), squeeze=False, sharey=True)
    panels = [ax for row in axes for ax in row]
    for ax in panels[len(broken) :]:  # a last row not full
        ax.set_visible(False)
    for ax, r in zip(panels, broken, strict=False):
        mended = next((m for m in results if m.get("fixes") == r["arm"]), None)
        for arm, color, label in ((r, "tab:red", "broken"), (mended, "tab:green", "mended")):
            if arm is None:
                continue
            steps = arm["steps"][: len(arm["exact"])]
            ax.plot(steps, _smooth(arm["exact"]), color=color, label=f"{label}: correctness")
            held = arm["held_out"]
            if {"base", "adapter"} <= set(held):
                ax.plot(
                    [0, steps[-1] if steps else 1],
                    [held["base"]["accuracy"], held["adapter"]["accuracy"]],
                    color=color,
                    linestyle="--",
                    marker="o",
                    label=f"{label}: held-out accuracy",
                )
        ax.set(xlabel="step", ylim=(-0.02, 1.02))
        mended_by = textwrap.fill(f"mended by {r['fix'] or 'nothing (no next step)'}", 44)  # a panel's width
        ax.set_title(f"{r['arm']}: {r['cause']}\n{mended_by}", fontsize=9)
    for row in axes:
        row[0].set_ylabel("share right")
    axes[0][0].legend(fontsize=7, loc="center left")
    fig.tight_layout()
    return fig


def _smooth(values: Sequence[float], width: int = 3) -> list[float]:
    """A trailing mean over `width` steps: one group's luck per step is noisy."""
    return [statistics.fmean(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def completions_table(results: Sequence[dict[str, Any]]) -> str:
    """A few held-out completions per arm, the base's beside the trained adapter's (same prompts)."""
    lines = ["| arm | held-out prompt | base (before) | adapter (after) |", "|---|---|---|---|"]
    for r in results:
        before, after = r["completions"].get("base", []), r["completions"].get("adapter", [])
        questions = r.get("questions") or [""] * len(before)
        for q, b, a in zip(questions, before, after, strict=False):
            lines.append(f"| {r['arm']} | {_cell(q)} | `{_cell(b)}` | `{_cell(a)}` |")
    return "\n".join(lines)


def fit_note(parts: Sequence[tuple[str, str | None]], limit: int = NOTE_LIMIT) -> str:
    """The parts of a description in order, each whole or, where it would pass `limit`, its stand-in
    (a line naming the artifact that holds it): a description MLflow cuts loses its end silently."""
    kept: list[str] = []
    for part, instead in parts:
        for text in (part, instead):
            if text is not None and len("\n\n".join([*kept, text])) <= limit:
                kept.append(text)
                break
    return "\n\n".join(kept)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "\\n").replace("`", "'")[:80]


def log_report(results: Sequence[dict[str, Any]], parent_run_id: str) -> str:
    """The comparison on the parent run: the record, the chart, the completions, the verdict, a metric
    per arm, and the description (the table of causes where arms reproduce them, the chart, the
    verdict, the completions: as many as MLflow keeps). Returns the verdict and the table of causes."""
    import mlflow

    mlflow.log_dict({"arms": list(results)}, RECORD)
    by_cause = any(r.get("cause") for r in results)
    drawn = CAUSES_CHART if by_cause else CHART
    mlflow.log_figure(causes_chart(results) if by_cause else chart(results), drawn)
    table = completions_table(results)
    mlflow.log_text(table + "\n", COMPLETIONS)
    for r in results:
        held = r["held_out"]
        values = {f"arms/{r['arm']}/paid_last_quarter": _quarter(r["paid"], 3) or 0.0}
        if {"base", "adapter"} <= set(held):
            values[f"arms/{r['arm']}/held_out_accuracy_base"] = held["base"]["accuracy"]
            values[f"arms/{r['arm']}/held_out_accuracy_adapter"] = held["adapter"]["accuracy"]
        if r["kl"]:
            values[f"arms/{r['arm']}/kl_last_quarter"] = _quarter(r["kl"], 3)
        mlflow.log_metrics(values)
    causes = causes_table(results)
    said = verdict(results)
    text = said + (f"\n\n{causes}" if causes else "")
    mlflow.log_text(said + "\n", VERDICT)
    link = f"get-artifact?path={drawn.replace('/', '%2F')}&run_uuid={parent_run_id}"
    alt = (
        "correctness per step, broken beside mended"
        if by_cause
        else "paid vs exact, held-out accuracy, KL per arm"
    )
    picture = f"![{alt}]({link})"
    # Each part of the Overview, and what stands in its place when it does not fit: chapter 8's opens
    # with its table of causes (the verdict of sixteen arms alone passes MLflow's limit), chapter 4's
    # with its verdict.
    verdicts = (said, f"Each arm's verdict: the artifact `{VERDICT}`.")
    opening = [(causes, None), (picture, None), verdicts] if causes else [verdicts, (picture, None)]
    parts = [
        *opening,
        (
            f"Held-out completions, before and after:\n\n{table}",
            f"Held-out completions, before and after: the artifact `{COMPLETIONS}`.",
        ),
        ("(The arms share one process: an arm's memory peak includes what earlier arms left.)", None),
    ]
    note = fit_note(parts)
    mlflow.set_tag("mlflow.note.content", note)
    return text
