"""The Parquet `prepare` writes is verl's schema, holds task/'s rows, and verl's own dataset loads it."""

from __future__ import annotations

import datasets
import pytest
from grpo_verl import data

from task import TASKS, get_task

VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("split", data.SPLITS)
def test_rows_are_the_tasks_rows_in_verls_schema(data_dir, split_rows, name, split):
    task = get_task(name)
    table = datasets.load_dataset("parquet", data_files=str(data.parquet_path(data_dir, name, split)))[
        "train"
    ]
    assert table.column_names == VERL_COLUMNS
    build = task.build_dataset if split == "train" else task.build_eval_dataset
    built = build(split_rows[split], 0)
    assert len(table) == len(built)
    for i, (row, original) in enumerate(zip(table, built, strict=True)):
        assert row["data_source"] == name and row["ability"] == name
        assert row["prompt"] == original["prompt"]  # the task's chat messages, unchanged
        assert row["reward_model"] == {"style": "rule", "ground_truth": original["target"]}
        assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == i
        for column in task.reward_columns:  # what the rewards read besides the target travels along
            if column != "target":
                assert row["extra_info"][column] == original[column]


def test_train_and_test_prompts_do_not_overlap(data_dir):
    for name in TASKS:
        splits = {
            split: datasets.load_dataset("parquet", data_files=str(data.parquet_path(data_dir, name, split)))[
                "train"
            ]
            for split in data.SPLITS
        }
        train = {str(p) for p in splits["train"]["prompt"]}
        assert not train & {str(p) for p in splits["test"]["prompt"]}


def test_prepare_is_deterministic(tmp_path, data_dir, split_rows):
    again = data.prepare("addition", tmp_path, split_rows["train"], split_rows["test"], seed=0)
    for split, path in again.items():
        first = datasets.load_dataset(
            "parquet", data_files=str(data.parquet_path(data_dir, "addition", split))
        )
        second = datasets.load_dataset("parquet", data_files=str(path))
        assert first["train"].to_list() == second["train"].to_list()
    assert not [p for p in tmp_path.rglob(".*")]  # no staging file left behind


def test_verls_dataset_loads_the_parquet_with_a_real_tokenizer(composed, tokenizer_dir, split_rows):
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(str(tokenizer_dir))
    for name in TASKS:
        config = composed(task=name)
        # What verl's trainer builds (PPOTrainer._init_dataloader -> create_rl_dataset), with the
        # configuration's data section: filter_overlong_prompts renders each prompt with the chat template.
        dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
        built = get_task(name).build_dataset(split_rows["train"], 0)
        assert len(dataset) == split_rows["train"]
        for i in range(len(dataset)):
            item = dataset[i]
            assert item["raw_prompt"] == built[i]["prompt"]  # what the rollout's chat template receives
            assert item["reward_model"]["ground_truth"] == built[i]["target"]
            assert item["index"] == i


def test_verls_length_filter_counts_tokens_of_the_chat_template(composed, tokenizer_dir, split_rows):
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(str(tokenizer_dir))
    built = get_task("countdown").build_dataset(split_rows["train"], 0)
    rendered = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in built
    ]
    lengths = sorted(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered)
    cut = lengths[len(lengths) // 2]
    config = composed(task="countdown", **{"data.max_prompt_length": cut})
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    assert len(dataset) == sum(n <= cut for n in lengths) < split_rows["train"]
