"""`python -m grpolab runs`: the runs left RUNNING in the lab's MLflow store, whose process lives, and
the interrupted runs a lab can resume.

    uv run python -m grpolab runs                # each RUNNING run: alive, dead, another host's, unknown;
                                                 # each interrupted run with its last checkpoint
    uv run python -m grpolab runs --reconcile    # end KILLED those whose process died (SIGKILL, OOM killer)

The store is `MLFLOW_TRACKING_URI`, else the repository's mlflow.db (the labs' store). A run is
ended only when it names a process of this host (tags process.host, process.pid,
process.start_time) that no longer exists; runs of live processes, of other hosts and runs without
those tags are listed, never touched. Each lab does the same reconciliation when it starts.

May import: task, budgets, grpolab.config, grpolab.lifecycle.
"""

from __future__ import annotations

import argparse
import sys

from grpolab.config.errors import EXIT_BAD_INPUT, refuse
from grpolab.lifecycle import endings, store, tracking

STATES = {
    "alive": "its process is alive",
    "dead": "its process died without closing it",
    "other host": "from another host: not checked",
    "unknown": "no process tags: not a lab run, not checked",
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m grpolab", description=__doc__.split("\n\n")[0])
    commands = ap.add_subparsers(dest="command", required=True)
    runs = commands.add_parser(
        "runs",
        help="list the runs left RUNNING and whether their process lives, and the interrupted runs to resume",
    )
    runs.add_argument(
        "--reconcile",
        action="store_true",
        help="end KILLED the runs whose process died without closing them (SIGKILL, the OOM killer, a power "
        "loss), with the last step and peak memory they logged",
    )
    return ap


def runs(reconcile: bool) -> int:
    uri = tracking.tracking_uri()
    try:
        store.require(uri)
    except store.StoreError as err:
        return refuse(err)
    path = store.sqlite_path(uri)
    if path is not None and not path.exists():
        print(f"No MLflow store at {path} yet: no runs.")
        return 0
    client = tracking.client()
    found = endings.open_runs(client)
    interrupted(client)
    if not found:
        print(f"No run left RUNNING in {uri}.")
        return 0
    for run, experiment, state in found:
        tags = run.data.tags
        owner = f"pid {tags.get('process.pid', '?')} on {tags.get('process.host', '?')}"
        print(f"{experiment}/{run.info.run_name} ({run.info.run_id}), {owner}: {STATES[state]}")
    dead = [run for run, _, state in found if state == "dead"]
    if reconcile:
        for run in dead:
            print(endings.end_dead_run(client, run))
    elif dead:
        print(
            f"{len(dead)} run(s) whose process died: end them KILLED with `python -m grpolab runs --reconcile`"
        )
    return 0


def interrupted(client) -> None:
    """The runs that ended KILLED or FAILED and left a whole checkpoint here, newest first, each with
    the command that resumes it."""
    from grpolab.lifecycle.checkpoints import resume_hint

    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return
    found = client.search_runs(
        list(experiments),
        "tags.run_kind = 'train' and attributes.status != 'FINISHED' and attributes.status != 'RUNNING'",
        order_by=["attributes.start_time DESC"],
        max_results=200,
    )
    lines = []
    for run in found:
        hint = resume_hint(run)
        if hint:
            ending = run.data.tags.get("ending", run.info.status)
            lines.append(
                f"{experiments[run.info.experiment_id]}/{run.info.run_name} ({run.info.run_id}), "
                f"{run.info.status} ({ending}): {hint}"
            )
    if lines:
        print("Interrupted runs that can be resumed:\n" + "\n".join(f"  {line}" for line in lines))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "runs":
        return runs(args.reconcile)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
