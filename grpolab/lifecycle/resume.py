"""`--resume`: continue an interrupted run from its newest whole checkpoint, in the same MLflow run.

    uv run python labs/grpo-first/train.py --resume last              # the chapter's latest interrupted run
    uv run python labs/grpo-first/train.py --resume <run id>          # as the stopped run printed it
    uv run python labs/grpo-first/train.py --resume outputs/grpo-first/cpu-20261202-101500-4242

A run is interrupted when it did not finish: KILLED (a signal; a process that died, once reconciled)
or FAILED (out of memory, an error), or left RUNNING by a process that no longer exists. Its settings
are the ones it logged: the command line may change only what does not change the training (the
held-out evaluation, logging, checkpointing, and how memory is shared: the card, vLLM's share,
standby, gradient checkpointing); any other difference is refused in one line that names it. The
trainer restores the adapter, the optimizer and scheduler, the RNG states, the data order and the
step counter from the checkpoint (grpolab.lifecycle.checkpoints); the harness reopens the MLflow run, so its
curves, its memory and the doctor's reading cover the whole history.

Every refusal is one line (LabSettingsError, exit 2) before anything is written: no checkpoint, a
run that FINISHED or is still running, a run of another chapter, a checkpoint of another model or
LoRA shape. A half-written newest checkpoint is skipped with a word, and the one before it used.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgets.vocabulary import flag, flag_text
from grpolab.config.errors import LabSettingsError
from grpolab.config.settings import FIELDS, FLAGS, LabSettings, lab_settings
from grpolab.lifecycle.checkpoints import Checkpoint, adapter_config, checkpoints, lora_shape_differences

# Settings a resumed run may change: none of them changes what is trained, only what is measured,
# logged and saved, and how memory is shared (an out-of-memory run resumes with less).
NEUTRAL = (
    "eval_prompts",
    "logging_steps",
    "save_steps",
    "gpu",
    "gpu_memory_utilization",
    "unsloth_vllm_standby",
    "other_processes_gib",
    "use_gradient_checkpointing",
)
INTERRUPTED = ("KILLED", "FAILED")
TAG = "resumes"  # the run's resumes, as JSON: when, from which checkpoint and step, what changed


@dataclass
class Resume:
    """An interrupted run to continue: its MLflow run, its folder, the checkpoint, its logged settings."""

    run: Any  # mlflow.entities.Run
    output_dir: Path
    checkpoint: Checkpoint
    skipped: list[str] = field(default_factory=list)  # half-written checkpoints passed over, with why
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)  # setting -> (logged, now)

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def params(self) -> dict[str, str]:
        return self.run.data.params

    @property
    def tags(self) -> dict[str, str]:
        return self.run.data.tags

    @property
    def profile(self) -> str:
        return self.tags.get("profile") or self.params.get("profile", "")

    def logged_steps(self, client) -> tuple[int, int]:
        """The last step the run logged at a step's end (its peak) and in the trainer's logs (the loss):
        its steps after the checkpoint are trained again, not logged again (a metric point in MLflow
        cannot be removed). Two figures: a process killed between the two logged one and not the other."""
        return tuple(
            max((p.step for p in client.get_metric_history(self.run_id, key)), default=0)
            for key in ("memory/step_peak_gib", "loss")
        )

    def settings(self, lab_dir: Path, overrides: dict[str, Any]) -> LabSettings:
        """The run's logged settings with what the command line changed; a change that would change
        the training is refused, naming each."""
        settings = logged_settings(lab_dir, self.run, overrides)
        differ = {
            name: (self.params[name], flag_text(getattr(settings, name)))
            for name in FIELDS
            if name in self.params and self.params[name] != flag_text(getattr(settings, name))
        }
        refused = {name: pair for name, pair in differ.items() if name not in NEUTRAL}
        if refused:
            listed = "; ".join(f"{name} {old} -> {new}" for name, (old, new) in refused.items())
            raise LabSettingsError(
                f"resume: run {self.run_id} trained with other settings ({listed}): these change what is "
                f"trained, so drop {', '.join(flag(n) for n in refused)} (only {', '.join(flag(n) for n in NEUTRAL)} "
                "may change on resume), or start a new run"
            )
        self.changed = differ
        original = {n for n in self.tags.get("overridden", "").split(",") if n and n != "none"}
        settings = settings.replace(overridden=frozenset(original | set(overrides)))
        _check_checkpoint(self.checkpoint, settings)
        return settings

    def record(self) -> dict[str, Any]:
        """This resume, as the run's tag `resumes` keeps it."""
        return {
            "at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "from_step": self.checkpoint.step,
            "checkpoint": self.checkpoint.name,
            "after": self.tags.get("ending")
            or ("process died" if self.run.info.status == "RUNNING" else self.run.info.status),
            "changed": {name: f"{old} -> {new}" for name, (old, new) in self.changed.items()},
            "skipped": self.skipped,
        }


def logged_settings(lab_dir: Path, run: Any, overrides: dict[str, Any] | None = None) -> LabSettings:
    """A run's settings as it logged them (each setting's param read back as its flag would be), under
    the profile it ran, with `overrides` on top: what resuming it continues, what shipping it scores."""
    from grpolab.config.flags import parser

    params, tags = run.data.params, run.data.tags
    logged = {name: params[name] for name in FLAGS if name in params}
    argv = [part for name, text in logged.items() for part in (flag(name), text)]
    as_logged = {name: value for name, value in vars(parser("").parse_args(argv)).items() if name in logged}
    profile = tags.get("profile") or params.get("profile", "")
    return lab_settings(lab_dir, profile, {**as_logged, **(overrides or {})})


