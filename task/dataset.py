"""Building a task's prompts: deterministic rows, and a held-out split no training row can overlap.

Every problem has a key (its content up to what the model could transfer: ``(min(a, b), max(a, b))``
for an addition, the sorted numbers for a sort). A stable hash of the key puts one problem in
``EVAL_SHARE`` into the evaluation split and the rest into training, so the two splits are disjoint by
content, whatever the seeds: a training prompt never reappears, reordered or not, in the held-out set.

Rows are drawn from a private ``random.Random``: the same (n, seed, split) always gives the same rows,
and a shorter dataset is a prefix of a longer one.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import datasets

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")
# One problem in ten is held out for evaluation. Each task's problem space is far larger than ten
# times any eval set we build (10^6 additions, ~10^7 countdowns, ~10^14 sorts).
EVAL_SHARE = 10
# Drawing stops with an error after this many draws per requested row: a guard against a split that
# a future task leaves (nearly) empty, not a limit the tasks here come near (about 1.1 or 10 draws).
MAX_DRAWS_PER_ROW = 1000


def split_of(key: Hashable) -> Split:
    """The split a problem belongs to, from a hash of its key's repr (stable across runs and machines)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "big") % EVAL_SHARE == 0 else "train"


def check_size(n: Any, seed: Any) -> None:
    """One-line ValueErrors for a bad number of rows or seed, before any row is drawn."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"the number of examples must be a positive integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"the seed must be an integer, got {seed!r}")


def build_rows(
    n: int,
    seed: int,
    split: Split,
    draw: Callable[[random.Random], Any],
    key: Callable[[Any], Hashable],
    row: Callable[[Any], dict[str, Any]],
) -> datasets.Dataset:
    """``n`` rows of ``split``: problems from ``draw(rng)`` whose ``key`` hashes into it, made ``row``s."""
    check_size(n, seed)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    import datasets  # here, not at the top: it costs seconds, and `import task` should stay light

    # A private generator: global random state would make the data depend on whatever ran before.
    # Training keeps the plain seed; the eval split draws from its own stream so it need not wade
    # through the training draws to find its one in ten.
    rng = random.Random(seed if split == "train" else f"eval/{seed}")
    rows: list[dict[str, Any]] = []
    for _ in range(MAX_DRAWS_PER_ROW * n):
        problem = draw(rng)
        if split_of(key(problem)) == split:
            rows.append(row(problem))
            if len(rows) == n:
                return datasets.Dataset.from_list(rows)
    raise RuntimeError(f"drew {MAX_DRAWS_PER_ROW * n} problems and found only {len(rows)} in split {split!r}")


def prompt_chars(prompt: list[dict[str, str]]) -> int:
    """Characters of a conversational prompt's message contents (the chat template adds its own)."""
    return sum(len(message["content"]) for message in prompt)


def chatml_chars(messages: list[dict[str, str]]) -> int:
    """Characters of `messages` as ChatML (Qwen3's chat format) with the assistant's turn opened,
    special tokens included: a token is at least a character, so this bounds any tokenizer's count
    of the prompt the model really sees (the budget's max_prompt_length)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return len(turns + "<|im_start|>assistant\n")


def messages(system_prompt: str, user: str) -> list[dict[str, str]]:
    """A conversational prompt: the task's system prompt and one user turn."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]
