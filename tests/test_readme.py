"""Every command in the README is exercised: here, by another test, or by .ci/run.

A command added to the README without a way to exercise it fails this test.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import HAS_CUDA, README_FLAGS, REPO_ROOT, only_run

README = REPO_ROOT / "README.md"

# Commands another file runs, and the text in that file that shows it runs exactly this one.
RUN_ELSEWHERE = {
    "uv run python labs/grpo-first/train.py": (
        "tests/conftest.py",
        '["uv", "run", "python", "labs/grpo-first/train.py"]',
    ),
    "uv run pytest": (".ci/run", "uv run pytest"),
    "uv run mlflow ui --backend-store-uri sqlite:///mlflow.db": (
        "tests/test_mlflow_ui.py",
        '["mlflow", "ui", "--backend-store-uri", "sqlite:///mlflow.db"]',
    ),
    "uv run jupyter lab": ("tests/test_notebooks.py", '["uv", "run", "jupyter", "lab"]'),
    # Chapter 2's CPU sweep: its fixture runs the README's sweep with --run-refused (the same sweep,
    # then the refused cell run anyway).
    "uv run python labs/grpo-sizing/train.py": (
        "tests/conftest.py",
        'README_SWEEP_REFUSED = ["uv", "run", "python", "labs/grpo-sizing/train.py", "--run-refused"]',
    ),
    "uv run python labs/grpo-sizing/train.py --run-refused": (
        "tests/conftest.py",
        'README_SWEEP_REFUSED = ["uv", "run", "python", "labs/grpo-sizing/train.py", "--run-refused"]',
    ),
    # Chapter 4: its fixture runs the README's command once (every arm), shared with its notebook.
    "uv run python labs/grpo-reward-hacking/train.py": (
        "tests/conftest.py",
        'README_HACKING = ["uv", "run", "python", "labs/grpo-reward-hacking/train.py"]',
    ),
    # Chapter 1's other commands: the end-to-end test scores the adapter its shared run saved; the
    # wave of lab processes (tests/conftest.py) rehearses the CPU profile and trains countdown.
    "uv run python labs/grpo-first/train.py --eval-only outputs/grpo-first/<run>/adapter": (
        "tests/test_lab_end_to_end.py",
        'run_lab(["--eval-only", str(adapter)]',
    ),
    "uv run python labs/grpo-first/train.py --rehearse": (
        "tests/conftest.py",
        'Lab("rehearse", ["--profile", "cpu", "--rehearse"]',
    ),
    "uv run python labs/grpo-first/train.py --task countdown": (
        "tests/conftest.py",
        '["--task", "countdown", "--max-steps", "2", *quick]',
    ),
    # Resuming: the stopped runs of the wave resumed as the README says, and the run id a refusal names.
    "uv run python labs/grpo-first/train.py --resume last": (
        "tests/test_run_resume.py",
        'README_RESUME = ["uv", "run", "python", "labs/grpo-first/train.py", "--resume", "last"]',
    ),
    "uv run python labs/grpo-first/train.py --resume <run id>": (
        "tests/test_run_resume.py",
        '["--resume", run.info.run_id]',
    ),
    "uv run python -m grpolab runs": (
        "tests/test_run_resume.py",
        'README_RUNS = ["uv", "run", "python", "-m", "grpolab", "runs"]',
    ),
    "uv run python -m grpolab runs --reconcile": (
        "tests/test_run_endings.py",
        '["uv", "run", "python", "-m", "grpolab", "runs", "--reconcile"]',
    ),
    # The verl chapter runs in its own environment: .ci/run syncs it and runs these.
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py prepare": (
        ".ci/run",
        "uv run --frozen --project labs/grpo-verl python labs/grpo-verl/train.py prepare",
    ),
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-node --dry-run": (
        ".ci/run",
        "uv run --frozen --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-node --dry-run",
    ),
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card --check": (
        ".ci/run",
        "uv run --frozen --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card --check",
    ),
    "uv run --project labs/grpo-verl pytest labs/grpo-verl/tests": (
        ".ci/run",
        "uv run --frozen --project labs/grpo-verl pytest labs/grpo-verl/tests",
    ),
    # Without the GPU it prints the sheet and the command and starts nothing (the chapter's test).
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config one-card": (
        "labs/grpo-verl/tests/test_verl_launcher.py",
        'train.main(["launch", "--config", "one-card", "--data-dir", str(tmp_path)])',
    ),
    "uv run --project labs/grpo-verl python labs/grpo-verl/train.py launch --config multi-node --dry-run": (
        "labs/grpo-verl/tests/test_verl_launcher.py",
        'train.main(["launch", "--config", name, "--data-dir", str(tmp_path), "--dry-run"])',
    ),
}
BUDGET_COMMANDS = {
    "uv run python labs/grpo-first/train.py --budget-only",
    "uv run python labs/grpo-first/train.py --budget-only --profile cpu",
    "uv run python labs/grpo-first/train.py --budget-only --num-generations 16 --suggest-util",
    "uv run python labs/grpo-first/train.py --budget-only --unsloth-vllm-standby true",
    "uv run python -m budgets --model qwen3-8b --gpu rtx-4090 --num-generations 16 --per-device-train-batch-size 16 --headroom",
    "uv run python -m budgets --model qwen3-32b --load-in-4bit false --gpu h100-sxm --gpus 4 --layout server --vllm-gpus 2 --json",
}
LAB_WITH_FLAGS = (
    "uv run python labs/grpo-first/train.py --max-steps 20 --num-generations 4 --max-completion-length 16 "
    "--learning-rate 2e-2 --output-dir /tmp/grpo"
)
JUPYTEXT_SYNC = "uv run jupytext --sync notebooks/*.py"


def readme_commands() -> set[str]:
    commands = set()
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("uv "):
                commands.add(" ".join(line.split()))
    return commands


def uv_or_python(command: str) -> list[str]:
    """`uv run X` as written when uv is on PATH, else X in this interpreter."""
    words = shlex.split(command)
    if shutil.which("uv"):
        return words
    rest = words[2:]
    return [sys.executable, *rest[1:]] if rest[0] == "python" else [sys.executable, "-m", *rest]


def test_every_readme_command_is_accounted_for():
    known = set(RUN_ELSEWHERE) | BUDGET_COMMANDS | {LAB_WITH_FLAGS, JUPYTEXT_SYNC}
    assert readme_commands() == known, (
        f"new README commands: {readme_commands() - known}; gone: {known - readme_commands()}"
    )


def enclosing_function(source: str, marker: str) -> ast.FunctionDef | None:
    """The innermost function whose source holds `marker`, or None (module level)."""
    line = source[: source.index(marker)].count("\n") + 1
    holding = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.lineno <= line <= node.end_lineno
    ]
    return max(holding, key=lambda node: node.lineno, default=None)


def unconditionally_skipped(function: ast.FunctionDef) -> bool:
    """Decorated @pytest.mark.skip (not skipif): it never runs, whatever the machine."""
    return any(
        ast.unparse(d.func if isinstance(d, ast.Call) else d) == "pytest.mark.skip"
        for d in function.decorator_list
    )


@pytest.mark.parametrize("command", sorted(RUN_ELSEWHERE))
def test_commands_run_elsewhere_really_are(command):
    """The command's text is in the file, inside a test or fixture that is not skipped on every machine
    (CI's script runs whole: no function to find there)."""
    path, marker = RUN_ELSEWHERE[command]
    source = (REPO_ROOT / path).read_text()
    assert marker in source, f"{path} no longer runs `{command}`"
    if path.endswith(".py"):
        function = enclosing_function(source, marker)
        users = [function] if function is not None else functions_using(source, marker)
        assert users, f"{path}: `{marker}` is used by no test or fixture"
        assert not all(unconditionally_skipped(f) for f in users), (
            f"{path}: `{marker}` is only where nothing runs"
        )


def functions_using(source: str, marker: str) -> list[ast.FunctionDef]:
    """A module-level command (`NAME = [...]`): the functions that read NAME."""
    line = source[: source.index(marker)].count("\n") + 1
    tree = ast.parse(source)
    names = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign) and node.lineno <= line <= node.end_lineno
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))
    ]


