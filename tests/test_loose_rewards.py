"""Chapter 4's loose checker pays for tricks; no task's own reward pays for any of them.

The tricks are the ones a policy trained on `contains_answer_reward` can find: the prompt's number
echoed (827 contains its last digit), several guesses in one answer, every digit at once. Each is
shown paid by the loose checker and refused by the exact rewards of every task in the registry, the
ones chapters 1 to 3 train on included.
"""

from __future__ import annotations

import pytest

import task
from task.loose import contains_answer_reward
from task.rewards import RewardRole, reward_info


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def tricks(target: int, prompt_number: int | None = None) -> dict[str, str]:
    """Completions that contain the target without answering it, keyed by the trick's name."""
    wrong = (target + 1) % 10 if 0 <= target <= 9 else target + 1
    found = {
        "every digit": "<ans>0123456789</ans>",
        "several guesses": f"<ans>{wrong}, {target}</ans>",
        "a guess and another": f"<ans>{wrong}</ans> or maybe {target}",
        "the number then text": f"{target}{target} is my guess",
    }
    if prompt_number is not None:
        found["the prompt's number echoed"] = f"<ans>{prompt_number}</ans>"
    return found


def test_it_pays_the_right_answer_in_any_phrasing():
    phrasings = ["<ans>7</ans>", "7", "The answer is 7.", " <ans> 7 </ans>"]
    assert contains_answer_reward(None, phrasings, [7] * 4) == [1.0] * 4
    assert contains_answer_reward(None, ["<ans>3</ans>", "", "no digits"], [7] * 3) == [0.0] * 3


def test_it_pays_every_trick_the_exact_reward_refuses_on_the_chapters_task():
    rows = task.LASTDIGIT.build_dataset(40, 0).to_list()
    correctness = task.LASTDIGIT.reward_funcs[0]
    for row in rows:
        found = tricks(row["target"], row["number"])
        texts = list(found.values())
        paid = contains_answer_reward(None, texts, [row["target"]] * len(texts))
        assert paid == [1.0] * len(texts), dict(zip(found, paid, strict=True))
        exact = correctness(None, texts, target=[row["target"]] * len(texts))
        assert exact == [0.0] * len(texts), dict(zip(found, exact, strict=True))
        # Its own answer, alone in the tag, is paid by both: the checker is loose, not wrong.
        right = [f"<ans>{row['target']}</ans>"]
        assert contains_answer_reward(None, right, [row["target"]]) == correctness(
            None, right, target=[row["target"]]
        )


@pytest.mark.parametrize("t", list(task.TASKS.values()), ids=list(task.TASKS))
def test_no_tasks_reward_pays_for_the_tricks(t):
    """Every registered task's answer rewards (chapters 1-3 train on addition, countdown, sorting)
    pay nothing for a completion that only contains the target."""
    rows = t.build_dataset(30, 1).to_list()
    answers = [f for f in t.reward_funcs if reward_info(f).role is RewardRole.ANSWER]
    assert answers
    for row in rows:
        target = row["target"]
        number = row.get("number")
        if not isinstance(target, int):  # a list target (sorting): its items joined are the trick
            target_text = ", ".join(map(str, target))
            texts = [f"<ans>{target_text}</ans> or <ans>0</ans>", f"{target_text}", "<ans>0123456789</ans>"]
        else:
            texts = list(tricks(target, number).values())
        columns = {c: [row[c]] * len(texts) for c in t.reward_columns}
        prompts = [row["prompt"]] * len(texts)
        for f in answers:
            assert f(prompts, [_chat(x) for x in texts], **columns) == [0.0] * len(texts), (
                t.name,
                f.__name__,
            )
    assert all(contains_answer_reward not in x.reward_funcs for x in task.TASKS.values())


def test_it_is_declared_an_answer_reward_and_is_total():
    info = reward_info(contains_answer_reward)
    assert (info.max_reward, info.role) == (1.0, RewardRole.ANSWER)
    weird = [None, 7, {"content": "7"}, [{"role": "assistant", "content": "x7"}], b"7", "7"]
    assert contains_answer_reward(None, weird, [7] * len(weird)) == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert contains_answer_reward(None, ["7"], [None]) == [0.0]
    assert contains_answer_reward(None, ["7", "7"], "7") == [1.0, 1.0]  # a lone target is broadcast
    assert contains_answer_reward(None, None, [7]) == []
    assert contains_answer_reward(None, ["7"], [True]) == [0.0]  # True is not an answer
