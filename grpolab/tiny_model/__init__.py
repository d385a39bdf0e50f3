"""The CPU profile's model: a tiny Qwen3 and a character-level tokenizer, built offline.

Without a GPU (and without the Hub) the lab still runs its whole loop, so it needs a model it can
build offline. This one has Qwen3's architecture, the shape in budgets/models/tiny-qwen3.json, and
a tokenizer whose tokens are single characters plus the few special tokens the chat template and the
tasks' answer tags need.

Its random weights are warm-started for a few hundred steps of next-token prediction on answers
shaped like each of the book's tasks' (addition, countdown, sorting), about a third of them inside
<ans></ans> and all of them another prompt's answer: like a real base model, it then answers in the
task's format now and then (about 14% of samples) and almost never correctly, so GRPO has something
to reinforce. A run on another task (chapter 4's `lastdigit`) gets a stand-in of its own: this one,
warm-started 250 steps more on 1200 of that task's rows, half of them answered right, 30%
echoing the prompt's number, half of them inside the tag. Measured 2026-12-04: 42 to 49 of 64
held-out prompts right, greedy, before any GRPO (by seed), so GRPO has right answers to reinforce and
room to raise them, and about 30 seconds to build on top of the book's. A purely random model lands
the format (exactly one tag holding a well-formed answer) in well under 1% of samples, too rarely for
a group of 16 to hold a success. Built once, then cached as an ordinary `save_pretrained` folder
that Unsloth and transformers load like any model from the Hub, under a name that changes with the
recipe, and under a lock so two first runs build it once.

It is built under the CPU profile's pinned arithmetic (grpolab.config.numerics), so its bytes are the same on
every machine and in every process, whichever builds `.cache/` first; `BOOK_SHA256` holds them, and a
process that cannot compute the book's way (a CPU without AVX2, a notebook that computed before the
pin) builds its own under another name and says so, never the book's. `python -m grpolab.tiny_model --check` rebuilds each shipped stand-in and compares.

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import random
import string
from functools import lru_cache
from pathlib import Path

from grpolab.config import numerics
from grpolab.config.paths import REPO_ROOT, cache_root
from grpolab.lifecycle.atomic import save_pretrained_atomically

CONFIG_PATH = REPO_ROOT / "budgets" / "models" / "tiny-qwen3.json"
# The stand-ins' weights as the book built them, shipped so that every clone loads the same bytes
# without building them (`python -m grpolab.tiny_model --check` rebuilds and compares).
SHIPPED = Path(__file__).resolve().parent / "standins"
BUILD_SEED = 0
# The warm start: steps of next-token prediction, completions per step, AdamW's learning rate, the
# share of completions inside <ans></ans>, and the training rows drawn from each task.
WARM_START = {"steps": 200, "batch": 32, "learning_rate": 1e-2, "tagged": 0.3, "rows_per_task": 400}
# The book's stand-in is warm-started on these tasks, each answer another row's (almost never right).
# Named, not read from the registry: a task added later must not change the book's stand-in.
BOOK_TASKS = ("addition", "countdown", "sorting")
# A run on any other task gets a stand-in of its own: the book's stand-in (built first, cached, as
# chapters 1-3 use it) warm-started further on that task's rows alone, of which a share `known` are
# answered right, a share `echo` echo the number the prompt asks about (its `number` column, when it
# has one) and the rest another row's answer. Like a real base model it then knows the task now and
# then, so GRPO has right answers to reinforce (a model never right, as on the book's tasks, gives GRPO
# nothing to learn an answer from in a CPU-sized run), and it sometimes repeats the question, which a
# loose checker pays and the exact reward does not. Continuing from the book's stand-in, on short rows,
# keeps its build to seconds. Measured 2026-12-02 on lastdigit (greedy, 64 held-out prompts), by the
# steps beyond the book's: 150 steps 6% right (no better than a guess), 200 31%, 250 50%, 300 70%, 400
# 72%; 250 leaves GRPO room to show an honest reward raising it. Half of its rows inside the tag (the
# book's stand-in: 30%) and 30% of them echoing the number, both for chapter 4 on every seed (measured
# 2026-12-04 under the pinned arithmetic, 24 steps an arm, seeds 0-4): a right answer pays only inside
# the tag, and at 30% tagged a sampled completion was right and tagged about one time in seven, so
# the exact arm gained as little as 3 held-out prompts of 64 on one seed; at 50% the loose arm at the
# book's beta, paid as often for the right digit as for the hack, learned the task instead of hacking
# on one seed of five; with 30% echoing (not 20%), the echo, which always pays, is the loose checker's
# surest payout, and both loose arms hack on all five.
OWN_TASK = {"rows": 1200, "steps": 250, "known": 0.5, "echo": 0.3, "tagged": 0.5}
# Chapter 1's CPU profile (`small-addition`, sums of numbers in 0..19) gets its own recipe: every
# answer right, rows drawn from the training split only (the held-out problems are never shown), a
# fifth of them in the tag, 1200 steps. Then it works out the sums of held-out problems it never saw,
# 58 of 64 greedy (the first integer it writes), and tags 2 of them: it knows its sums and rarely
# reaches for the tag, as Qwen3-4B does before GRPO teaches it the tag. Measured 2026-12-03 under the
# pinned arithmetic, by its steps: 600 25 of 64, 900 49, 1200 58; at 600 (the first recipe) chapter 1's
# correctness climbed less than the book's +0.3 on every seed of five (0.17 to 0.29).
OWN_TASKS = {"small-addition": {"rows": 1200, "steps": 1200, "known": 1.0, "echo": 0.0, "tagged": 0.2}}


# A task from outside the registry (a file, a data file, reasoning-gym: chapter 7) gets twice the
# steps, and fewer of its rows in the tag. 250 steps leave a stand-in that has learned only the
# commonest answer of a task harder to copy than lastdigit's: on chapter 7's largest digit it answered
# "8" to all 64 held-out numbers (14 right, greedy), and GRPO then learned "9", the next commonest, on
# seeds 0-4, not the task. At 500 it answers by the number (greedy, first integer: 250 steps 14 of 64,
# 400 41, 500 38 to 41). With half of its rows in the tag it was then right in the tag on 48 to 53 of
# 64 before GRPO, and 40 steps moved no greedy answer on seeds 0-4; with 30% it never tags greedy, knows
# the digit of 16 to 29 of 64, and GRPO teaches the tag: held-out accuracy rose by exactly those counts
# (measured 2026-12-05 under the pinned arithmetic).
OUTSIDE_TASK = {**OWN_TASK, "steps": 500, "tagged": 0.3}


# A book's task asked another question by its config (lastdigit's ASKS) is asked of the same model:
# the model does not change with the question, unless the book warm-starts one of its own for it,
# named here by (task, config). Chapter 8's solved arm asks lastdigit's stand-in's sibling the first
# digit, a question its warm start answered right and in the tag every time (steps as OWN_TASK's: the
# book's stand-in plus 250 steps): it already solves it, as Qwen3-4B solves a task too easy for it.
# Its digit-sum arm asks lastdigit's own stand-in, which reads a last digit and never adds.
OWN_CONFIGS = {
    ("lastdigit", '{"ask": "first_digit"}'): {**OWN_TASK, "known": 1.0, "echo": 0.0, "tagged": 1.0},
}


def standin_of(task: str | None, config: str | None) -> tuple[str | None, str | None]:
    """The (task, config) whose stand-in a run on `task` with `config` loads: a book's task's own
    (config None) unless OWN_CONFIGS names one for its config; a task outside the registry keeps its
    config (a data file's columns and checker, a reasoning-gym dataset's arguments make its rows)."""
    from task import TASKS, task_config

    if task not in TASKS or not config:
        return task, config
    key = json.dumps(task_config(config), sort_keys=True)
    return (task, key) if (task, key) in OWN_CONFIGS else (task, None)


def own_recipe(task: str, config: str | None = None) -> dict:
    """How the stand-in of a task outside the book's is warm-started: OWN_CONFIGS's for a config it
    names, else lastdigit's recipe for the registry's tasks unless named, OUTSIDE_TASK for a task from
    outside the registry."""
    from task import TASKS

    if (task, config) in OWN_CONFIGS:
        return OWN_CONFIGS[(task, config)]
    return OWN_TASKS.get(task, OWN_TASK if task in TASKS else OUTSIDE_TASK)


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


def warm_start_texts(tokenizer, seed: int = BUILD_SEED) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of the book's tasks: the completion is another row's answer, inside
    <ans></ans> for a share `tagged` of them. Answer-shaped, almost never right."""
    from task import get_task

    rng = random.Random(seed)
    pairs = []
    for name in BOOK_TASKS:
        t = get_task(name)
        rows = t.build_dataset(WARM_START["rows_per_task"], seed + 1)
        answers = [t.reference_answer(row) for row in rows]
        for row in rows:
            pairs.append((_prompt(tokenizer, row), _completion(rng.choice(answers), rng)))
    return pairs