def test_the_marker_check_sees_a_test_that_never_runs():
    source = 'import pytest\n\n@pytest.mark.skip(reason="later")\ndef test_x():\n    run(["a", "b"])\n'
    function = enclosing_function(source, '["a", "b"]')
    assert function.name == "test_x" and unconditionally_skipped(function)
    assert enclosing_function("X = 1\n", "X = 1") is None
    module = 'import pytest\nCMD = ["a"]\n\n@pytest.mark.skip\ndef test_y():\n    run(CMD)\n'
    assert [f.name for f in functions_using(module, 'CMD = ["a"]')] == ["test_y"]
    assert unconditionally_skipped(functions_using(module, 'CMD = ["a"]')[0])


@pytest.mark.parametrize("command", sorted(BUDGET_COMMANDS))
def test_budget_commands(command):
    result = subprocess.run(uv_or_python(command), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ("fits" in result.stdout) or ('"fits"' in result.stdout)


def test_jupytext_sync_leaves_the_pair_unchanged(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for path in (REPO_ROOT / "notebooks").glob("*"):
        if path.suffix in {".py", ".ipynb"}:
            shutil.copy2(path, tmp_path / "notebooks" / path.name)
    before = {p.name: p.read_text() for p in (tmp_path / "notebooks").glob("*.ipynb")}
    words = uv_or_python(JUPYTEXT_SYNC)
    files = sorted(str(p) for p in (tmp_path / "notebooks").glob("*.py"))
    command = (
        [*words[:-1], *files] if shutil.which("uv") else [sys.executable, "-m", "jupytext", "--sync", *files]
    )
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    import nbformat

    for name, text in before.items():
        old, new = nbformat.reads(text, 4), nbformat.read(tmp_path / "notebooks" / name, 4)
        assert [c.source for c in old.cells] == [c.source for c in new.cells]


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="runs the CPU profile with the README's flags")
def test_lab_with_the_readme_flags(wave):
    """The README's command with flags, run in the wave of lab processes (tests/conftest.py)."""
    words = shlex.split(LAB_WITH_FLAGS)
    flags = words[words.index("labs/grpo-first/train.py") + 1 : words.index("--output-dir")]
    assert flags == README_FLAGS, "tests/conftest.py's README_FLAGS no longer match the README"
    lab = wave["labs"]["finish-1"]
    assert wave["codes"]["finish-1"] == 0, lab.log()
    run = only_run(wave["client"], lab)
    params = run.data.params
    assert (params["max_steps"], params["num_generations"], params["per_device_train_batch_size"]) == (
        "20",
        "4",
        "4",
    )
    assert (params["max_completion_length"], params["learning_rate"]) == ("16", "0.02")
    assert run.data.tags["overridden"] == "learning_rate,max_completion_length,max_steps,num_generations"
    out = lab.output
    assert list(out.glob("grpo-first/*/adapter/adapter_config.json"))
