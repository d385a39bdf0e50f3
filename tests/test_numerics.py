"""The CPU profile computes the same bits in every process and on every machine (grpolab.config.numerics).

What one machine can show of another: torch started with another thread count, ATen's kernels and
MKL's branch asked for by the environment, a process forked from a preloaded parent, and this
process. In each, the pin must give the book's arithmetic, and the stand-in's warm start (shortened:
the arithmetic, not the book's model) the same bytes. The chapters load the shipped stand-ins.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grpolab import tiny_model
from grpolab.config import numerics
from grpolab.lifecycle.atomic import save_pretrained_atomically

from suite import REPO_ROOT, WAVE_TIMEOUT_S, Lab, cpu_only

ON_CPU = cpu_only("checks the CPU profile's arithmetic; a GPU run's is the card's")
# Another machine, as far as one can stand in for it: its core count, its widest kernels, MKL's choice.
ELSEWHERE = {"OMP_NUM_THREADS": "4", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AUTO"}
BUILD_STEPS = 12  # of each warm start: enough for every weight to differ if a sum is added otherwise
# Builds the book's stand-in and chapter 1's from it, shortened, and prints the sha256 of each.
BUILD = """
import hashlib, sys, tempfile
from pathlib import Path
import torch
threads = int(sys.argv[1])
threads and torch.set_num_threads(threads)  # as a machine with that many cores starts torch
from grpolab import tiny_model
from grpolab.lifecycle.atomic import save_pretrained_atomically
with tempfile.TemporaryDirectory() as folder:
    book, tokenizer = tiny_model.build(None, steps=int(sys.argv[2]))
    for name in ("book", "own"):  # chapter 1's continues from the book's, in place: hash each when built
        if name == "own":
            tiny_model.build("small-addition", steps=int(sys.argv[2]), start=book)
        path = save_pretrained_atomically(book, tokenizer, Path(folder) / name)
        print(name, hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest())
"""


def built_here(steps: int) -> dict[str, str]:
    """The sha256 of the book's stand-in and of chapter 1's, each taken when it is built: chapter 1's
    warm start continues the book's model in place."""
    book, tokenizer = tiny_model.build(None, steps=steps)
    hashes = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in ("book", "own"):
            if name == "own":
                tiny_model.build("small-addition", steps=steps, start=book)
            hashes[name] = tiny_model.weights_sha256(
                save_pretrained_atomically(book, tokenizer, Path(folder) / name)
            )
    return hashes


def printed(text: str) -> dict[str, str]:
    return dict(line.split() for line in text.splitlines() if line.startswith(("book ", "own ")))


@pytest.mark.slow
@ON_CPU
def test_the_pin_gives_the_books_arithmetic_whatever_the_environment_asks():
    """A fresh process told to use 4 threads, torch's scalar kernels and MKL's automatic branch
    computes, once pinned, with 1 thread, AVX2 kernels and MKL's compatible branch; one that computed
    before the pin says it is not the book's."""
    pinned = subprocess.run(
        [sys.executable, "-c", "from grpolab.config import numerics; print(numerics.pin().describe())"],
        cwd=REPO_ROOT,
        env={**os.environ, **ELSEWHERE},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pinned.stdout.strip() == "book (1 thread, AVX2 kernels, MKL COMPATIBLE)", pinned.stderr[-2000:]
    late = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; torch.set_num_threads(2); a = torch.ones(64, 64); a @ a\n"
            "from grpolab.config import numerics; numerics.pin(); print(numerics.current().describe())",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **ELSEWHERE},
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The thread count follows the pin at any time; ATen's kernels and MKL's branch were chosen already.
    assert late.stdout.startswith("not the book's (1 thread, DEFAULT kernels, MKL"), (
        late.stdout + late.stderr[-2000:]
    )
    assert "its CPU figures may differ from the README's" in late.stdout


