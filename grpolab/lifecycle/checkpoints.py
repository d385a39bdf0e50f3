"""What a run leaves to resume from: its checkpoints, whole or half-written, and the command that
resumes it (grpolab.lifecycle.resume does the resuming).

The trainer writes `checkpoint-N` every `save_steps` (transformers 5.17's `Trainer._save_checkpoint`:
the adapter, then the optimizer and scheduler, the RNG states, and `trainer_state.json` last, with
the step counter and every logged row); a stopped run saves one more (grpolab.lifecycle.step_boundary).
`resume_from_checkpoint` restores all of it, and the data order (the sampler is seeded; the batches
already trained are skipped). Reading them needs no torch: `--resume` checks them before anything loads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.config.paths import DEFAULT_DB, REPO_ROOT

# What a whole checkpoint of a LoRA run holds; trainer_state.json is written last.
WHOLE = ("trainer_state.json", "adapter_config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_NAME = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    @property
    def name(self) -> str:
        return self.path.name


def step_of(path: Path) -> int | None:
    found = _NAME.fullmatch(path.name)
    return int(found.group(1)) if found and path.is_dir() else None


def missing(path: Path) -> list[str]:
    """What a checkpoint folder lacks to be resumed from (empty when it is whole)."""
    lacks = [name for name in WHOLE if not (path / name).is_file()]
    if not any((path / name).is_file() for name in ADAPTER_WEIGHTS):
        lacks.append("adapter_model.safetensors")
    return lacks


def checkpoints(output_dir: Path) -> tuple[list[Checkpoint], list[tuple[Checkpoint, list[str]]]]:
    """A run folder's whole checkpoints, oldest first, and the ones a save left half-written with
    what each lacks."""
    whole, partial = [], []
    folder = Path(output_dir)
    for path in folder.iterdir() if folder.is_dir() else ():
        step = step_of(path)
        if step is None:
            continue
        lacks = missing(path)
        (partial.append((Checkpoint(path, step), lacks)) if lacks else whole.append(Checkpoint(path, step)))
    return sorted(whole, key=lambda c: c.step), sorted(partial, key=lambda p: p[0].step)


def latest(output_dir: Path) -> Checkpoint | None:
    whole, _ = checkpoints(output_dir)
    return whole[-1] if whole else None


def adapter_config(checkpoint: Checkpoint) -> dict[str, Any]:
    return json.loads((checkpoint.path / "adapter_config.json").read_text())


def lora_shape_differences(config: dict[str, Any], settings) -> list[str]:
    """Where a saved adapter's config (adapter_config.json) differs from the LoRA shape the settings
    train, one "r 32 (run: 16)" each: its rank, alpha and target modules. Empty when it is theirs."""
    expected = {
        "r": settings.lora_rank,
        "lora_alpha": settings.lora_alpha,
        "target_modules": sorted(settings.target_modules),
    }
    found = {
        "r": config.get("r"),
        "lora_alpha": config.get("lora_alpha"),
        "target_modules": sorted(config.get("target_modules") or []),
    }
    return [f"{k} {found[k]} (run: {expected[k]})" for k in expected if found[k] != expected[k]]


# --- the command that resumes a run ------------------------------------------------------------------
def command(chapter: str, run_id: str, changes: str = "") -> str:
    """The exact command that resumes a run (with the store, when it is not the default)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    env = f"MLFLOW_TRACKING_URI={shlex.quote(uri)} " if uri and uri != f"sqlite:///{DEFAULT_DB}" else ""
    lab = Path("labs") / chapter / "train.py"
    if not (REPO_ROOT / lab).is_file():
        lab = REPO_ROOT / lab
    return f"{env}uv run python {lab} --resume {run_id}{' ' + changes if changes else ''}"


def resumable(run) -> Checkpoint | None:
    """The newest whole checkpoint of an interrupted run, where its folder is on this machine."""
    folder = run.data.tags.get("output_dir")
    if run.info.status == "FINISHED" or not folder or run.data.tags.get("run_kind", "train") != "train":
        return None
    return latest(Path(folder))


def resume_hint(run) -> str:
    """ "Resume it from checkpoint-N (step N): <command>", or "" when the run left none."""
    checkpoint = resumable(run)
    if checkpoint is None:
        return ""
    chapter = run.data.tags.get("chapter", "")
    return f"Resume it from {checkpoint.name} (step {checkpoint.step}): {command(chapter, run.info.run_id)}"
