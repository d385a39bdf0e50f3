"""Compose overrides against verl's installed Hydra schema, as ``verl.trainer.main_ppo`` does.

Hydra refuses an override whose key is not in ppo_trainer.yaml ("Could not override ..."), so a
misspelt key fails here, before any GPU is asked for. `validate()` then runs verl's own
``validate_config`` (batch sizes against the cards, micro-batch settings, the LoRA rank vLLM
accepts), the check main_ppo runs before it starts Ray. Neither needs a GPU; composing does not
import verl at all (only its YAML files are read).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from grpo_verl.launch import CONFIG_NAME


def verl_config_dir() -> Path:
    """verl/trainer/config of the installed wheel, found without importing verl (which takes ~30 s)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed: run `uv sync --frozen --project labs/grpo-verl`")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


class SchemaError(ValueError):
    """verl's schema refuses an override (Hydra's message, on one line)."""


def compose(args: Sequence[str]):
    """The DictConfig main_ppo would receive for these ``key=value`` overrides; SchemaError if refused."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    GlobalHydra.instance().clear()  # a notebook or test may have initialised Hydra before
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        try:
            return hydra_compose(config_name=CONFIG_NAME, overrides=list(args))
        except HydraException as err:  # ConfigCompositionException, OverrideParseException, ...
            raise SchemaError(" ".join(str(err).split())) from err


def validate(config) -> None:
    """verl's own checks of a composed config (verl.utils.config.validate_config); raises on failure."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
