"""What a chapter claims of its CPU run, written once and checked the same way everywhere.

A chapter that makes claims keeps them beside its lesson, in `labs/<chapter>/claims.py`:

- `figures(book: ChapterStore) -> dict[str, float]`: the chapter's finished runs, read back from their
  MLflow store, as named numbers (held-out accuracy before and after, a reward's first and last
  quarter, whether the doctor named a finding);
- `CLAIMS`: which of those numbers must reach what (`Claim`), each in the unit a reader checks it in:
  held-out figures in prompts, rewards in reward;
- `MATRIX_ARGS` (optional): what the matrix adds to the chapter's README command (chapter 2 runs its
  refused cell anyway, as its tests do).

Its tests assert `CLAIMS` on the suite's one run of the README command; `python -m grpolab.matrix`
checks them on every seed and every emulated machine and prints each figure's min / median / max, so
a threshold is never a figure from one run on one machine.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

from grpolab.config.paths import LABS
from grpolab.judging.doctor import quarters


@dataclass(frozen=True)
class Claim:
    """One thing a chapter says its CPU run shows: `figure` reaches `at_least` (or stays at or under
    `at_most`)."""

    text: str
    figure: str
    at_least: float | None = None
    at_most: float | None = None

    def holds(self, figures: Mapping[str, float]) -> bool:
        """False where the run did not measure the figure (chapter 8: a mended arm that never ran)."""
        value = figures.get(self.figure)
        return value is not None and (
            (self.at_least is None or value >= self.at_least)
            and (self.at_most is None or value <= self.at_most)
        )

    def bound(self) -> str:
        if self.at_least is not None and self.at_most is not None:
            return f"{self.at_least:g} to {self.at_most:g}"
        return f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"

    def failure(self, figures: Mapping[str, float]) -> str:
        """Empty when it holds; else one line: the claim, the figure, what it needed."""
        if self.holds(figures):
            return ""
        if self.figure not in figures:
            return f"{self.text}: {self.figure} was not measured (its run is not there), needs {self.bound()}"
        return f"{self.text}: {self.figure} = {figures[self.figure]:g}, needs {self.bound()}"


def check(claims: Sequence[Claim], figures: Mapping[str, float]) -> list[str]:
    """The claims that do not hold, one line each (an empty list: every one holds)."""
    return [line for line in (c.failure(figures) for c in claims) if line]


def load(chapter: str) -> ModuleType | None:
    """labs/<chapter>/claims.py as a module, or None for a chapter that claims nothing of its CPU run."""
    path = LABS / chapter / "claims.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"{chapter.replace('-', '_')}_claims", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- reading a chapter's runs back ----------------------------------------------------------------
class ChapterStore:
    """A chapter's runs in one MLflow store, read back: the runs nobody is a child of, their children,
    a metric's history, a JSON artifact."""

    def __init__(self, uri: str, chapter: str, client: Any = None) -> None:
        import mlflow

        self.uri, self.chapter = uri, chapter
        self.client = client or mlflow.MlflowClient(uri)

    @cached_property
    def runs(self) -> list:
        experiment = self.client.get_experiment_by_name(self.chapter)
        if experiment is None:
            return []
        return self.client.search_runs([experiment.experiment_id], max_results=1000)

    @property
    def top(self) -> list:
        return [r for r in self.runs if "mlflow.parentRunId" not in r.data.tags]

    def only(self, run_kind: str | None = None):
        """The one top-level run (of `run_kind`, when given); an error says what was there instead."""
        found = [r for r in self.top if run_kind is None or r.data.tags.get("run_kind") == run_kind]
        if len(found) != 1:
            kinds = [r.data.tags.get("run_kind") for r in self.top]
            raise LookupError(f"{self.chapter}: expected one {run_kind or 'top-level'} run, found {kinds}")
        return found[0]

    def children(self, parent) -> list:
        return [r for r in self.runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]

    def history(self, run, key: str) -> list[float]:
        points = self.client.get_metric_history(run.info.run_id, key)
        return [p.value for p in sorted(points, key=lambda p: p.step)]

    def artifact_json(self, run, path: str, folder: Path) -> Any:
        return json.loads(
            Path(self.client.download_artifacts(run.info.run_id, path, str(folder))).read_text()
        )


def quarter_means(values: Sequence[float]) -> tuple[float, float]:
    """The first and the last quarter's means of a per-step series, cut as the doctor and the pages'
    tables cut them (`grpolab.judging.doctor.quarters`)."""
    first, *_, last = quarters(list(values))
    return first, last


def prompts(rate: float, eval_prompts: int) -> float:
    """A held-out rate as the number of prompts it counts (a claim reads 'rises by 16 of 64 prompts')."""
    return round(rate * eval_prompts, 6)
