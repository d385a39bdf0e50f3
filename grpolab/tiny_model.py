"""The CPU profile's model: a tiny Qwen3 and a character-level tokenizer, built offline.

Without a GPU (and without the Hub) the lab still runs its whole loop, so it needs a model it can
build offline. This one has Qwen3's architecture, the shape in budgets/models/tiny-qwen3.json, and
a tokenizer whose tokens are single characters plus the few special tokens the chat template and the
tasks' answer tags need.

Its random weights are warm-started for a few hundred steps of next-token prediction on answers
shaped like each of the book's tasks' (addition, countdown, sorting), about a third of them inside
<ans></ans> and all of them another prompt's answer: like a real base model, it then answers in the
task's format now and then (about 14% of samples) and almost never correctly, so GRPO has something
to reinforce. A run on another task (chapter 4's `lastdigit`) gets a stand-in of its own, warm-started
the same way plus 1200 of that task's rows for 400 steps, half of them answered right and a fifth
echoing the prompt's number: a base that knows the task often but not always, so GRPO can raise its
accuracy within a CPU-sized run, and that sometimes repeats the question, which a loose checker pays. A purely random model lands
the format (exactly one tag holding a well-formed answer) in well under 1% of samples, too rarely
for a group of 16 to hold a success. Built once, then cached as an ordinary `save_pretrained` folder
that Unsloth and transformers load like any model from the Hub, under a name that changes with the
recipe, and under a lock so two first runs build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import string
from pathlib import Path

from grpolab.atomic import save_pretrained_atomically
from grpolab.paths import CACHE_ROOT, REPO_ROOT

CONFIG_PATH = REPO_ROOT / "budgets" / "models" / "tiny-qwen3.json"
BUILD_SEED = 0
# The warm start: steps of next-token prediction, completions per step, AdamW's learning rate, the
# share of completions inside <ans></ans>, and the training rows drawn from each task.
WARM_START = {"steps": 200, "batch": 32, "learning_rate": 1e-2, "tagged": 0.3, "rows_per_task": 400}
# The book's stand-in is warm-started on these tasks, each answer another row's (almost never right).
# Named, not read from the registry: a task added later must not change the book's stand-in.
BOOK_TASKS = ("addition", "countdown", "sorting")
# A run on any other task gets a stand-in of its own: the book's warm start plus that task's rows,
# of which this share are answered right (the rest another row's answer). Like a real base model it
# then knows the task now and then, and GRPO has right answers to reinforce; a model that is never
# right, as on the book's tasks, gives GRPO nothing to learn an answer from in a CPU-sized run.
# Measured 2026-12-02 on lastdigit (numbers 100..999, 24 GRPO steps of 2 prompts x 8, lr 1e-2): with a
# share of 0.4 right, 400 rows and the book's 200 steps the stand-in answered one constant digit
# (held-out 0% -> 5% after GRPO); with 0.5 right, 0.2 the prompt's number echoed, 1200 rows and 400
# steps it read the digit (held-out 81% greedy) and GRPO on the exact reward took it to 100%.
KNOWN_SHARE = 0.5
# The share of the task's warm-start answers that echo the number the prompt asks about (its
# `number` column, when it has one): a base that sometimes repeats the question, as real ones do,
# which a loose checker pays and the exact reward does not.
ECHO_SHARE = 0.2
OWN_TASK = {"rows": 1200, "steps": 400}  # its rows, and warm-start steps for a stand-in of its own

# Special tokens first so their ids are fixed: pad 0, bos 1, eos/im_end 2.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<ans>", "</ans>"]
# Printable ASCII and the newline: every character the addition prompts and answers use.
CHARACTERS = ["\n"] + [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]

# ChatML, as Qwen3 uses it, without the thinking block: the tiny model never thinks.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_config_dict() -> dict:
    """The tiny model's config.json fields (one source: budgets reads the same file)."""
    config = json.loads(CONFIG_PATH.read_text())
    config.pop("_comment", None)
    return config


