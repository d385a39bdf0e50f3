"""train.py: prepare writes the Parquet, launch prints the sheet and the exact command, runs only where it can."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys

import pytest
from grpo_verl import budget, launch
from grpo_verl.settings import LAB_DIR, REPO_ROOT, load_lab

LAB = load_lab()


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("grpo_verl_train", LAB_DIR / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The README's launch commands (tests/test_readme.py checks each README command is run by a test).
README_LAUNCH = "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card"
README_DRY_RUN = (
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config multi-node --dry-run"
)


def readme_args(words: list[str]) -> list[str]:
    """The arguments a README command (split into words) passes to labs/grpo-verl/train.py."""
    return words[words.index("labs/grpo-verl/train.py") + 1 :]


def printed_command(out: str) -> list[str]:
    text = out.split("\ncommand:\n", 1)[1].strip().split("\n\n")[0]
    return shlex.split(text.replace("\\\n", " "))


@pytest.mark.parametrize("name", sorted(LAB.configs))
def test_launch_prints_the_sheet_the_verdict_and_the_exact_command(train, capsys, tmp_path, name):
    cfg = LAB.config(name)
    args = readme_args(shlex.split(README_DRY_RUN))  # the README's multi-node dry run, for each configuration
    args[args.index("--config") + 1] = name
    assert train.main([*args, "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    values = launch.overrides(cfg, LAB.task, tmp_path)
    sheet = budget.sheet(cfg, values)
    assert sheet.table() in out
    assert f"  verdict:     {sheet.verdict()}" in out
    assert f"  cards:       {cfg.nnodes} x {cfg.n_gpus_per_node} {cfg.gpu} ({cfg.cards} in all)" in out
    command = printed_command(out)
    assert command == launch.command(cfg, values, ray_address=None)
    entry = command[command.index("verl.trainer.main_ppo") + 1 :]
    assert entry == launch.hydra_args(values)
    if cfg.submit == "ray-job":
        assert command[1:3] == ["job", "submit"] and command[
            command.index("--") + 2 : command.index("--") + 4
        ] == [
            "-m",
            "verl.trainer.main_ppo",
        ]


def test_extra_overrides_reach_the_command_and_the_sheet(train, capsys, tmp_path):
    args = ["launch", "--config", "one-card", "--data-dir", str(tmp_path), "--dry-run", "--"]
    group = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]
    assert train.main([*args, *group, "trainer.total_training_steps=5"]) == 0
    out = capsys.readouterr().out
    command = printed_command(out)
    assert "actor_rollout_ref.rollout.n=4" in command and "trainer.total_training_steps=5" in command
    assert "actor_rollout_ref.rollout.n=8" not in command
    assert "1 prompt(s) x 4 completions" in out  # the sheet follows the override


def test_a_misspelt_extra_key_stops_before_anything_runs(train, capsys, tmp_path):
    args = [
        "launch",
        "--config",
        "one-card",
        "--data-dir",
        str(tmp_path),
        "--",
        "actor_rollout_ref.rollout.nn=4",
    ]
    assert train.main(args) == 2
    captured = capsys.readouterr()
    assert "Could not override 'actor_rollout_ref.rollout.nn'" in captured.err
    assert "command:" not in captured.out


def test_without_the_cards_it_prints_and_does_not_start(train, capsys, tmp_path):
    import torch

    if torch.cuda.device_count() >= 1:
        pytest.skip("this machine has a GPU: launching would start a real run")
    assert train.main([*readme_args(shlex.split(README_LAUNCH)), "--data-dir", str(tmp_path)]) == 0
    assert "not started: one-card needs 1 CUDA GPU(s) here; torch sees 0" in capsys.readouterr().out
    assert (
        train.main(["launch", "--config", "multi-node", "--data-dir", str(tmp_path), "--ray-address", ""])
        == 0
    )
    assert "not started: multi-node is submitted to a Ray cluster" in capsys.readouterr().out


def test_the_ray_cli_takes_the_flags_the_command_uses():
    from click.testing import CliRunner
    from ray.dashboard.modules.job.cli import submit  # what `ray job submit` runs

    command = launch.command(LAB.config("multi-node"), {}, ray_address="http://head:8265")
    assert command[0] == str(launch.Path(sys.executable).with_name("ray"))
    flags = [arg for arg in command[3 : command.index("--")] if arg.startswith("--")]
    options = {opt for param in submit.params for opt in getattr(param, "opts", [])}
    assert flags == ["--address"] and set(flags) <= options
    help_text = CliRunner().invoke(submit, ["--help"]).output
    assert "RAY_ADDRESS" in help_text  # without --address the CLI reads the environment


def test_prepare_from_the_command_line(tmp_path):
    """The README's command, in a fresh interpreter of this environment."""
    result = subprocess.run(
        [
            sys.executable,
            str(LAB_DIR / "train.py"),
            "prepare",
            "--data-dir",
            str(tmp_path),
            "--task",
            "sorting",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    for split in ("train", "test"):
        path = tmp_path / "sorting" / f"{split}.parquet"
        assert f"{split}: {path}" in result.stdout and path.stat().st_size > 0


def test_an_unknown_config_or_task_is_one_line(train, capsys):
    assert train.main(["launch", "--config", "two-cards", "--dry-run"]) == 2
    assert "unknown configuration 'two-cards'" in capsys.readouterr().err
    assert train.main(["prepare", "--task", "gsm8k", "--data-dir", "/nonexistent"]) == 2
    assert "unknown task 'gsm8k'" in capsys.readouterr().err
