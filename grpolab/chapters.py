"""Another chapter's lesson: labs/<name>/train.py as a module (chapter folders have hyphens)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from grpolab.paths import LABS


def load_chapter(name: str) -> ModuleType:
    """labs/<name>/train.py, imported under a name of its own (grpo-first: grpo_first_train)."""
    path = LABS / name / "train.py"
    spec = importlib.util.spec_from_file_location(f"{name.replace('-', '_')}_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
