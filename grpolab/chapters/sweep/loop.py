"""The sweep's loop: one MLflow run for the sweep, every planned cell run or refused under it, the
report logged on it.

Cells run one at a time, each in a folder of its own under the sweep's
(`<output-dir>/<chapter>/<sweep run>/<cell>/`), where its run leaves its adapter and its result file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from budgets.units import GIB
from grpolab.chapters.sweep import cells, report
from grpolab.chapters.sweep.grid import CELL_SETTINGS, KNOBS, Grid, Planned
from grpolab.chapters.sweep.host import Host
from grpolab.chapters.sweep.report import Outcome
from grpolab.config.settings import FLAGS, flag, flag_text

EXIT_CELL_FAILED = 1


def run_sweep(
    lab_dir: Path,
    args: argparse.Namespace,
    host: Host,
    grid: Grid,
    planned: list[Planned],
    edge: Planned | None,
    overrides: dict[str, Any],
) -> int:
    """Run every cell that fits (and, with --run-refused, the edge) under one sweep run; log the grid.
    Returns 0, or EXIT_CELL_FAILED when a cell that should have run did not finish."""
    from grpolab.lifecycle import endings

    runs = sum(p.fits for p in planned) + (1 if args.run_refused and edge is not None else 0)
    # Signals are recorded (grpolab.lifecycle.endings.STOPS) and acted on before each cell, and at once while
    # the sweep only waits on a cell (which is then given the same signal).
    with endings.STOPS.armed() as stops:
        try:
            stops.enter("the sweep's start")
            with cell_processes(runs) as server:  # before the store opens: the server has nothing to share
                return _run(lab_dir, args, host, grid, planned, edge, overrides, server)
        except KeyboardInterrupt as stop:
            return endings.exit_after(stop, stops)


@contextmanager
def cell_processes(runs: int) -> Iterator[Any]:
    """Where the cells' processes are forked from, on a machine without a GPU: the server this process
    was given (`GRPOLAB_FORKSERVER`: a sweep started from one), else, for more than one cell, one of its
    own, which imports the stack once for them all (grpolab.lab.forkserver). None on a GPU, where each cell
    starts fresh."""
    from grpolab.lab import forkserver

    server = None
    if runs and forkserver.available():
        server = forkserver.ForkServer.connect() or (forkserver.ForkServer.start() if runs > 1 else None)
    try:
        yield server
    finally:
        if server is not None:
            server.close()


def _run(lab_dir, args, host, grid, planned, edge, overrides, server) -> int:
    import mlflow

    from grpolab.lifecycle import tracking

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
        folder = args.output_dir / settings.chapter / parent.info.run_name
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
        try:
            _cells(lab_dir, args, host, planned, edge, overrides, server, parent, client, folder, outcomes)
        except KeyboardInterrupt as stop:
            _stopped(stop, planned, outcomes)
            raise
        edge_outcome = next((o for o in outcomes if edge is not None and o.planned is edge), None)
        text, metrics = report.verdict(outcomes, edge_outcome)
        _log_sweep(outcomes, host, text, metrics, edge_outcome)
        print("\n" + report.table(outcomes, host, text))
        print(f"MLflow sweep run {parent.info.run_id} in {tracking.tracking_uri()} (its cells nest under it)")
        print(
            f"Open it: uv run mlflow ui --backend-store-uri {tracking.tracking_uri()}, then {tracking.run_url(parent)}"
        )
    failed = [o for o in outcomes if o.status in ("failed", "refused by its own sheet")]
    return EXIT_CELL_FAILED if failed else 0


def _cells(lab_dir, args, host, planned, edge, overrides, server, parent, client, folder, outcomes) -> None:
    """Each cell in turn, or refused; what became of each appended to `outcomes`."""
    from grpolab.lifecycle.endings import STOPS

    for p in planned:
        STOPS.enter(f"the sweep, before cell {p.cell.name}")
        is_edge = edge is not None and p is edge
        if not p.fits and not (is_edge and args.run_refused):
            outcomes.append(Outcome(p, "refused"))
            continue
        extra = []
        if not p.fits:  # the edge, run anyway
            extra = ["--ignore-budget"]
            if host.memory_cap_gib is not None:
                extra += ["--memory-cap-gib", f"{host.memory_cap_gib:g}"]
        own = folder / p.cell.name  # the cell's run is the only one in it: its result is found there
        exited = cells.run_cell(lab_dir, p, parent.info.run_id, _forwarded(own, overrides), extra, server)
        outcomes.append(cells.outcome(client, parent, p, exited, own))


def _stopped(stop: KeyboardInterrupt, planned: list[Planned], outcomes: list[Outcome]) -> None:
    """A stopped sweep says which cells finished, which was stopped and which never started: on its
    run (its description, after the signal) and on stderr."""
    from grpolab.lifecycle import tracking

    done = {id(o.planned): o for o in outcomes}
    finished = [o.planned.cell.name for o in outcomes if o.run_status == "FINISHED"]
    other = [f"{o.planned.cell.name} ({o.status})" for o in outcomes if o.run_status != "FINISHED"]
    rest = [p.cell.name for p in planned if id(p) not in done]
    tracking.describe_stop(
        stop,
        f"Cells finished: {', '.join(finished) or 'none'}; others: {', '.join(other) or 'none'}; "
        f"stopped or not started: {', '.join(rest) or 'none'}.",
    )


def _forwarded(output_dir: Path, overrides: dict[str, Any]) -> list[str]:
    """What a cell is given besides its own settings: its folder and the settings the sweep's
    command line changed."""
    words = ["--output-dir", str(output_dir)]
    for name, value in overrides.items():
        words += [flag(name), flag_text(value)]
    return words


def _log_sweep(
    outcomes: list[Outcome], host: Host, text: str, metrics: dict[str, float], edge: Outcome | None
) -> None:
    """The report on the sweep's run: a point per cell, the verdict's numbers, the grid as data, the
    table, the chart, the refused cells, and the verdict as the run's description."""
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
    mlflow.log_dict(report.cells_record(outcomes, host, text, edge), "sweep/cells.json")
    mlflow.log_text(report.table(outcomes, host, text), "sweep/budget_vs_measured.md")
    mlflow.log_figure(report.chart(outcomes, host), "sweep/budget_vs_measured.png")
    refused = [o for o in outcomes if not o.planned.fits]
    mlflow.set_tags(
        {
            "sweep.refused": ", ".join(f"{o.planned.cell.name}: {o.planned.binding}" for o in refused)
            or "none",
            "mlflow.note.content": text,
        }
    )
