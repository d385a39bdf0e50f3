"""Chapter 5's arms: the same headroom spent on one knob each, priced in learning and in time.

The budget sheet knows how far each knob can go on the card (`budgets.largest`: the largest group,
completion length or batch that still fits). Each arm raises one knob from the recipe to the same
fraction of that range, so every arm spends about the same GiB; the recipe itself is the arm that
spends nothing, the reference the others are priced against. On a GPU, standby is an arm too (its
vLLM share raised to Unsloth's tier, paid for in sleep and wake time).

Each arm is a cell of chapter 2's sweep (grpolab.chapters.sweep): chapter 1's loop in a process of its own,
nested under the chapter's run, so that its memory peak is its own (arms that shared a process, as
chapter 4's do, would each inherit the peaks of those before). From each arm's run: the sheet's
peak and the measured one, held-out accuracy before and after, training time and decode speed; on
the chapter's run, accuracy gained per GiB spent and per minute of training, a chart, a table and
the verdict, which opens the run's Overview.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgets import BudgetError, largest
from budgets.units import GIB
from grpolab.chapters.sweep.grid import Cell, Planned, plan_cell
from grpolab.chapters.sweep.host import Host
from grpolab.config.errors import refuse
from grpolab.config.settings import LabSettingsError, flag, lab_settings

# The knobs, in the sheet's names, and what each arm is called after.
KNOBS = {
    "num_generations": "group",
    "max_completion_length": "length",
    "per_device_train_batch_size": "batch",
}
CHART = "headroom/gain_per_gib_and_minute.png"
RECORD = "headroom/arms.json"
TABLE = "headroom/arms.md"


@dataclass
class Arm:
    """One arm before it runs: its name, the knob it spends on (none for the recipe), its cell, and
    where the sheet puts the knob (its value now, the arm's, the largest that fits)."""

    name: str
    knob: str | None
    planned: Planned
    values: tuple[int, int, int | None] = (0, 0, None)  # recipe's, arm's, largest that fits
    extra: list[str] = field(default_factory=list)  # flags besides the cell's (standby)

    @property
    def spent_gib(self) -> float:
        return self.planned.sheet.total_bytes / GIB


def cell_of(settings) -> Cell:
    return Cell(
        settings.per_device_train_batch_size // settings.num_generations,
        settings.num_generations,
        settings.max_completion_length,
    )


def _step(knob: str, cell: Cell) -> int:
    """The knob's smallest move that keeps the step whole: batches hold whole groups, completions grow
    by vLLM's KV block of 16 tokens, a group by one completion."""
    return {
        "num_generations": 1,
        "max_completion_length": 16,
        "per_device_train_batch_size": cell.num_generations,
    }[knob]


def _with(cell: Cell, knob: str, value: int) -> Cell:
    if knob == "num_generations":
        return Cell(cell.prompts_per_step, value, cell.max_completion_length)
    if knob == "max_completion_length":
        return Cell(cell.prompts_per_step, cell.num_generations, value)
    return Cell(value // cell.num_generations, cell.num_generations, cell.max_completion_length)


def plan_arms(lab_dir: Path, host: Host, overrides: dict[str, Any], fraction: float) -> list[Arm]:
    """The recipe, then one arm per knob at `fraction` of its headroom on the host's card; on a GPU, standby."""
    base = lab_settings(lab_dir, host.profile, overrides)
    recipe = plan_cell(lab_dir, host, overrides, cell_of(base))
    if not recipe.fits:
        raise BudgetError(f"the recipe does not fit {host.note}: {recipe.sheet.verdict()}")
    plan = recipe.settings.plan()
    if host.card is not None:
        plan = plan.with_(gpu=host.card, other_processes_gib=host.other_processes_gib)
    # Every arm may spend the same share of what the card has left: a peak of at most `spend`.
    sheet = recipe.sheet
    spend = sheet.total_bytes + fraction * (sheet.capacity_bytes - sheet.total_bytes)
    arms = [Arm("recipe", None, recipe)]
    for knob, name in KNOBS.items():
        current = int(getattr(recipe.settings, knob))
        room = largest(plan, knob)
        if room.largest is None or room.largest <= current:
            raise BudgetError(
                f"{knob}: no headroom on {host.note} ({room.binding}): the recipe fills the card"
            )
        step = _step(knob, recipe.cell)

        def planned_at(value: int, knob: str = knob) -> tuple[Planned, dict[str, Any]]:
            # A longer completion brings its sequence along (as the sheet's search does).
            more = {}
            if knob == "max_completion_length" and plan.max_prompt_length + value > base.max_seq_length:
                more = {"max_seq_length": plan.max_prompt_length + value}
            return plan_cell(lab_dir, host, {**overrides, **more}, _with(recipe.cell, knob, value)), more

        # The largest value whose peak stays within `spend` (a peak grows with every knob): bisection,
        # in steps above the recipe; one step at least.
        lo, hi = 1, (room.largest - current) // step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            try:
                peak = planned_at(current + mid * step)[0].sheet.total_bytes
            except LabSettingsError:  # past what the settings allow
                peak = float("inf")
            lo, hi = (mid, hi) if peak <= spend else (lo, mid - 1)
        value = current + lo * step
        planned, more = planned_at(value)
        extra = [word for name_, v in more.items() for word in (flag(name_), str(v))]
        arms.append(Arm(name, knob, planned, (current, value, room.largest), extra))
    if host.profile == "gpu" and not base.unsloth_vllm_standby:
        standby = plan_cell(lab_dir, host, {**overrides, "unsloth_vllm_standby": True}, recipe.cell)
        arms.append(Arm("standby", "unsloth_vllm_standby", standby, extra=["--unsloth-vllm-standby", "true"]))
    return arms


def sheet_lines(arms: list[Arm], host: Host, fraction: float, whole: bool = False) -> str:
    """Every arm's sheet in one line each; `whole`: then each arm's whole sheet (`--budget-only`)."""
    from grpolab.config.settings import FLAGS

    recipe = arms[0].spent_gib
    lines = [
        f"Spending the headroom on {host.note}: each arm raises one knob until its peak spends "
        f"{fraction:.0%} of what the recipe leaves free (the largest value that fits, in brackets)",
        "",
    ]
    for a in arms:
        knob = "" if a.knob is None else f"  {a.knob} {a.values[0]} -> {a.values[1]} (largest {a.values[2]})"
        if a.knob == "unsloth_vllm_standby":
            knob = "  unsloth_vllm_standby false -> true (vLLM's share: Unsloth's tier)"
        lines.append(
            f"  {a.name:8} {a.planned.cell.name:>12}  peak {a.spent_gib:6.2f} GiB  spends "
            f"{a.spent_gib - recipe:+.2f} GiB  {'fits' if a.planned.fits else 'REFUSED'}{knob}"
        )
    for a in arms if whole else []:
        lines += ["", f"=== arm {a.name}: {a.planned.cell.name} ===", a.planned.sheet.table(accepts=FLAGS)]
    return "\n".join(lines)


# --- the chapter's run ------------------------------------------------------------------------------
def parser(description: str, cpu_cap_gib: float, fraction: float) -> argparse.ArgumentParser:
    from budgets.vocabulary import OneLineErrorParser
    from grpolab.config.flags import add_profile
    from grpolab.config.paths import OUTPUTS
    from grpolab.config.settings import add_flags

    ap = OneLineErrorParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_profile(ap, "Qwen3-4B on the card", "the tiny stand-in on a small host")
    group = ap.add_argument_group("the arms")
    group.add_argument(
        "--fraction",
        type=float,
        default=fraction,
        help=f"how far each arm goes into its knob's headroom (default {fraction:g})",
    )
    group.add_argument("--budget-only", action="store_true", help="every arm's sheet; nothing runs")
    group.add_argument(
        "--memory-cap-gib",
        type=float,
        default=cpu_cap_gib,
        help=f"CPU: the small host's room for a step once the model is loaded (default {cpu_cap_gib:g})",
    )
    group.add_argument("--output-dir", type=Path, default=OUTPUTS, help="each arm's adapter, as a lab run's")
    add_flags(ap)
    return ap


def main(lab_dir: Path, argv: list[str] | None, doc: str, cpu_cap_gib: float, fraction: float) -> int:
    """Plan every arm on the card (or the CPU's small host), print their sheets, run them, price them."""
    from grpolab.chapters.sweep.host import find_host
    from grpolab.config.settings import overrides_from

    args = parser(doc.split("\n\n")[0] if doc else "", cpu_cap_gib, fraction).parse_args(argv)
    overrides = overrides_from(args)
    taken = sorted(set(overrides) & set(KNOBS))
    if taken:
        return refuse(f"{taken[0]}: the arms set it; pass --fraction to spend more or less of the headroom")
    if not 0 < args.fraction <= 1:
        return refuse(f"fraction: must be in (0, 1], got {args.fraction:g}")
    try:
        try:
            host = find_host(lab_dir, args.profile, overrides, args.memory_cap_gib)
        except LabSettingsError:
            if not (args.budget_only and args.profile == "gpu"):
                raise
            # The GPU arms' sheets need no GPU: on lab.toml's card (the RTX 5080 entry), as chapter 1's.
            card = lab_settings(lab_dir, "gpu", overrides).gpu
            host = Host("gpu", None, 0.0, f"{card} (lab.toml's card; no GPU here)")
        if host.profile == "gpu":
            host.memory_cap_gib = None
        arms = plan_arms(lab_dir, host, overrides, args.fraction)
    except (LabSettingsError, BudgetError) as err:
        return refuse(str(err))
    print(sheet_lines(arms, host, args.fraction, whole=args.budget_only), flush=True)
    if args.budget_only:
        return 0
    refused = [a for a in arms if not a.planned.fits]
    if refused:
        return refuse(f"arm {refused[0].name}: {refused[0].planned.sheet.verdict()}: lower --fraction")
    return _run(lab_dir, args, host, arms, overrides)


def _run(lab_dir: Path, args, host: Host, arms: list[Arm], overrides: dict[str, Any]) -> int:
    import mlflow

    from grpolab.chapters.sweep import cells
    from grpolab.chapters.sweep.loop import _forwarded, cell_processes
    from grpolab.lifecycle import endings, tracking

    settings = arms[0].planned.settings
    tags = {
        "profile": host.profile,
        "chapter": settings.chapter,
        "model_id": settings.model,
        "run_kind": "headroom",
        "headroom.arms": ",".join(a.name for a in arms),
        "budget_card": host.note,
    }
    results: list[dict[str, Any]] = []
    with endings.STOPS.armed() as stops:
        try:
            with (
                cell_processes(len(arms)) as server,
                tracking.lab_run(
                    settings.chapter, tracking.run_name(f"headroom-{host.profile}"), tags
                ) as parent,
            ):
                mlflow.log_params({**settings.as_params(), "fraction": args.fraction})
                client = tracking.client()
                folder = args.output_dir / settings.chapter / parent.info.run_name
                try:
                    for arm in arms:
                        stops.enter(f"the arms, before arm {arm.name}")
                        own = folder / arm.name
                        forward = _forwarded(own, overrides)
                        exited = cells.run_cell(
                            lab_dir, arm.planned, parent.info.run_id, forward, arm.extra, server
                        )
                        outcome = cells.outcome(client, parent, arm.planned, exited, own)
                        if outcome.run_id:
                            client.update_run(outcome.run_id, name=f"arm {arm.name}")
                            client.set_tag(outcome.run_id, "headroom.arm", arm.name)
                        results.append(priced(arm, outcome, client))
                except KeyboardInterrupt as stop:
                    finished = [r["arm"] for r in results if r["status"] == "FINISHED"]
                    rest = [a.name for a in arms if a.name not in finished]
                    tracking.describe_stop(
                        stop,
                        f"Arms finished: {', '.join(finished) or 'none'}; "
                        f"stopped or not started: {', '.join(rest) or 'none'}.",
                    )
                    raise
                reference = results[0]
                for r in results:
                    price(r, reference)
                text = log_report(results, parent.info.run_id, host)
                print("\n" + table(results) + "\n\n" + text)
                print(
                    f"MLflow run {parent.info.run_id} in {tracking.tracking_uri()} (its arms nest under it)"
                )
                print(
                    f"Open it: uv run mlflow ui --backend-store-uri {tracking.tracking_uri()}, then "
                    f"{tracking.run_url(parent)}"
                )
        except KeyboardInterrupt as stop:
            return endings.exit_after(stop, stops)
    failed = [r["arm"] for r in results if r["status"] != "FINISHED"]
    return 1 if failed else 0


def _history(client, run_id: str, key: str) -> list[float]:
    return [m.value for m in client.get_metric_history(run_id, key)]


def priced(arm: Arm, outcome, client) -> dict[str, Any]:
    """An arm's figures from its run: the sheet's and the measured peak, held-out accuracy before and
    after, training minutes and decode speed."""
    r: dict[str, Any] = {
        "arm": arm.name,
        "knob": arm.knob,
        "cell": arm.planned.cell.name,
        "values": list(arm.values),
        "status": outcome.run_status or outcome.status,
        "run_id": outcome.run_id,
        "budget_gib": arm.spent_gib,
        "measured_gib": outcome.figures.get("measured_gib"),
    }
    if outcome.run_id is None:
        return r
    metrics = client.get_run(outcome.run_id).data.metrics
    steps = _history(client, outcome.run_id, "step_time")
    speed = _history(client, outcome.run_id, "perf/decode_tokens_per_s")
    r.update(
        {
            "accuracy_base": metrics.get("eval/base_accuracy"),
            "accuracy_adapter": metrics.get("eval/adapter_accuracy"),
            "train_minutes": sum(steps) / 60 if steps else None,
            "step_seconds": statistics.median(steps) if steps else None,
            "tokens_per_s": statistics.median(speed) if speed else None,
        }
    )
    return r


def price(r: dict[str, Any], reference: dict[str, Any]) -> None:
    """What the arm bought: held-out accuracy gained (adapter - base, in points), beyond what the
    recipe gained, per GiB the arm's sheet spent beyond the recipe's; and its whole gain per minute of
    training. The recipe spends nothing: it has no price per GiB."""
    base, adapter = r.get("accuracy_base"), r.get("accuracy_adapter")
    r["gain"] = 100 * (adapter - base) if base is not None and adapter is not None else None
    r["spent_gib"] = r["budget_gib"] - reference["budget_gib"]
    ok = r["gain"] is not None and reference.get("gain") is not None
    r["gain_over_recipe"] = r["gain"] - reference["gain"] if ok else None
    r["gain_per_gib"] = r["gain_over_recipe"] / r["spent_gib"] if ok and r["spent_gib"] > 1e-9 else None
    minutes = r.get("train_minutes")
    r["gain_per_minute"] = r["gain"] / minutes if r["gain"] is not None and minutes else None


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| arm | cell (prompts x group x length) | sheet's peak | measured peak | spent | held-out before -> after | "
        "gained (points) | beyond the recipe | minutes training | tokens/s | points per GiB spent | points per minute |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['arm']} | {r['cell']} | {r['budget_gib']:.2f} GiB | {_fmt(r.get('measured_gib'), '.2f', ' GiB')} | "
            f"{r.get('spent_gib', 0):+.2f} GiB | {_fmt(r.get('accuracy_base'), '.1%')} -> "
            f"{_fmt(r.get('accuracy_adapter'), '.1%')} | {_fmt(r.get('gain'), '+.1f')} | "
            f"{_fmt(r.get('gain_over_recipe'), '+.1f')} | {_fmt(r.get('train_minutes'), '.2f')} | "
            f"{_fmt(r.get('tokens_per_s'), '.0f')} | {_fmt(r.get('gain_per_gib'), '+.1f')} | "
            f"{_fmt(r.get('gain_per_minute'), '+.1f')} |"
        )
    return "\n".join(rows)


def verdict(results: list[dict[str, Any]], host: Host) -> str:
    """Which arm bought the most held-out accuracy per GiB spent, and which per minute of training."""
    spenders = [r for r in results if r.get("gain_per_gib") is not None]
    timed = [r for r in results if r.get("gain_per_minute") is not None]
    if not spenders or not timed:
        return "**No verdict**: an arm has no held-out accuracy before and after (did it finish, with eval_prompts > 0?)."
    per_gib = max(spenders, key=lambda r: r["gain_per_gib"])
    per_minute = max(timed, key=lambda r: r["gain_per_minute"])
    recipe = results[0]
    whose = "the stand-in's, on this CPU host" if host.profile == "cpu" else f"Qwen3-4B's, on {host.note}"
    beyond = f"{per_gib['gain_over_recipe']:+.1f} points beyond the recipe's gain for {per_gib['spent_gib']:+.2f} GiB"
    if per_gib["gain_over_recipe"] > 0:
        by_gib = (
            f"**Most learning per GiB: {per_gib['arm']}** ({per_gib['gain_per_gib']:+.1f} points of held-out "
            f"accuracy per GiB: {beyond})."
        )
    else:  # the largest price per GiB is nothing bought: naming it "most" would crown a tie or a loss
        by_gib = (
            f"**No arm bought learning with its GiB**: none gained more than the recipe (the nearest, "
            f"{per_gib['arm']}: {beyond})."
        )
    return (
        f"{by_gib} **Most per minute: {per_minute['arm']}** "
        f"({per_minute['gain_per_minute']:+.1f} points per minute of training). The recipe alone gained "
        f"{_fmt(recipe.get('gain'), '+.1f')} points at {recipe['budget_gib']:.2f} GiB. Figures are {whose}, "
        "on one seed and one held-out set: a few points are within noise."
    )


def chart(results: list[dict[str, Any]]):
    import matplotlib.pyplot as plt

    fig, (by_gib, by_minute) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        if r.get("gain") is None:
            continue
        by_gib.scatter(r["spent_gib"], r["gain"])
        by_gib.annotate(r["arm"], (r["spent_gib"], r["gain"]), textcoords="offset points", xytext=(4, 4))
        if r.get("train_minutes"):
            by_minute.scatter(r["train_minutes"], r["gain"])
            by_minute.annotate(
                r["arm"], (r["train_minutes"], r["gain"]), textcoords="offset points", xytext=(4, 4)
            )
    by_gib.set(
        xlabel="GiB spent beyond the recipe (the sheet's peak)", ylabel="held-out accuracy gained (points)"
    )
    by_minute.set(xlabel="minutes of training", ylabel="held-out accuracy gained (points)")
    by_gib.set_title("learning per GiB")
    by_minute.set_title("learning per minute")
    fig.tight_layout()
    return fig


def log_report(results: list[dict[str, Any]], parent_run_id: str, host: Host) -> str:
    """The arms on the chapter's run: the record, the table, the chart, a metric per arm and figure,
    and the description (the verdict, the chart, the table), which the Overview opens with."""
    import mlflow

    mlflow.log_dict({"arms": results}, RECORD)
    text_table = table(results)
    mlflow.log_text(text_table + "\n", TABLE)
    mlflow.log_figure(chart(results), CHART)
    for r in results:
        values = {
            f"headroom/{r['arm']}/{key}": r[key]
            for key in (
                "budget_gib",
                "measured_gib",
                "spent_gib",
                "gain",
                "gain_over_recipe",
                "train_minutes",
                "tokens_per_s",
                "gain_per_gib",
                "gain_per_minute",
            )
            if r.get(key) is not None
        }
        mlflow.log_metrics(values)
    text = verdict(results, host)
    link = f"get-artifact?path={CHART.replace('/', '%2F')}&run_uuid={parent_run_id}"
    mlflow.set_tag(
        "mlflow.note.content",
        f"{text}\n\n![held-out accuracy gained per GiB and per minute]({link})\n\n{text_table}",
    )
    return text