def own_task_texts(
    tokenizer, task: str, seed: int = BUILD_SEED, config: str | None = None
) -> list[tuple[str, str]]:
    """(prompt, completion) pairs of a task outside the book's (its training split only): a share
    `known` answered right, `echo` the prompt's number repeated, the rest another row's answer."""
    from task import get_task

    rng = random.Random(seed)
    task, config = standin_of(task, config)
    t, recipe = get_task(task, config), own_recipe(task, config)
    rows = t.build_dataset(recipe["rows"], seed + 1)
    answers = [t.reference_answer(row) for row in rows]
    tagged = recipe.get("tagged", WARM_START["tagged"])
    pairs = []
    for row in rows:
        u = rng.random()
        if u < recipe["known"]:
            answer = t.reference_answer(row)
        elif u < recipe["known"] + recipe["echo"] and "number" in row:
            answer = str(row["number"])
        else:
            answer = rng.choice(answers)
        pairs.append((_prompt(tokenizer, row), _completion(answer, rng, tagged)))
    return pairs


def _prompt(tokenizer, row) -> str:
    return tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)


def _completion(answer: str, rng: random.Random, tagged: float = WARM_START["tagged"]) -> str:
    body = f"<ans>{answer}</ans>" if rng.random() < tagged else answer
    return body + "<|im_end|>"