def build_tokenizer():
    """A character-level fast tokenizer with `<ans>`/`</ans>` as single tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # An unknown character (a non-ASCII digit, say) becomes "?" rather than failing.
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    # Split into single characters; special tokens are matched before splitting.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    from tokenizers import decoders

    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|endoftext|>",
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token="?",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=tiny_config_dict()["max_position_embeddings"],
    )
    # The answer tags are ordinary (not special) added tokens so decoding keeps them.
    tokenizer.add_tokens(["<ans>", "</ans>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_model(seed: int = BUILD_SEED):
    """A random-weight Qwen3ForCausalLM of the tiny shape, deterministic for a seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**tiny_config_dict())
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def warm_start_texts(tokenizer, seed: int = BUILD_SEED, task: str | None = None) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of the book's tasks: the completion is another row's answer, inside
    <ans></ans> for a share `tagged` of them. Answer-shaped, almost never right. With a `task` outside
    the book's, its rows too, a share KNOWN_SHARE of them answered right (its training split only)."""
    from task import get_task

    rng = random.Random(seed)
    pairs = []
    for name in (*BOOK_TASKS, *_own(task)):
        t = get_task(name)
        own = name == task and name not in BOOK_TASKS
        rows = t.build_dataset(OWN_TASK["rows"] if own else WARM_START["rows_per_task"], seed + 1)
        answers = [t.reference_answer(row) for row in rows]
        for row in rows:
            prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
            u = rng.random() if own else 1.0  # the book's tasks draw exactly what they always drew
            if u < KNOWN_SHARE:
                answer = t.reference_answer(row)
            elif u < KNOWN_SHARE + ECHO_SHARE and "number" in row:
                answer = str(row["number"])
            else:
                answer = rng.choice(answers)
            body = f"<ans>{answer}</ans>" if rng.random() < WARM_START["tagged"] else answer
            pairs.append((prompt, body + "<|im_end|>"))
    return pairs


def _own(task: str | None) -> tuple[str, ...]:
    """The task that gets a stand-in of its own: any but the book's."""
    return () if task is None or task in BOOK_TASKS else (task,)


def warm_start(model, tokenizer, seed: int = BUILD_SEED, task: str | None = None) -> float:
    """Next-token prediction on the completions of `warm_start_texts`; returns the last loss."""
    import torch

    rng = random.Random(seed)
    pairs = warm_start_texts(tokenizer, seed, task)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START["learning_rate"])
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(OWN_TASK["steps"] if _own(task) else WARM_START["steps"]):
        ids, labels = [], []
        for prompt, completion in rng.sample(pairs, WARM_START["batch"]):
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c = tokenizer(completion, add_special_tokens=False)["input_ids"]
            ids.append(p + c)
            labels.append([-100] * len(p) + c)  # learn the completion, not the prompt
        width = max(map(len, ids))
        pad = [width - len(i) for i in ids]  # left padding, as generation sees prompts
        input_ids = torch.tensor([[tokenizer.pad_token_id] * k + i for k, i in zip(pad, ids, strict=True)])
        label_ids = torch.tensor([[-100] * k + i for k, i in zip(pad, labels, strict=True)])
        mask = (torch.arange(width)[None, :] >= torch.tensor(pad)[:, None]).long()
        loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return float(loss)


def recipe_hash(task: str | None = None) -> str:
    """Changes whenever what the cached model is made of changes: the shape, the tokens, the template,
    the warm start and the tasks' prompts (a task of its own, and how often it is answered right)."""
    from task import get_task

    recipe = {
        "config": tiny_config_dict(),
        "tokens": SPECIAL_TOKENS + CHARACTERS,
        "template": CHAT_TEMPLATE,
        "warm_start": WARM_START,
        "seed": BUILD_SEED,
        "tasks": {
            name: [get_task(name).system_prompt, get_task(name).worst_case_prompt()]
            for name in sorted((*BOOK_TASKS, *_own(task)))
        },
    }
    if _own(task):  # only then: the book's stand-in keeps the name it has always had
        recipe["known"] = {task: KNOWN_SHARE, "echo": ECHO_SHARE, **OWN_TASK}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def default_cache(task: str | None = None) -> Path:
    """Where the stand-in for a run on `task` is cached (the book's, for the book's tasks)."""
    return CACHE_ROOT / f"tiny-qwen3-{recipe_hash(task)}"


def ensure_tiny_model(path: Path | None = None, task: str | None = None) -> Path:
    """Build and cache the tiny model and tokenizer at `path` unless already there.

    The folder is written under a temporary name and renamed into place, so an interrupted build
    never leaves a half-written model that later runs would load; a file lock makes two processes
    that start at once build it once.
    """
    path = Path(path) if path is not None else default_cache(task)
    if _complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _complete(path):  # built by the process that held the lock before us
            return path
        tokenizer, model = build_tokenizer(), build_model()
        if model.config.vocab_size < len(tokenizer):
            raise RuntimeError(f"tiny vocab {model.config.vocab_size} < tokenizer size {len(tokenizer)}")
        warm_start(model, tokenizer, task=task)
        return save_pretrained_atomically(model, tokenizer, path)


def _complete(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "tokenizer.json").exists()