@pytest.mark.slow
@ON_CPU
def test_the_stand_in_is_built_to_the_same_bytes_in_any_process(tmp_path):
    """The warm start, shortened, in this process (torch on 1 thread), in a process forked from the
    suite's preloaded parent asked for 2, and in a fresh process started with 4 threads, torch's scalar
    kernels and MKL's automatic branch: the same bytes, for the book's stand-in and for chapter 1's
    built on it."""
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    fresh = subprocess.Popen(
        [sys.executable, str(script), "4", str(BUILD_STEPS)],
        cwd=REPO_ROOT,
        env={**os.environ, **ELSEWHERE},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    forked = Lab(
        "build-forked", script, ["2", str(BUILD_STEPS)], "sqlite://", tmp_path, threads=2, env=ELSEWHERE
    )
    results = {"this process": built_here(BUILD_STEPS)}
    assert forked.wait(timeout=WAVE_TIMEOUT_S) == 0, forked.log()
    results["forked, 2 threads asked"] = printed(forked.stdout)
    out, err = fresh.communicate(timeout=WAVE_TIMEOUT_S)
    assert fresh.returncode == 0, err[-3000:]
    results["fresh, 4 threads, scalar kernels, MKL AUTO asked"] = printed(out)
    assert all(r.keys() == {"book", "own"} and r["book"] != r["own"] for r in results.values()), results
    assert len({tuple(sorted(r.items())) for r in results.values()}) == 1, results


@ON_CPU
def test_the_chapters_load_the_shipped_stand_ins():
    """Every stand-in a chapter uses is shipped (a fresh clone builds none), and what the cache holds
    is its bytes; a change to a stand-in's recipe renames it, and `python -m grpolab.tiny_model --ship`
    writes the new weights."""
    for task, config in tiny_model.STANDINS:
        shipped = tiny_model.shipped_weights(task, config)
        assert shipped.exists(), f"{shipped.name} ({task or 'the book'}) is not shipped"
        assert tiny_model.weights_sha256(
            tiny_model.ensure_tiny_model(task=task, config=config)
        ) == tiny_model.weights_sha256(shipped)
    names = {p.name for p in tiny_model.SHIPPED.glob("*.safetensors")}
    assert names == {tiny_model.shipped_weights(t, c).name for t, c in tiny_model.STANDINS}, (
        "stale weights shipped"
    )


def test_a_stand_in_built_with_other_arithmetic_is_kept_apart_from_the_books(tmp_path, monkeypatch):
    """No shipped weights for the recipe, and a process that does not compute the book's way (a CPU
    without AVX2, a notebook that computed first): its build goes to a folder named for its arithmetic,
    never under the book's name."""
    other = numerics.Numerics(1, "DEFAULT", "AUTO")
    monkeypatch.setattr(numerics, "pin", lambda: other)
    monkeypatch.setattr(
        tiny_model, "shipped_weights", lambda task=None, config=None: tmp_path / "nothing.safetensors"
    )
    monkeypatch.setitem(tiny_model.WARM_START, "steps", 2)
    path = tiny_model.ensure_tiny_model(tmp_path / "tiny-qwen3-book")
    assert path.name == "tiny-qwen3-book-1t-default-auto" and (path / "model.safetensors").exists()
    assert not (tmp_path / "tiny-qwen3-book").exists()
    assert not other.pinned and "not the book's" in other.describe()


def test_the_recipe_hash_changes_with_the_arithmetic(monkeypatch):
    """Stand-ins built under other arithmetic (before the pin) have other names: no cache of them is
    taken for the book's."""
    before = tiny_model.recipe_hash()
    monkeypatch.setitem(numerics.ENV, "MKL_CBWR", "AVX2")
    assert tiny_model.recipe_hash() != before


def test_shipped_weights_are_saved_back_to_the_same_bytes(tmp_path):
    """A cache made from the shipped weights holds them byte for byte (ensure_tiny_model checks it too)."""
    shipped = tiny_model.shipped_weights()
    path = save_pretrained_atomically(
        tiny_model._from_shipped(shipped), tiny_model.build_tokenizer(), tmp_path / "m"
    )
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == tiny_model.weights_sha256(
        shipped
    )