def find(target: str, chapter: str, client) -> Resume:
    """The interrupted run `target` names (`last`, a run id, or a run folder) and its newest whole
    checkpoint, or a one-line LabSettingsError."""
    from grpolab.lifecycle import endings

    run = _run_of(target, chapter, client)
    name = f"run {run.info.run_id} ({run.info.run_name})"
    owner = run.data.tags.get("chapter", "")
    if owner != chapter:
        raise LabSettingsError(
            f"resume: {name} is chapter {owner or 'unknown'}'s, not {chapter}'s: resume it with "
            f"labs/{owner}/train.py --resume {run.info.run_id}"
            if owner
            else f"resume: {name} is not a lab run (no chapter tag): pass a run this chapter trained"
        )
    if run.data.tags.get("run_kind", "train") != "train":
        raise LabSettingsError(
            f"resume: {name} is a {run.data.tags['run_kind']} run, not a training run: pass a run this chapter trained"
        )
    status = run.info.status
    if status == "FINISHED":
        raise LabSettingsError(
            f"resume: {name} FINISHED all its steps: nothing to resume (start a new run to train longer)"
        )
    if status == "RUNNING" and endings.process_state(run.data.tags) != "dead":
        pid = run.data.tags.get("process.pid", "?")
        raise LabSettingsError(
            f"resume: {name} is still RUNNING (process {pid}): stop it first, or wait for it to end"
        )
    folder = Path(run.data.tags.get("output_dir", ""))
    if not run.data.tags.get("output_dir") or not folder.is_dir():
        raise LabSettingsError(
            f"resume: {name} has no run folder here ({folder or 'no output_dir tag'}): run the resume where it trained"
        )
    whole, partial = checkpoints(folder)
    newest_whole = whole[-1].step if whole else -1
    skipped = [
        f"{c.name} is half-written (no {', '.join(lacks)}): skipped"
        for c, lacks in partial
        if c.step > newest_whole
    ]
    if not whole:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        raise LabSettingsError(
            f"resume: {name} left no whole checkpoint in {folder}{why}: it stopped before its first saved "
            "step; start a new run (a lower --save-steps saves more often)"
        )
    return Resume(run, folder, whole[-1], skipped)


def _run_of(target: str, chapter: str, client):
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(chapter)
    if target == "last":
        if experiment is None:
            raise LabSettingsError(f"resume: no run of {chapter} in this store yet: nothing to resume")
        found = client.search_runs(
            [experiment.experiment_id],
            "tags.run_kind = 'train' and attributes.status != 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=50,
        )
        from grpolab.lifecycle import endings

        found = [
            r for r in found if r.info.status != "RUNNING" or endings.process_state(r.data.tags) == "dead"
        ]
        if not found:
            raise LabSettingsError(
                f"resume: no interrupted run of {chapter} in this store (every run finished or is running): "
                "`python -m grpolab runs` lists them"
            )
        return found[0]
    path = Path(target).expanduser()
    if path.is_dir():
        found = run_trained_in(client, path)
        if found is not None:
            return found
        raise LabSettingsError(
            f"resume: no run of this store trained in {path.resolve()}: pass the folder a lab run printed, its run id, "
            "or `last`"
        )
    try:
        return client.get_run(target)
    except MlflowException:
        raise LabSettingsError(
            f"resume: {target!r} is neither a run folder nor a run id of this store: pass `last`, the run id the "
            "stopped run printed, or its folder (outputs/<chapter>/<run>)"
        ) from None


def run_trained_in(client, folder: Path):
    """The run of this store whose output folder (tag `output_dir`) is `folder`, or None."""
    resolved = str(Path(folder).expanduser().resolve())
    for experiment in client.search_experiments():
        runs = client.search_runs(
            [experiment.experiment_id], f"tags.output_dir = '{resolved}'", max_results=1
        )
        if runs:
            return runs[0]
    return None


def _check_checkpoint(checkpoint: Checkpoint, settings: LabSettings) -> None:
    """The checkpoint's adapter must be this run's: the same LoRA rank, alpha and target modules (the
    base model is the run's, checked with its settings)."""
    try:
        config = adapter_config(checkpoint)
    except (OSError, json.JSONDecodeError) as err:
        raise LabSettingsError(
            f"resume: {checkpoint.path} has no readable adapter_config.json ({err})"
        ) from None
    differ = lora_shape_differences(config, settings)
    if differ:
        raise LabSettingsError(
            f"resume: {checkpoint.path} holds another LoRA shape ({'; '.join(differ)}): it is not this run's "
            "checkpoint; remove it, or resume the run that wrote it"
        )


def history_text(resumes: list[dict[str, Any]]) -> str:
    """The resumes as the run's description lists them."""
    lines = []
    for r in resumes:
        changed = "; ".join(f"{k} {v}" for k, v in r.get("changed", {}).items())
        lines.append(
            f"Resumed {r['at']} from {r['checkpoint']} (step {r['from_step']}) after it ended {r['after']}"
            + (f"; changed: {changed}" if changed else "")
            + "."
        )
    return "\n".join(lines)
