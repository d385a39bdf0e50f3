"""compute_score pays exactly what task/'s rewards pay, directly and through verl's own reward path."""

from __future__ import annotations

import pytest
from grpo_verl.reward import compute_score

from task import TASKS, UnknownTaskError, get_task

WEIRD = [
    "",
    " ",
    "<ans>",
    "</ans><ans>",
    "<ans></ans>",
    "<ans>" * 500,
    "\x00<ans>1</ans>",
    "<ans>٣</ans>",
    "<ans>1e3</ans>",
    "<ans>" + "9" * 5000 + "</ans>",
    "<ans>-0</ans>",
    "<ans>(1 + 2) * 3</ans>",
    "<ans>1, 2, 3</ans>",
    "<ans>__import__('os').system('true')</ans>",
    "<ans>2**99999</ans>",
]


def completions_for(task, row) -> list[str]:
    """Right, wrong, untagged, doubled and padded answers for one row, plus strings no task expects."""
    answer = task.reference_answer(row)
    return [
        f"<ans>{answer}</ans>",
        f"Thinking first. <ans> {answer} </ans>",
        f"<ans>{answer}0</ans>",
        f"<ans>{answer}</ans><ans>{answer}</ans>",
        answer,
        *WEIRD,
    ]


def task_rewards(task, row, text) -> dict[str, float]:
    """The task's rewards called as TRL calls them: a conversational completion and the row's columns."""
    columns = {name: [row[name]] for name in task.reward_columns}
    completion = [{"role": "assistant", "content": text}]
    return {
        fn.__name__: fn(prompts=[row["prompt"]], completions=[completion], **columns)[0]
        for fn in task.reward_funcs
    }


@pytest.mark.parametrize("name", sorted(TASKS))
def test_compute_score_is_the_tasks_rewards(name):
    task = get_task(name)
    rows = task.build_dataset(6, 1)
    scored = set()
    for row in rows:
        # extra_info as the Parquet stores it, plus the keys verl's reward manager adds before calling.
        extra_info = {"split": "train", "index": 0, "num_turns": 2, "rollout_reward_scores": {}}
        extra_info.update({c: row[c] for c in task.reward_columns if c != "target"})
        for text in completions_for(task, row):
            want = task_rewards(task, row, text)
            got = compute_score(name, text, row["target"], extra_info)
            assert got == {"score": sum(want.values()), **want}, text[:60]
            scored.add(got["score"])
    assert {0.0, 0.2} <= scored and max(scored) == pytest.approx(1.2)  # every outcome was exercised


@pytest.mark.parametrize("name", sorted(TASKS))
def test_compute_score_is_total(name):
    task = get_task(name)
    row = task.build_dataset(1, 0)[0]
    for completion in [*WEIRD, None, 7, ["<ans>1</ans>"], {"content": "<ans>1</ans>"}, b"<ans>1</ans>"]:
        for ground_truth in (row["target"], None, "", "x", [1, "a"]):
            for extra_info in (None, {}, {"numbers": None}, "not a dict"):
                result = compute_score(name, completion, ground_truth, extra_info)
                assert set(result) == {"score", *(fn.__name__ for fn in task.reward_funcs)}
                assert all(isinstance(v, float) for v in result.values())


def test_an_unknown_data_source_is_an_error():
    with pytest.raises(UnknownTaskError):
        compute_score("gsm8k", "<ans>1</ans>", 1, {})


def test_verls_reward_path_scores_as_the_task_does(composed, tokenizer_dir):
    """verl's RewardLoopWorker (what its reward workers run) loads reward.py by path, decodes each
    response with the tokenizer and calls compute_score; the rm_scores tensor the trainer reads is
    assembled by verl's reward manager. Rows come from verl's own dataset over our Parquet."""
    import torch
    from grpo_verl.scoring import rollout_batch, verl_scores
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(str(tokenizer_dir))
    for name in sorted(TASKS):
        config = composed(task=name)
        task = get_task(name)
        dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
        built = task.build_dataset(len(dataset), 0)
        items, texts = [], []
        for i in range(3):
            for text in completions_for(task, built[i])[:6]:
                items.append(dataset[i])
                texts.append(text)
        batch = rollout_batch(tokenizer, [f"prompt {i}" for i in range(len(texts))], texts, items)
        outputs, rm_scores = verl_scores(config, batch)
        for k, (item, text) in enumerate(zip(items, texts, strict=True)):
            want = task_rewards(task, built[int(item["index"])], text)
            assert outputs[k]["reward_extra_info"] == {"score": sum(want.values()), **want}, text
            # The trainer reads one score per response, on its last token, in float32.
            assert rm_scores[k].sum().item() == torch.tensor(sum(want.values()), dtype=torch.float32).item()
            assert rm_scores[k].count_nonzero() <= 1
