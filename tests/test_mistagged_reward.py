"""Chapter 8's mistagged reward: open-r1's `<answer>` parse, exact where its tag is written, and
silent on every task here, whose prompts ask for `<ans>`.

The arm it breaks is only honest if the reward is right about its own tag (it pays a right answer in
`<answer>`, nothing for a wrong one or a trick) and if no task's prompt ever asks for that tag: then
its zeros are the parse's, not the model's.
"""

from __future__ import annotations

import task
from task.mistagged import answer_tag_reward, parse_answer_tag
from task.rewards import RewardRole, reward_info


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_it_pays_a_right_answer_in_its_own_tag_and_nothing_else():
    texts = ["<answer>7</answer>", " <answer> 7 </answer> ", "<answer>3</answer>", "<answer>17</answer>"]
    assert answer_tag_reward(None, [_chat(t) for t in texts], [7] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_it_refuses_the_tricks_an_exact_reward_refuses():
    hostile = [
        "<answer>3</answer><answer>7</answer>",  # two guesses, two tags
        "<answer>3, 7</answer>",  # two guesses, one tag
        "<answer>0123456789</answer>",  # every digit
        "</answer>7<answer>",  # tags reversed
        "<answer>7",  # never closed
        "7",  # no tag
        "",
    ]
    assert answer_tag_reward(None, hostile, [7] * len(hostile)) == [0.0] * len(hostile)
    # Every shape but one number in one tag has no answer at all; the digits are one (wrong) number.
    assert [parse_answer_tag(t) for t in hostile] == [None, None, 123456789, None, None, None, None]


def test_it_pays_nothing_on_any_tasks_right_answer_in_the_tag_its_prompt_asks_for():
    """Every task's prompt asks for `<ans>`; where the target itself is the answer (every task but
    countdown, whose answer is an expression), the target written there is paid by the task's own reward and
    by none of this one's: the zeros the mistagged arm trains on."""
    answered = set()
    for t in task.TASKS.values():
        for row in t.build_dataset(20, 2).to_list():
            system = row["prompt"][0]["content"]
            assert "<ans></ans>" in system and "<answer>" not in system, (t.name, system)
            if not isinstance(row["target"], int) or t.name == "countdown":
                continue
            right = [_chat(f"<ans>{row['target']}</ans>")]
            columns = {c: [row[c]] for c in t.reward_columns}
            assert t.reward_funcs[0]([row["prompt"]], right, **columns) == [1.0], t.name
            assert answer_tag_reward([row["prompt"]], right, **columns) == [0.0], t.name
            answered.add(t.name)
    assert {"lastdigit", "addition", "small-addition"} <= answered


def test_it_is_declared_an_answer_reward_and_is_total():
    info = reward_info(answer_tag_reward)
    assert (info.max_reward, info.role) == (1.0, RewardRole.ANSWER)
    weird = [None, 7, {"content": "<answer>7</answer>"}, _chat("<answer>7</answer>"), b"<answer>7</answer>"]
    assert answer_tag_reward(None, weird, [7] * len(weird)) == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert answer_tag_reward(None, ["<answer>7</answer>"], [None]) == [0.0]
    assert answer_tag_reward(None, None, [7]) == []
