"""What chapter 6 ships: a finished training run of chapter 1, its adapter and the settings it trained.

    --from last        chapter 1's latest FINISHED training run in the store (the default)
    --from RUN_ID      a training run of this store, by its id
    --from FOLDER      an adapter folder a lab run saved (outputs/grpo-first/<run>/adapter), or its run's
                       folder: the run that trained it is found in the store by its folder

Every refusal is one line that says what to do (LabSettingsError), before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.config.errors import LabSettingsError
from grpolab.config.settings import LabSettings

SOURCE_CHAPTER = "grpo-first"  # what the book ships: chapter 1's adapter
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass
class Source:
    """A finished training run and what shipping it needs from it."""

    run: Any  # mlflow.entities.Run
    adapter_dir: Path
    settings: LabSettings  # as the run logged them: the same task, held-out prompts and lengths

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def logged(self, key: str) -> float | None:
        """A metric the training run logged (its last value), or None."""
        return self.run.data.metrics.get(key)

    @property
    def adapter_accuracy(self) -> float | None:
        return self.logged("eval/adapter_accuracy")

    @property
    def base_accuracy(self) -> float | None:
        return self.logged("eval/base_accuracy")


def find(target: str, client, lab_dir: Path, profile: str) -> Source:
    """The training run `target` names and its adapter, or a one-line LabSettingsError."""
    from grpolab.lifecycle.resume import logged_settings

    run = _run_of(target, client)
    tags = run.data.tags
    if tags.get("run_kind", "train") != "train" or run.info.status != "FINISHED":
        raise LabSettingsError(
            f"ship: run {run.info.run_id} is a {tags.get('run_kind', 'train')} run that ended "
            f"{run.info.status}: pass a FINISHED training run (`--from last` takes the latest)"
        )
    if "eval/adapter_accuracy" not in run.data.metrics:
        raise LabSettingsError(
            f"ship: run {run.info.run_id} logged no held-out evaluation (eval/adapter_accuracy): it trained "
            "with --eval-prompts 0; train again with held-out prompts, or pass another run"
        )
    ran = tags.get("profile", "")
    if profile != "auto" and ran and ran != profile:
        raise LabSettingsError(
            f"ship: run {run.info.run_id} trained the {ran} profile, not {profile}: pass --profile {ran}, "
            "or a run of that profile"
        )
    adapter = _adapter_of(run, client)
    settings = logged_settings(lab_dir, run)
    return Source(run, adapter, settings)


def check_shape(source: Source) -> None:
    """The adapter must be the one the run's settings describe (its rank, alpha and target modules):
    another shape would load beside the base and be scored as if it were the run's."""
    import json

    from grpolab.lifecycle.checkpoints import lora_shape_differences

    config = json.loads((source.adapter_dir / "adapter_config.json").read_text())
    differ = lora_shape_differences(config, source.settings)
    if differ:
        raise LabSettingsError(
            f"ship: the adapter at {source.adapter_dir} holds another LoRA shape ({'; '.join(differ)}) than "
            f"run {source.run_id} trained: pass the adapter that run saved"
        )


def _run_of(target: str, client):
    from mlflow.exceptions import MlflowException

    from grpolab.lifecycle.resume import run_trained_in

    if target == "last":
        experiment = client.get_experiment_by_name(SOURCE_CHAPTER)
        found = (
            client.search_runs(
                [experiment.experiment_id],
                "tags.run_kind = 'train' and attributes.status = 'FINISHED'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if experiment is not None
            else []
        )
        if not found:
            raise NoFinishedRun(
                f"ship: no FINISHED run of {SOURCE_CHAPTER} in this store: run "
                "`uv run python labs/grpo-first/train.py` first, or pass --from RUN_ID or an adapter folder"
            )
        return found[0]
    path = Path(target).expanduser()
    if path.is_dir():
        folder = path.resolve()
        run_folder = folder.parent if (folder / ADAPTER_FILES[0]).is_file() else folder
        found = run_trained_in(client, run_folder)
        if found is not None:
            return found
        raise LabSettingsError(
            f"ship: no run of this store trained {folder}: its held-out score is what each stage is checked "
            "against, so pass the folder a lab run of this store printed, its run id, or `last`"
        )
    try:
        return client.get_run(target)
    except MlflowException:
        raise LabSettingsError(
            f"ship: {target!r} is neither a run id of this store nor a folder: pass `last`, a training run's "
            "id, or the adapter folder it saved"
        ) from None


def _adapter_of(run, client) -> Path:
    """The adapter the run saved: in its folder, or, when that folder is gone, its logged artifact,
    fetched once into the cache (`.cache/adapters/<run id>`, written whole or not at all)."""
    import shutil
    import tempfile

    from grpolab.config.paths import cache_root

    folder = Path(run.data.tags.get("output_dir", "")) / "adapter"
    cached = cache_root() / "adapters" / run.info.run_id
    for found in (folder, cached):
        if all((found / name).is_file() for name in ADAPTER_FILES):
            return found
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{run.info.run_id}-", dir=cached.parent))
    try:
        fetched = Path(client.download_artifacts(run.info.run_id, "adapter", str(partial)))
        if all((fetched / name).is_file() for name in ADAPTER_FILES):
            fetched.rename(cached)
            return cached
    except Exception:
        pass  # no such artifact: said below
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    raise LabSettingsError(
        f"ship: run {run.info.run_id} left no adapter (not in {folder}, nor among its artifacts): "
        "pass a run whose adapter is there"
    )


class NoFinishedRun(LabSettingsError):
    """No training run to ship: on a CPU the chapter trains the short form first."""
