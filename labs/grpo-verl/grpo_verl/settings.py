"""lab.toml, read in one place: the chapter's task, its data and its launch configurations.

Example::

    >>> lab = load_lab()
    >>> cfg = lab.config("one-card")
    >>> cfg.verl["actor_rollout_ref.rollout.n"], cfg.cards
    (8, 1)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
LAB_DIR = PACKAGE_DIR.parent
REPO_ROOT = LAB_DIR.parents[1]
LAB_TOML = LAB_DIR / "lab.toml"
SUBMITS = ("local", "ray-job")  # local: verl starts its own Ray here; ray-job: `ray job submit`
TOP_KEYS = {"chapter", "task", "environment", "data", "verl", "config"}
CONFIG_KEYS = {"description", "gpu", "submit", "verl"}


class LabError(ValueError):
    """lab.toml (or a name asked of it) is wrong; the message says what to change."""


@dataclass(frozen=True)
class DataSettings:
    dir: Path  # absolute: lab.toml's path is relative to the repository root
    train_size: int
    test_size: int
    seed: int


@dataclass(frozen=True)
class LaunchConfig:
    """One ready configuration: verl's overrides ([verl] merged with its own table) and its card."""

    name: str
    description: str
    gpu: str  # the budget's card name (budgets/cards.py)
    submit: str
    verl: Mapping[str, Any]

    @property
    def nnodes(self) -> int:
        return int(self.verl["trainer.nnodes"])

    @property
    def n_gpus_per_node(self) -> int:
        return int(self.verl["trainer.n_gpus_per_node"])

    @property
    def cards(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    @property
    def model(self) -> str:
        return str(self.verl["actor_rollout_ref.model.path"])


@dataclass(frozen=True)
class Lab:
    chapter: str
    task: str
    environment: str
    data: DataSettings
    configs: Mapping[str, LaunchConfig]

    def config(self, name: str) -> LaunchConfig:
        try:
            return self.configs[name]
        except KeyError:
            raise LabError(
                f"unknown configuration {name!r}; lab.toml has {', '.join(self.configs)}"
            ) from None


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LabError(f"{where}: must be a table")
    return value


def _verl_table(value: Any, where: str) -> dict[str, Any]:
    table = _table(value, where)
    for key, item in table.items():
        if "." not in key or isinstance(item, dict):
            raise LabError(f'{where}: {key!r} must be a quoted dotted verl key, e.g. "trainer.nnodes" = 1')
    return table


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LabError(f"{where}: must be a positive integer, got {value!r}")
    return value


def load_lab(path: Path = LAB_TOML) -> Lab:
    """Read and check lab.toml; LabError names the first key at fault."""
    raw = tomllib.loads(Path(path).read_text())
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise LabError(f"lab.toml: unknown top-level keys {sorted(unknown)}; known: {sorted(TOP_KEYS)}")
    data = _table(raw.get("data"), "[data]")
    settings = DataSettings(
        dir=(REPO_ROOT / str(data.get("dir", "outputs/grpo-verl/data"))).resolve(),
        train_size=_positive(data.get("train_size"), "data.train_size"),
        test_size=_positive(data.get("test_size"), "data.test_size"),
        seed=int(data.get("seed", 0)),
    )
    shared = _verl_table(raw.get("verl", {}), "[verl]")
    configs: dict[str, LaunchConfig] = {}
    for name, table in _table(raw.get("config"), "[config]").items():
        table = _table(table, f"[config.{name}]")
        unknown = set(table) - CONFIG_KEYS
        if unknown:
            raise LabError(f"[config.{name}]: unknown keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        if table.get("submit") not in SUBMITS:
            raise LabError(f"[config.{name}]: submit must be one of {', '.join(SUBMITS)}")
        own = _verl_table(table.get("verl"), f"[config.{name}.verl]")
        cfg = LaunchConfig(
            name=name,
            description=str(table.get("description", "")),
            gpu=str(table.get("gpu")),
            submit=table["submit"],
            verl={**shared, **own},
        )
        for key in ("trainer.nnodes", "trainer.n_gpus_per_node", "actor_rollout_ref.model.path"):
            if key not in cfg.verl:
                raise LabError(f"[config.{name}.verl]: {key!r} is required")
        configs[name] = cfg
    return Lab(
        chapter=str(raw.get("chapter")),
        task=str(raw.get("task")),
        environment=str(raw.get("environment")),
        data=settings,
        configs=configs,
    )
