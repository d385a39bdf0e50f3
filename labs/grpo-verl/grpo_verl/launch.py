"""From a configuration to the exact command: the overrides, written as Hydra reads them.

verl's entry point is ``python -m verl.trainer.main_ppo`` (verl/trainer/main_ppo.py,
``@hydra.main(config_path="config", config_name="ppo_trainer")``): every setting is a Hydra override
``key=value`` of verl/trainer/config/ppo_trainer.yaml. A configuration of lab.toml holds the overrides
that do not depend on where the repository is; `overrides()` adds those that do (the Parquet files,
this chapter's reward file, the checkpoint folder), so the printed command runs as printed.

Example::

    >>> hydra_value(True), hydra_value(["console"]), hydra_value("Qwen/Qwen3-1.7B"), hydra_value("a b")
    ('true', '[console]', 'Qwen/Qwen3-1.7B', "'a b'")
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_verl.data import parquet_path
from grpo_verl.settings import PACKAGE_DIR, REPO_ROOT, LaunchConfig

ENTRY_POINT = "verl.trainer.main_ppo"
CONFIG_NAME = "ppo_trainer"  # main_ppo's hydra config_name; the tests read it from verl's source
REWARD_FILE = PACKAGE_DIR / "reward.py"
REWARD_FUNCTION = "compute_score"
# Strings Hydra takes as they are; anything else is quoted. Values that would parse as another type
# (true, null, 1e-6, inf) are quoted too, so a string stays a string.
_BARE = re.compile(r"[A-Za-z0-9_\-+./:@~]+")
_NOT_STRINGS = {"true", "false", "null", "inf", "-inf", "+inf", "nan"}


def hydra_value(value: Any) -> str:
    """One value in Hydra's override grammar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _BARE.fullmatch(text) and text.lower() not in _NOT_STRINGS and not _is_number(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def overrides(
    cfg: LaunchConfig, task: str, data_dir: Path, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """All overrides of a run: the configuration's, the location-dependent ones, then ``extra``."""
    located = {
        "data.train_files": str(parquet_path(data_dir, task, "train")),
        "data.val_files": str(parquet_path(data_dir, task, "test")),
        "reward.custom_reward_function.path": str(REWARD_FILE),
        "reward.custom_reward_function.name": REWARD_FUNCTION,
        "trainer.experiment_name": f"{task}-{cfg.name}",
        "trainer.default_local_dir": str(REPO_ROOT / "outputs" / "grpo-verl" / cfg.name / "checkpoints"),
    }
    return {**cfg.verl, **located, **(extra or {})}


def hydra_args(values: Mapping[str, Any]) -> list[str]:
    return [f"{key}={hydra_value(value)}" for key, value in values.items()]


def parse_extra(args: Sequence[str]) -> dict[str, Any]:
    """``key=value`` words from the command line, parsed by Hydra's own override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    extra = {}
    for arg in args:
        if arg.startswith(("+", "~")):  # adding or deleting keys would leave verl's schema
            raise ValueError(f"extra overrides set existing verl keys (key=value), got {arg!r}")
        try:
            (override,) = parser.parse_overrides([arg])
        except Exception as err:  # Hydra's OverrideParseException: say which word
            raise ValueError(f"not a Hydra override: {arg!r} ({err})") from None
        extra[override.key_or_group] = override.value()
    return extra


def entry_command(values: Mapping[str, Any], python: str = sys.executable) -> list[str]:
    """verl's entry point with these overrides, on this machine."""
    return [python, "-m", ENTRY_POINT, *hydra_args(values)]


def command(
    cfg: LaunchConfig, values: Mapping[str, Any], python: str = sys.executable, ray_address: str | None = None
) -> list[str]:
    """The command that starts the run: verl's entry point here, or a Ray job on an existing cluster."""
    entry = entry_command(values, python)
    if cfg.submit == "local":
        return entry
    # `ray job submit` (this environment's Ray CLI) runs the same entry point as the job's driver on
    # the cluster; verl's ray.init() then joins that cluster instead of starting one. Without
    # --address the CLI reads RAY_ADDRESS.
    ray = str(Path(python).with_name("ray"))
    return [ray, "job", "submit", *(["--address", ray_address] if ray_address else []), "--", *entry]


def format_command(command: Sequence[str]) -> str:
    """The command as a shell line, one override per line (a shell reads the backslashes away)."""
    module = command.index(ENTRY_POINT) + 1
    head, overrides = shlex.join(command[:module]), [shlex.quote(arg) for arg in command[module:]]
    return " \\\n    ".join([head, *overrides])
