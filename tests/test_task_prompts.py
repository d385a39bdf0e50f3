"""Every task's prompts fit the CPU profile's tiny character-level model.

The book's CPU profile (grpolab/recipe.toml, which labs/grpo-first trains as it is) trains a tiny Qwen3 whose tokenizer has one token
per character (plus the chat template's and the answer tags' special tokens), with a short
max_seq_length: the longest prompt of every task, chat-templated, must leave room for a full
completion, and every character a task writes must be in that tokenizer's vocabulary.
"""

from __future__ import annotations

import pytest

import task
from grpolab.config.settings import lab_settings

from suite import LAB_DIR

TASKS = list(task.TASKS.values())
IDS = [t.name for t in TASKS]
# The limit: the chat-templated prompt, counted in characters, stays under 220 (the template's
# special tokens are one token each, so the token count is lower still).
MAX_TEMPLATED_CHARS = 220


@pytest.fixture(scope="module")
def tokenizer():
    from grpolab import tiny_model

    return tiny_model.build_tokenizer()


def _templated(tokenizer, prompt: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("t", TASKS, ids=IDS)
def test_longest_prompt_fits_the_cpu_profile(t: task.Task, tokenizer) -> None:
    text = _templated(tokenizer, t.worst_case_prompt())
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(text) <= MAX_TEMPLATED_CHARS, (len(text), text)
    # A character-level tokenizer: max_prompt_chars plus the template bounds the tokens.
    template_chars = len(text) - t.max_prompt_chars()
    assert tokens <= t.max_prompt_chars() + template_chars
    room = lab_settings(LAB_DIR, "cpu").prompt_room  # max_seq_length - max_completion_length
    assert tokens <= room, f"{t.name}: {tokens} prompt tokens, {room} left by the book's cpu profile"


@pytest.mark.parametrize("t", TASKS, ids=IDS)
def test_every_character_is_in_the_vocabulary(t: task.Task, tokenizer) -> None:
    from grpolab.tiny_model import CHARACTERS, SPECIAL_TOKENS

    rows = t.build_dataset(300, 0).to_list() + t.build_eval_dataset(100, 0).to_list()
    texts = [_templated(tokenizer, r["prompt"]) for r in rows]
    texts += [f"<ans>{t.reference_answer(r)}</ans>" for r in rows]
    for text in texts:
        plain = text
        for special in SPECIAL_TOKENS:
            plain = plain.replace(special, "")
        # The unknown token is "?", itself a character: compare the characters, not the ids.
        assert set(plain) <= set(CHARACTERS), set(plain) - set(CHARACTERS)
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
