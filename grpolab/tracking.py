"""MLflow tracking for the labs: where runs go, what every run records, how a run ends.

Runs go to `MLFLOW_TRACKING_URI` when it is set, else to `mlflow.db` (SQLite) at the repository
root; a SQLite store keeps its artifacts beside it under `mlruns/<chapter>`. The README's UI
command opens that same store. One experiment per chapter.

A run that does not finish never says FINISHED: `lab_run` ends it as KILLED on Ctrl-C and FAILED on
any exception, keeping what was logged before. Each budget line is logged as a section of its own
(`kv_cache/budget`, `kv_cache/measured`, ...) so the UI's metrics view shows the pair together.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from budgets.units import GIB

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = REPO_ROOT / "mlflow.db"

LIBRARIES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "unsloth",
    "unsloth_zoo",
    "vllm",
    "vllm-bnb-plugin",
    "bitsandbytes",
    "datasets",
    "mlflow",
)


def tracking_uri() -> str:
    """The store every lab, notebook and the README's UI command share."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{DEFAULT_DB}"


def use_store() -> str:
    """Point MLflow at the lab store; returns its URI."""
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    return uri


def experiment_id(chapter: str) -> str:
    """The chapter's experiment, created on first use (artifacts under mlruns/ for the default store)."""
    import mlflow

    use_store()
    found = mlflow.get_experiment_by_name(chapter)
    if found is not None:
        return found.experiment_id
    return mlflow.create_experiment(chapter, artifact_location=artifact_location(tracking_uri(), chapter))


def artifact_location(uri: str, chapter: str) -> str | None:
    """Artifacts beside a SQLite store (mlruns/<chapter> next to the .db file), wherever the
    lab was started from; a tracking server decides for itself (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlruns" / chapter).as_uri()
    return None


def process_tags() -> dict[str, str]:
    """What identifies the process that owns a run: whether it is still alive can be checked later."""
    import psutil

    me = psutil.Process()
    return {
        "process.host": socket.gethostname(),
        "process.pid": str(me.pid),
        "process.start_time": f"{me.create_time():.2f}",
    }


@contextmanager
def lab_run(
    chapter: str,
    run_name: str,
    tags: dict[str, str],
    system_metrics_interval_s: float | None = None,
    nested: bool = False,
) -> Iterator[Any]:
    """Start an MLflow run and end it with the status it earned: FINISHED, FAILED or KILLED.

    With `system_metrics_interval_s`, MLflow's own system metrics (CPU, RAM, and GPU memory
    through NVML) are sampled at that interval beside the lab's probe.
    """
    import mlflow

    if system_metrics_interval_s is not None:
        mlflow.set_system_metrics_sampling_interval(system_metrics_interval_s)
    run = mlflow.start_run(
        experiment_id=experiment_id(chapter),
        run_name=run_name,
        tags={**tags, **process_tags()},
        log_system_metrics=system_metrics_interval_s is not None,
        nested=nested,
    )
    try:
        yield run
    except KeyboardInterrupt:
        mlflow.end_run(status="KILLED")
        raise
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    else:
        mlflow.end_run(status="FINISHED")


def run_url(run, host: str = "http://127.0.0.1:5000") -> str:
    """The run's page in the README's UI command."""
    return f"{host}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"


def lock_hash(path: Path = REPO_ROOT / "uv.lock") -> str:
    """sha256 of uv.lock: which exact environment produced the run."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[f"version/{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[f"version/{name}"] = "not installed"
    return versions


def log_context(settings, device, card_note: str) -> None:
    """Everything needed to reproduce and read the run: the settings, the environment, the device."""
    import mlflow

    mlflow.log_params(settings.as_params())
    mlflow.set_tags(
        {
            "uv_lock_sha256": lock_hash(),
            **library_versions(),
            **device.tags(),
            "budget_card": card_note,
            "overridden": ",".join(sorted(settings.overridden)) or "none",
        }
    )


def log_trainer_args(args) -> None:
    """The trainer's effective arguments (what really trains, after Unsloth's and TRL's defaults)."""
    import mlflow

    effective = {k: v for k, v in args.to_dict().items() if not k.startswith("_") and "token" not in k}
    mlflow.log_dict(effective, "trainer/effective_args.json")
    params = {
        f"trainer.{k}": str(v)[:500] for k, v in effective.items() if isinstance(v, (int, float, str, bool))
    }
    mlflow.log_params(params)


def log_sheet(sheet) -> None:
    """Every line as `<line>/budget` in GiB, the total and capacity, and the sheet as artifacts."""
    import mlflow

    metrics = {f"{line.name}/budget": line.bytes / GIB for line in sheet.lines}
    metrics["total/budget"] = sheet.total_bytes / GIB
    metrics["total/capacity"] = sheet.capacity_bytes / GIB
    mlflow.log_metrics(metrics, step=0)
    mlflow.set_tag("budget_fits", str(sheet.fits))
    mlflow.log_text(sheet.table(), "budget/sheet.txt")
    mlflow.log_dict(sheet.to_dict(), "budget/sheet.json")


def log_comparison(c, figure, extra_metrics: dict[str, float], labels: dict[str, str], note: str) -> None:
    """`<line>/measured`, `/diff`, `/rel_error` beside each `<line>/budget`, the totals, the table,
    the chart, and the verdict as the run's description."""
    import mlflow

    from grpolab import comparison

    metrics = dict(extra_metrics)
    for name in c.paired:
        metrics[f"{name}/measured"] = c.measured[name] / GIB
        metrics[f"{name}/diff"] = c.diff(name) / GIB
        metrics[f"{name}/rel_error"] = c.rel_error(name)
    for name, value in c.unpaired_measured.items():
        metrics[f"unpaired/{name}"] = value / GIB
    metrics["total/measured"] = c.total_measured / GIB
    metrics["total/budget_compared"] = c.total_budget / GIB
    metrics["total/rel_error"] = c.total_rel_error
    metrics["total/unattributed"] = c.unattributed / GIB
    mlflow.log_metrics(metrics)
    mlflow.set_tags(
        {
            "memory_labels": json.dumps(labels),
            "budget_unmeasured_lines": ",".join(c.unmeasured) or "none",
            "measured_unpaired": ",".join(c.unpaired_measured) or "none",
            "mlflow.note.content": note,
        }
    )
    mlflow.log_text(comparison.table(c), "memory/budget_vs_measured.md")
    if figure is not None:
        mlflow.log_figure(figure, "memory/budget_vs_measured.png")


def run_name(profile: str) -> str:
    """Unique even for two runs started in the same second."""
    return f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
