"""The CPU profile's tiny Qwen3 and its character-level tokenizer, built offline."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from grpolab.tiny_model import CONFIG_PATH, build_model, build_tokenizer, ensure_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_answer_tags_are_single_tokens_that_survive_decoding(tokenizer):
    ids = tokenizer("<ans>42</ans>", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["<ans>", "4", "2", "</ans>"]
    # TRL decodes completions with skip_special_tokens=True: the tags must not be special.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<ans>42</ans>"


def test_every_character_of_an_addition_prompt_round_trips(tokenizer):
    from task import get_task

    row = get_task("addition").build_dataset(4, 0)[0]
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert text.endswith("<|im_start|>assistant\n")


def test_vocabulary_matches_the_model_shape(tokenizer):
    config = json.loads(CONFIG_PATH.read_text())
    assert len(tokenizer) == config["vocab_size"], (
        "ids the tokenizer cannot decode would waste probability mass"
    )
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert tokenizer.pad_token_id == config["pad_token_id"]


def test_model_is_deterministic_and_qwen3(tmp_path):
    a, b = build_model(seed=0), build_model(seed=0)
    assert a.config.model_type == "qwen3"
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name


def test_cache_is_built_once_and_reloads_offline(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab import tiny_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setitem(tiny_model.WARM_START, "steps", 2)  # the recipe's shape, not its length
    path = ensure_tiny_model(tmp_path / "tiny")
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path / "tiny") == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    out = model(**tok("What is 1 + 2?", return_tensors="pt"))
    assert out.logits.shape[-1] == model.config.vocab_size
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert left == ["tiny"], "no staging folder left behind"


@pytest.mark.slow
def test_two_first_runs_build_the_model_once(tmp_path):
    """Two labs started together on a fresh machine: one builds, the other waits and loads it."""
    import subprocess
    import sys

    from suite import REPO_ROOT

    script = (
        "import sys, os; from grpolab import tiny_model\n"
        "tiny_model.WARM_START['steps'] = 2\n"
        "real = tiny_model.warm_start\n"
        "def counted(*a, **k):\n"
        f"    open({str(tmp_path / 'builds.txt')!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "    return real(*a, **k)\n"
        "tiny_model.warm_start = counted\n"
        f"print(tiny_model.ensure_tiny_model(tiny_model.Path({str(tmp_path / 'tiny')!r})))\n"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    printed = [run.communicate(timeout=300)[0].strip().splitlines() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert printed[0][-1] == printed[1][-1] == str(tmp_path / "tiny")
    # a recipe with no shipped weights: the one that builds says so (minutes with the real recipe)
    assert sum(any(line.startswith("Building the CPU stand-in") for line in p) for p in printed) == 1
    assert len((tmp_path / "builds.txt").read_text().split()) == 1


def test_the_cached_model_is_recognised_by_its_recipe(monkeypatch):
    from grpolab import tiny_model

    before = tiny_model.default_cache()
    monkeypatch.setitem(tiny_model.WARM_START, "steps", 201)
    assert tiny_model.default_cache() != before, "a changed recipe must not reuse the old model"


def test_a_task_added_to_the_registry_does_not_change_the_books_stand_in(monkeypatch, tokenizer):
    """Chapters 1-3 keep their stand-in (and its cache) whatever tasks are registered later; a run on a
    task outside the book's gets a stand-in of its own: the book's, warm-started further on that task."""
    import dataclasses

    import task
    from grpolab import tiny_model

    book = tiny_model.recipe_hash()
    book_pairs = tiny_model.warm_start_texts(tokenizer)
    # The pairs the book stand-in was warm-started on (digest taken from the code before any task of
    # its own existed) and the name its shipped weights have (grpolab/tiny_model/standins): a change here
    # changes chapters 1-3's model under an unchanged name.
    digest = hashlib.sha256(json.dumps(book_pairs).encode()).hexdigest()[:16]
    assert (book, digest) == ("2295c389975b", "fdef10e51f4e97a7")
    monkeypatch.setitem(task.TASKS, "addition-too", dataclasses.replace(task.ADDITION, name="addition-too"))
    assert tiny_model.recipe_hash() == book and tiny_model.recipe_hash("addition") == book
    assert tiny_model.warm_start_texts(tokenizer) == book_pairs
    own_hash = tiny_model.recipe_hash("lastdigit")
    assert own_hash not in (book, tiny_model.recipe_hash("addition-too"))
    # Chapter 4's stand-in is derived as it was measured (the name its shipped weights have), whatever
    # other task gets a recipe of its own (chapter 1's small-addition).
    assert own_hash == "53793162aeb2" and tiny_model.recipe_hash("small-addition") not in (book, own_hash)
    monkeypatch.setitem(tiny_model.WARM_START, "steps", 201)  # the book's recipe changes: so does the task's
    assert tiny_model.recipe_hash("lastdigit") != own_hash


def test_a_task_of_its_own_is_answered_right_now_and_then_and_sometimes_echoed(tokenizer):
    """The rows a stand-in of its own is warm-started on: a share answered right, a share echoing the
    prompt's number (what a loose checker pays), the rest another row's answer; never all right."""
    import task
    from grpolab import tiny_model

    own = tiny_model.own_task_texts(tokenizer, "lastdigit")
    rows = task.LASTDIGIT.build_dataset(tiny_model.OWN_TASK["rows"], tiny_model.BUILD_SEED + 1)
    assert len(own) == len(rows) == tiny_model.OWN_TASK["rows"]
    answers = [c.replace("<ans>", "").replace("</ans>", "").removesuffix("<|im_end|>") for _, c in own]
    right = sum(a == str(row["target"]) for a, row in zip(answers, rows, strict=True)) / len(own)
    echoed = sum(a == str(row["number"]) for a, row in zip(answers, rows, strict=True)) / len(own)
    tagged = sum(c.startswith("<ans>") for _, c in own) / len(own)
    known, echo = tiny_model.OWN_TASK["known"], tiny_model.OWN_TASK["echo"]
    # `known` right on purpose, plus another row's answer that happens to share the digit (about one in
    # ten of the rest).
    assert known - 0.05 <= right <= known + 0.1, right
    assert abs(echoed - echo) < 0.05, echoed
    assert abs(tagged - tiny_model.OWN_TASK["tagged"]) < 0.05, tagged
    assert all(p.startswith("<|im_start|>system") and p.endswith("<|im_start|>assistant\n") for p, _ in own)


def test_chapter_1s_stand_in_knows_its_sums_from_training_problems_only(tokenizer):
    """small-addition's rows (chapter 1's CPU profile): every answer right, so it learns to add; none of
    them a held-out problem (in either order), so what it knows of those it works out; a fifth in the
    tag, so it reaches for the tag rarely."""
    import task
    from grpolab import tiny_model
    from task.dataset import split_of

    recipe = tiny_model.own_recipe("small-addition")
    own = tiny_model.own_task_texts(tokenizer, "small-addition")
    rows = task.SMALL_ADDITION.build_dataset(recipe["rows"], tiny_model.BUILD_SEED + 1)
    answers = [c.replace("<ans>", "").replace("</ans>", "").removesuffix("<|im_end|>") for _, c in own]
    assert answers == [str(row["a"] + row["b"]) for row in rows]
    assert all(split_of((min(r["a"], r["b"]), max(r["a"], r["b"]))) == "train" for r in rows)
    held_out = task.SMALL_ADDITION.build_eval_dataset(64, 0)
    assert not {p for p, _ in own} & {tiny_model._prompt(tokenizer, r) for r in held_out}
    tagged = sum(c.startswith("<ans>") for _, c in own) / len(own)
    assert abs(tagged - recipe["tagged"]) < 0.05, tagged
    assert max(r["a"] for r in rows) == max(r["b"] for r in rows) == 19


def test_a_stand_in_of_its_own_starts_from_the_books(monkeypatch, tmp_path):
    """Built from the book's cached stand-in, so it costs only the task's own steps; the book's is
    left as it was."""
    from safetensors.torch import load_file

    from grpolab import tiny_model

    monkeypatch.setitem(tiny_model.OWN_TASK, "steps", 2)  # the recipe's shape, not its length
    book = ensure_tiny_model()
    before = (book / "model.safetensors").read_bytes()
    own = ensure_tiny_model(tmp_path / "own", task="lastdigit")
    assert (book / "model.safetensors").read_bytes() == before
    a, b = load_file(str(book / "model.safetensors")), load_file(str(own / "model.safetensors"))
    assert a.keys() == b.keys()
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert moved, "the task's steps changed no weight"
    # Two steps at the warm start's learning rate move weights a little, not away from the book's.
    assert all((a[k] - b[k]).abs().max() < 0.1 for k in a), max((a[k] - b[k]).abs().max() for k in a)


def test_the_warm_started_model_answers_in_the_format_now_and_then():
    """Like a base model: the format sometimes (so a group of 16 usually holds a success to learn
    from), the right answer almost never (so there is something left to learn)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from task import get_task

    path = ensure_tiny_model()  # the lab's own cached model
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    task = get_task("addition")
    rows = task.build_dataset(32, 11)
    completions, targets = [], []
    for row in rows:
        prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        inputs = tok(prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(
            **inputs, do_sample=True, max_new_tokens=32, num_return_sequences=8, pad_token_id=0
        )
        completions += tok.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        targets += [row["target"]] * 8
    correctness, fmt = (f(None, completions, target=targets) for f in task.reward_funcs)
    format_rate = sum(x > 0 for x in fmt) / len(fmt)
    print(f"\nwarm-started tiny model: format {format_rate:.1%}, correct {sum(correctness) / len(fmt):.1%}")
    # The shipped stand-in under the pinned arithmetic computes this on any machine; over sampling seeds
    # 0-4 the format rate was 0.254 to 0.328 and correctness 0 (measured 2026-12-03): the bounds hold
    # for any of them.
    assert 0.03 <= format_rate <= 0.5
    assert sum(correctness) / len(fmt) < 0.02


def test_an_interrupted_save_leaves_no_folder(tmp_path):
    from grpolab.lifecycle.atomic import save_pretrained_atomically

    class Breaks:
        def save_pretrained(self, path):
            (Path(path) / "half-written.bin").write_bytes(b"\0" * 10)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_pretrained_atomically(Breaks(), build_tokenizer(), tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []


def test_a_question_asked_by_a_config_is_asked_of_the_tasks_own_stand_in_unless_the_book_names_one(
    tokenizer,
):
    """The model does not change with the question (chapter 8's digit-sum arm asks lastdigit's own
    stand-in), except where OWN_CONFIGS warm-starts one for it: the first digit's, every row answered
    right and in the tag, a model that already solves its task."""
    from grpolab import tiny_model
    from task import get_task

    own = tiny_model.shipped_weights("lastdigit")
    assert tiny_model.shipped_weights("lastdigit", '{"ask": "digit_sum"}') == own
    assert tiny_model.shipped_weights("lastdigit", '{"ask":"last_digit"}') == own
    first = '{"ask": "first_digit"}'
    assert tiny_model.shipped_weights("lastdigit", first) != own
    pairs = tiny_model.own_task_texts(tokenizer, "lastdigit", config=first)
    rows = get_task("lastdigit", first).build_dataset(len(pairs), tiny_model.BUILD_SEED + 1)
    assert [c for _, c in pairs] == [f"<ans>{row['target']}</ans><|im_end|>" for row in rows]
