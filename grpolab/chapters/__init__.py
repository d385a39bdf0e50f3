"""The chapters' own machinery: what a chapter needs that is more than one run of the book's loop.

- `arms`: one chapter trained several ways in one process, each arm a nested run (chapter 4).
- `sweep`: a grid of runs, a process per cell, each sized by the sheet first (chapter 2).
- `headroom`: the sweep's cells as arms, each spending the card's headroom on one knob (chapter 5).
- `ship`: the adapter merged, written as GGUF, registered and served, each stage scored (chapter 6).
- `load_chapter` (here): another chapter's lesson, labs/<name>/train.py, as a module.

A new chapter's machinery goes here, a module (or a package) of its own (docs/chapters.md).

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle, grpolab.tiny_model,
grpolab.model, grpolab.judging, grpolab.lab.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from grpolab.config.paths import LABS


def load_chapter(name: str) -> ModuleType:
    """labs/<name>/train.py, imported under a name of its own (grpo-first: grpo_first_train)."""
    path = LABS / name / "train.py"
    spec = importlib.util.spec_from_file_location(f"{name.replace('-', '_')}_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