def _own(task: str | None) -> bool:
    """Whether a run on `task` gets a stand-in of its own: any task but the book's."""
    return task is not None and task not in BOOK_TASKS


def warm_start(model, tokenizer, pairs: list[tuple[str, str]], steps: int, seed: int = BUILD_SEED) -> float:
    """`steps` of next-token prediction on the completions of `pairs`; returns the last loss."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START["learning_rate"])
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
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
    return float(loss.detach())


def recipe_hash(task: str | None = None, config: str | None = None) -> str:
    """Changes whenever what the cached model is made of changes: the shape, the tokens, the template,
    the warm start and the tasks' prompts; for a task of its own, also the book's stand-in it starts
    from and that task's rows (how often right, how often echoed). A task from outside the registry
    (a file, a data file, reasoning-gym) is named by its rows, not by where its file lies, so every
    clone of the repository shares its stand-in."""
    from task import TASKS, get_task

    recipe = {
        "config": tiny_config_dict(),
        "tokens": SPECIAL_TOKENS + CHARACTERS,
        "template": CHAT_TEMPLATE,
        "warm_start": WARM_START,
        "seed": BUILD_SEED,
        "numerics": numerics.ENV,
        "tasks": {
            name: [get_task(name).system_prompt, get_task(name).worst_case_prompt()] for name in BOOK_TASKS
        },
    }
    if not _own(task):  # the book's stand-in keeps the name it has always had
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    task, config = standin_of(task, config)
    t = get_task(task, config)
    described = [task, t.system_prompt, t.worst_case_prompt()]
    if task not in TASKS:  # its content, not its name or its path: the same task, the same stand-in
        described = [t.system_prompt, t.worst_case_prompt(), _rows_digest(t, own_recipe(task)["rows"])]
    own = {
        "from": recipe_hash(),
        "task": described,
        "own_task": own_recipe(task, config),
        "warm_start": WARM_START,
        "seed": BUILD_SEED,
    }
    return hashlib.sha256(json.dumps(own, sort_keys=True).encode()).hexdigest()[:12]


@lru_cache(maxsize=16)
def _rows_digest(t, n: int) -> str:
    """The digest of the `n` rows a task's stand-in is warm-started on: built once a process per task
    (a run asks for its stand-in's name several times; a reasoning-gym task builds its rows slowly)."""
    rows = t.build_dataset(n, BUILD_SEED + 1)
    text = json.dumps(
        [[row["prompt"], t.reference_answer(row), row.get("number")] for row in rows], default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache(task: str | None = None, config: str | None = None) -> Path:
    """Where the stand-in for a run on `task` is cached (the book's, for the book's tasks)."""
    return cache_root() / f"tiny-qwen3-{recipe_hash(task, config)}"


def shipped_weights(task: str | None = None, config: str | None = None) -> Path:
    """Where the repository ships the weights of the stand-in for `task` (`--ship` writes them)."""
    return SHIPPED / f"tiny-qwen3-{recipe_hash(task, config)}.safetensors"


def weights_sha256(path: Path) -> str:
    """The sha256 of a stand-in folder's (or a weights file's) weights."""
    path = Path(path)
    return hashlib.sha256((path if path.is_file() else path / "model.safetensors").read_bytes()).hexdigest()


def build(task: str | None = None, steps: int | None = None, start=None, config: str | None = None):
    """The stand-in for `task` trained from its random start: (model, tokenizer). A task of its own
    continues from the book's stand-in, `start` or else the cached one; `steps` shortens the warm start
    (a test of the arithmetic, not the book's model)."""
    numerics.pin()  # the book's arithmetic, whoever builds it
    tokenizer = build_tokenizer()
    if _own(task):
        model = start if start is not None else _load(ensure_tiny_model())
        pairs = own_task_texts(tokenizer, task, config=config)
        warm_start(model, tokenizer, pairs, steps or own_recipe(*standin_of(task, config))["steps"])
        return model, tokenizer
    model = build_model()
    if model.config.vocab_size < len(tokenizer):
        raise RuntimeError(f"tiny vocab {model.config.vocab_size} < tokenizer size {len(tokenizer)}")
    warm_start(model, tokenizer, warm_start_texts(tokenizer), steps or WARM_START["steps"])
    return model, tokenizer


def ensure_tiny_model(path: Path | None = None, task: str | None = None, config: str | None = None) -> Path:
    """The tiny model and tokenizer at `path` (the cache, by default), made there unless already there:
    from the shipped weights when the repository has them for this recipe, else built (minutes).

    The folder is written under a temporary name and renamed into place, so an interrupted build
    never leaves a half-written model that later runs would load; a file lock makes two processes
    that start at once make it once. A build in a process whose arithmetic is not the book's (a
    notebook that computed before the pin, a CPU without AVX2) goes to a folder of its own, named so:
    its bytes are not the book's and must not be taken for them.
    """
    path = Path(path) if path is not None else default_cache(task, config)
    if _complete(path):
        return path
    shipped = shipped_weights(task, config)
    if not shipped.exists():
        pinned = numerics.pin()
        if not pinned.pinned:
            path = path.with_name(
                f"{path.name}-{pinned.threads}t-{pinned.capability}-{pinned.mkl_branch}".lower()
            )
            if _complete(path):
                return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _complete(path):  # made by the process that held the lock before us
            return path
        if shipped.exists():
            model, tokenizer = _from_shipped(shipped), build_tokenizer()
        else:
            print(
                f"Building the CPU stand-in {path.name} (no shipped weights for this recipe: minutes)",
                flush=True,
            )
            model, tokenizer = build(task, config=config)
        # A copy of the shipped weights into the cache: no bar for what the reader did not ask to watch.
        save_pretrained_atomically(model, tokenizer, path, progress_bar=False)
        if shipped.exists() and weights_sha256(path) != weights_sha256(shipped):
            raise RuntimeError(
                f"{path} does not hold {shipped}'s bytes after saving them: delete {path} and rerun"
            )
        return path


def _from_shipped(shipped: Path):
    """The tiny Qwen3 with the shipped weights (its tied lm_head from the embedding, as saved)."""
    from safetensors.torch import load_model

    model = build_model()
    load_model(model, str(shipped))
    model.eval()
    return model


def _load(path: Path):
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(path, torch_dtype="float32")


def _complete(path: Path) -> bool:
    return (path / "config.json").exists() and (path / "tokenizer.json").exists()


# --- the shipped weights: checked against a rebuild, and written when the recipe changes ------------
# Each as (task, --task-config): the book's, chapter 1's and 5's, chapter 4's, and chapter 7's three
# ways in as its page runs them (its own task file, which `task new` writes too, the data file, the
# reasoning-gym dataset). A task from outside the registry is named by its content, so the path here
# is only where to read it.
_OWN = REPO_ROOT / "labs" / "grpo-own-task"
STANDINS: tuple[tuple[str | None, str | None], ...] = (
    (None, None),
    ("small-addition", None),
    ("lastdigit", None),
    ("lastdigit", '{"ask": "first_digit"}'),
    (str(_OWN / "largest_digit.py"), None),
    (str(_OWN / "products.jsonl"), '{"checker": "integer"}'),
    ("reasoning-gym:basic_arithmetic", '{"max_terms": 2, "max_digits": 1}'),
)


def _named(task: str | None, config: str | None) -> str:
    return "the book" if task is None else f"{task} {config}" if config else task


def main(argv: list[str] | None = None) -> int:
    """`python -m grpolab.tiny_model --check`: rebuild every stand-in the chapters use from its random
    start (minutes) and compare its bytes with the shipped weights; `--ship` writes them instead (after
    a change to the recipe, which changes their names)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m grpolab.tiny_model", description=main.__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="rebuild and compare with the shipped weights")
    what.add_argument("--ship", action="store_true", help="rebuild and write the shipped weights")
    args = parser.parse_args(argv)
    print(f"arithmetic: {numerics.pin().describe()}", flush=True)
    differ = 0
    with tempfile.TemporaryDirectory() as folder:
        book: Path | None = None
        for i, (task, config) in enumerate(STANDINS):
            # A task's stand-in continues from the book's rebuilt here, not the cached one: the whole chain.
            model, tokenizer = build(task, start=None if task is None else _load(book), config=config)
            built = save_pretrained_atomically(model, tokenizer, Path(folder) / str(i))
            book = book or built
            sha, shipped = weights_sha256(built), shipped_weights(task, config)
            if args.ship:
                SHIPPED.mkdir(exist_ok=True)
                shipped.write_bytes((built / "model.safetensors").read_bytes())
                print(f"{shipped.name}  {sha}  shipped ({_named(task, config)})", flush=True)
                continue
            same = shipped.exists() and weights_sha256(shipped) == sha
            differ += not same
            verdict = (
                "the shipped bytes"
                if same
                else f"DIFFERS from {shipped.name if shipped.exists() else 'nothing shipped'}"
            )
            print(f"{shipped.name}  {sha}  {verdict} ({_named(task, config)})", flush=True)
    if args.ship:
        for stale in set(SHIPPED.glob("*.safetensors")) - {shipped_weights(t, c) for t, c in STANDINS}:
            stale.unlink()
    return 1 if differ else 0
