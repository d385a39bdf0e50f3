"""A task's prompts as Parquet in verl's schema: one row per prompt, the same rows as `task/` builds.

verl's RLHFDataset reads these columns (verl/utils/dataset/rl_dataset.py, reward loop naive.py):

    data_source   which reward to run: here the task's name, which grpo_verl/reward.py looks up
    prompt        the chat messages, exactly the task's conversational prompt
    ability       a label verl only logs: here the task's name too
    reward_model  {"style": "rule", "ground_truth": the task's target}
    extra_info    {"split", "index", and every other column the task built}: verl hands it to
                  compute_score, which passes the task's reward columns on to its rewards

Example::

    >>> rows = verl_rows(get_task("addition"), "train", 1, seed=0)
    >>> sorted(rows[0]), rows[0]["reward_model"]["style"]
    (['ability', 'data_source', 'extra_info', 'prompt', 'reward_model'], 'rule')
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from task import Task, get_task

SPLITS = ("train", "test")  # verl's names: data.train_files, data.val_files (its examples' test.parquet)


def verl_rows(task: Task, split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows of ``split`` in verl's schema, built by the task's own builders."""
    if split == "train":
        dataset = task.build_dataset(n, seed)
    elif split == "test":
        dataset = task.build_eval_dataset(n, seed)  # held out: no training prompt reappears
    else:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    rows = []
    for index, row in enumerate(dataset):
        others = {k: v for k, v in row.items() if k not in ("prompt", "target")}
        rows.append(
            {
                "data_source": task.name,
                "prompt": row["prompt"],
                "ability": task.name,
                "reward_model": {"style": "rule", "ground_truth": row["target"]},
                "extra_info": {"split": split, "index": index, **others},
            }
        )
    return rows


def parquet_path(data_dir: Path, task_name: str, split: str) -> Path:
    return Path(data_dir) / task_name / f"{split}.parquet"


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write under a temporary name and rename into place: a run never reads a half-written file."""
    import datasets  # read back by verl with datasets.load_dataset("parquet"): write with the same library

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        datasets.Dataset.from_list(rows).to_parquet(staging)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return path


def prepare(task_name: str, data_dir: Path, train_size: int, test_size: int, seed: int) -> dict[str, Path]:
    """Write the task's train and test splits; returns {split: path}."""
    task = get_task(task_name)
    sizes = {"train": train_size, "test": test_size}
    return {
        split: write_parquet(
            verl_rows(task, split, sizes[split], seed), parquet_path(data_dir, task.name, split)
        )
        for split in SPLITS
    }
