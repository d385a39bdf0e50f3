"""MLflow tracking for the labs: where runs go, what every run records, how a run ends.

Runs go to `MLFLOW_TRACKING_URI` when it is set, else to `mlflow.db` (SQLite) at the
repository root; a SQLite store keeps its artifacts beside it under `mlruns/<chapter>`.
The README's UI command opens that same store. One experiment per chapter.

A run that does not finish never says FINISHED: `lab_run` ends it as KILLED on Ctrl-C
and FAILED on any exception, keeping what was logged before.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def lab_run(
    chapter: str, run_name: str, tags: dict[str, str], system_metrics_interval_s: float | None = None
) -> Iterator[object]:
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
        tags=tags,
        log_system_metrics=system_metrics_interval_s is not None,
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


def device_description() -> dict[str, str]:
    """GPU name and driver from torch and NVML, or "cpu"."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": "cpu", "gpu_driver": "cpu", "gpu_memory_gib": "0"}
    info = {"gpu_name": torch.cuda.get_device_name(0), "cuda_runtime": str(torch.version.cuda)}
    try:
        import pynvml

        pynvml.nvmlInit()
        info["gpu_driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info["gpu_memory_gib"] = f"{pynvml.nvmlDeviceGetMemoryInfo(handle).total / 1024**3:.2f}"
        pynvml.nvmlShutdown()
    except Exception as exc:  # a driver without NVML still trains; say so rather than fail
        info["gpu_driver"] = f"unknown ({type(exc).__name__})"
    return info


def numeric_metrics(logs: dict) -> dict[str, float]:
    """The finite numbers of a Trainer log dict, under MLflow-safe names."""
    out = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def log_run_context(settings, sheet) -> None:
    """Everything needed to reproduce and read the run: config, environment, device."""
    import mlflow

    mlflow.log_params(settings.as_params())
    mlflow.set_tags(
        {
            "uv_lock_sha256": lock_hash(),
            **library_versions(),
            **device_description(),
            "budget_card": settings.gpu,
        }
    )
