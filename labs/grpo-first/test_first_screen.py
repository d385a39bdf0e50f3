"""The README command's first screen, read as a newcomer reads it: what it says up to its first step.

On a CPU the stand-in's banner comes before the budget sheet it explains, and no library line says
what is untrue of the run or asks for what the lab does not do. The suite's quick matrix runs the
README command in a fresh process (its `plain` cell, conftest.py `run_matrix_quick`: a fresh store, a
fresh stand-in cache, Unsloth imported by the lab itself), which is what a user's first run prints;
the chapter's own run is forked from the suite's parent, which imported the libraries for it.
"""

from __future__ import annotations

import logging
import re
import sys

import pytest

from grpolab.lab import console
from grpolab.lab.console import STEP_PREFIX

from suite import cpu_only

BANNER = "=== No CUDA GPU found: running the CPU stand-in of this lab ==="
SHEET = "tiny-qwen3 on host CPU and RAM"  # the sheet's first line on the CPU profile
# Each line the first screen used to show (issue 41), and how to recognise it.
NOISE = {
    "bitsandbytes asks to `pip install kernels` in a uv-locked project": re.compile(r"pip install kernels"),
    "Unsloth says bfloat16 = True on a machine that trains in float32": re.compile(r"bfloat16 = True"),
    "Unsloth says 'this GPU has no bfloat16 support' with no GPU": re.compile(r"this GPU has no bfloat16"),
    "MLflow's INFO lines (its store's migration, its system metrics)": re.compile(r"\bINFO mlflow\."),
    "a 'Writing model shards' bar for a copy the reader did not ask for": re.compile(r"Writing model shards"),
}


def first_screen(text: str) -> str:
    """Everything printed before the first training step's line."""
    at = text.find(f"{STEP_PREFIX}1/")
    assert at > 0, f"no first step in:\n{text[-3000:]}"
    return text[:at]


def noise_in(screen: str) -> list[str]:
    return [what for what, pattern in NOISE.items() if pattern.search(screen)]


def test_noise_in_names_each_line_the_first_screen_used_to_show():
    """The check can fail: the first screen as it was (2026-12-05, a 2-core EPYC with AVX512-BF16)."""
    before = (
        "tiny-qwen3 on host CPU and RAM (cpu), layout generate\n"
        f"{BANNER}\n"
        "[bitsandbytes.backends.cpu.ops|WARNING]Failed to load CPU gemm_4bit_forward from kernels-community: "
        "No module named 'kernels'. Please make sure you already `pip install kernels` and the kernels >= 0.11.1\n"
        "Unsloth 2026.10.9: no GPU found, training on CPU (x86_64, 1 threads, bfloat16 = True). CPU training\n"
        "Writing model shards: 100%|##########| 1/1 [00:00<00:00, 661.77it/s]\n"
        "2026/12/05 08:01:24 INFO mlflow.store.db.utils: Creating initial MLflow database tables...\n"
        "Unsloth: Model is in float32 and this GPU has no bfloat16 support, so training stays in float32.\n"
    )
    assert noise_in(before) == list(NOISE)
    assert before.index(SHEET) < before.index(BANNER)


@pytest.mark.slow
@cpu_only("reads the CPU profile's first screen; on a GPU the lab prints no stand-in banner")
def test_the_readme_commands_first_screen_says_nothing_untrue_and_opens_with_the_banner(matrix_quick):
    log = matrix_quick["out"] / "cells" / "grpo-first" / "plain-seed0" / "log"
    screen = first_screen(log.read_text())
    assert noise_in(screen) == [], screen
    assert BANNER in screen and SHEET in screen, screen
    assert screen.index(BANNER) < screen.index(SHEET), screen


@pytest.mark.slow
@cpu_only("reads the CPU profile's first screen; on a GPU the lab prints no stand-in banner")
def test_the_chapters_run_prints_its_banner_before_its_sheet(chapter_run):
    screen = first_screen(chapter_run.stdout)
    assert screen.index(BANNER) < screen.index(SHEET) and noise_in(screen) == [], screen


def test_the_screen_drops_only_the_lines_the_lab_has_said_itself(capsys):
    line = "Unsloth 2026.10.9: no GPU found, training on CPU (x86_64, 1 threads, bfloat16 = True). CPU"
    other = "Unsloth: Model is in float16 precision but you want to use bfloat16 precision."
    before = sys.stdout
    with console.screen():
        print(line)  # the lab has not said it yet: it passes
        console.said_by_the_lab(console.UNSLOTH_CPU_LINES)
        print(line)
        print(
            "Unsloth: Model is in float32 and this GPU has no bfloat16 support, so training stays in float32."
        )
        print(other)
        print("a partial line", end="", flush=True)
    assert sys.stdout is before and console._said == []
    assert capsys.readouterr().out.splitlines() == [line, other, "a partial line"]


def test_library_noise_is_quieted_and_warnings_stay(caplog):
    console.quiet_library_noise()
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        bnb.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "No module named 'kernels'"
        )
        bnb.warning("a real warning of bitsandbytes")
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        logging.getLogger("mlflow.store.db.utils").warning("a real warning of MLflow's store")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["a real warning of bitsandbytes", "a real warning of MLflow's store"]
