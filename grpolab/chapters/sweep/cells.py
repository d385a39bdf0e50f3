"""Running one cell: the chapter's `train.py cell ...` in a process of its own, and what became of it.

A process per cell, so that its peak is its own: the probe reads the process's resident set (CPU)
or its device memory (GPU), which a previous cell in the same process would have left high. On a
machine without a GPU the cell's process is forked from a server that imported the stack once
(grpolab.lab.forkserver: most of a minute of CPU saved per cell on 2 cores); on a GPU it starts fresh,
as CUDA does not survive a fork. The cell is an ordinary lab run through the harness, nested under
the sweep's MLflow run, given a folder of its own (`--output-dir`); its run writes `result.json`
there (grpolab.memory.run_result), and that file is what the sweep reads back. A cell that died before
writing it is reported by its exit code and its last line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from grpolab.chapters.sweep.grid import Planned
from grpolab.chapters.sweep.report import Outcome, figures, status_text
from grpolab.config.paths import REPO_ROOT
from grpolab.lab.forkserver import PIPE, STDOUT, ForkServer
from grpolab.lifecycle.endings import EXIT_BAD_INPUT, STOPS
from grpolab.memory import run_result


class Exited(NamedTuple):
    """How a cell's process ended."""

    code: int
    last_line: str  # the one-line refusal or out-of-memory message, when there is one
    pid: int


def run_cell(
    lab_dir: Path,
    planned: Planned,
    parent_run_id: str,
    forward: list[str],
    extra: Sequence[str] = (),
    server: ForkServer | None = None,
) -> Exited:
    """The chapter's `train.py cell ...` in a process of its own (forked from `server` when there is
    one, else fresh), its output passed through."""
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
    if server is not None:
        process = server.run(
            command[1], command[2:], env={"PYTHONUNBUFFERED": "1"}, cwd=REPO_ROOT, stdout=PIPE, stderr=STDOUT
        )
    else:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=PIPE, stderr=STDOUT, text=True)
    tail: deque[str] = deque(maxlen=20)
    try:
        with STOPS.at_once():  # the sweep only waits here: a signal is acted on now, and passed on
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
    return Exited(code, errors[-1] if errors else (tail[-1] if tail else ""), process.pid)


def result_path(folder: Path, chapter: str) -> Path | None:
    """The result file of the one run in a cell's own folder (the harness puts a run's files in
    <output-dir>/<chapter>/<run name>/), or None when the run wrote none."""
    found = sorted((folder / chapter).glob(f"*/{run_result.NAME}"))
    return found[-1] if found else None  # one run per folder; run names sort by their start


def outcome(client, parent, planned: Planned, exited: Exited, folder: Path) -> Outcome:
    """What became of a cell that was started, from its result file; its run (when it has one) named
    after the cell and tagged with what became of it."""
    found = result_path(folder, planned.settings.chapter)
    result = run_result.read(found) if found is not None else None
    o = Outcome(planned, "ran" if planned.fits else "ran anyway", exited.code, last_line=exited.last_line)
    if result is not None:
        o.run_id, o.run_status, o.figures = result["run_id"], result["status"], figures(result)
    else:
        run = _run_without_result(client, parent, exited.pid)
        if run is None:  # it never opened a run: refused by its own sheet, or an error before it
            o.status = "refused by its own sheet" if exited.code == EXIT_BAD_INPUT else "failed"
            return o
        o.run_id, o.run_status = run.info.run_id, run.info.status
    _tag(client, o)
    if planned.fits and o.run_status != "FINISHED":
        o.status = "failed"
    return o


def _run_without_result(client, parent, pid: int) -> Any:
    """The run a cell's process opened and left without a result file (a crash, SIGKILL): the
    sweep's child whose process tags are that process's."""
    found = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.`process.pid` = '{pid}' "
        f"and tags.`process.host` = '{socket.gethostname()}'",
    )
    return found[0] if found else None


def _tag(client, o: Outcome) -> None:
    client.update_run(o.run_id, name=f"cell {o.planned.cell.name}")
    client.set_tag(o.run_id, "sweep.cell", o.planned.cell.name)
    client.set_tag(o.run_id, "sweep.status", status_text(o))
