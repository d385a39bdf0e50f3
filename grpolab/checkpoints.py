"""What a run leaves to resume from: its checkpoints, whole or half-written.

The trainer writes `checkpoint-N` every `save_steps` (transformers 5.17's `Trainer._save_checkpoint`:
the adapter, then the optimizer and scheduler, the RNG states, and `trainer_state.json` last, with
the step counter and every logged row); a stopped run saves one more (grpolab.step_boundary).
`resume_from_checkpoint` restores all of it, and the data order (the sampler is seeded; the batches
already trained are skipped). Reading them needs no torch: `--resume` checks them before anything loads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
