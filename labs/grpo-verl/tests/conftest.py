"""Shared fixtures: the lab, a real tokenizer built offline, and Parquet written for every task.

These tests run in the chapter's own environment (`uv run --project labs/grpo-verl pytest
labs/grpo-verl/tests`) against the installed verl 0.9.1, on CPU: nothing here needs a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grpo_verl import data, launch, schema
from grpo_verl.settings import load_lab

from task import TASKS

# Small splits: enough rows to see the dataset filter and the reward on several prompts.
TRAIN_ROWS, TEST_ROWS = 24, 12


@pytest.fixture(scope="session")
def split_rows() -> dict[str, int]:
    """How many rows each split of the prepared Parquet holds."""
    return {"train": TRAIN_ROWS, "test": TEST_ROWS}


@pytest.fixture(scope="session")
def lab():
    return load_lab()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The CPU lab's tokenizer (a real PreTrainedTokenizerFast with a ChatML template), saved as a model
    folder: verl loads it with its own hf_tokenizer, as it would load Qwen3's from the Hub."""
    from grpolab.tiny_model import build_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Every task's train and test splits, written by the chapter's prepare."""
    root = tmp_path_factory.mktemp("data")
    for name in TASKS:
        data.prepare(name, root, TRAIN_ROWS, TEST_ROWS, seed=0)
    return root


@pytest.fixture(scope="session")
def composed(lab, data_dir, tokenizer_dir):
    """The one-card configuration composed by Hydra against verl's schema, on the offline tokenizer."""

    def compose(task: str = lab.task, config: str = "one-card", **extra):
        values = launch.overrides(
            lab.config(config), task, data_dir, {"actor_rollout_ref.model.path": str(tokenizer_dir), **extra}
        )
        return schema.compose(launch.hydra_args(values))

    return compose
