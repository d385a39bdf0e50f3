"""Shared test helpers: the repository root, the chapters, CPU-only skips, one shared lab run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_DIR = REPO_ROOT / "labs" / "grpo-first"


def trainer_labs() -> list[Path]:
    """The chapters that train with GRPOTrainer in this environment: every labs/*/lab.toml without
    an environment of its own (the verl chapter has its own uv project and tests)."""
    labs = []
    for toml in sorted((REPO_ROOT / "labs").glob("*/lab.toml")):
        if "environment" not in tomllib.loads(toml.read_text()):
            labs.append(toml.parent)
    return labs


TRAINER_LABS = trainer_labs()


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _cuda()


def gpu_only(reason: str):
    """Skip without a CUDA GPU; the reason says what the test would check on one."""
    return pytest.mark.skipif(not HAS_CUDA, reason=f"needs a CUDA GPU: {reason}")


def load_lab_module(lab_dir: Path):
    """labs/<chapter>/train.py imported as a module (chapter folders have hyphens)."""
    spec = importlib.util.spec_from_file_location(
        f"{lab_dir.name.replace('-', '_')}_train", lab_dir / "train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def lab_module():
    return load_lab_module(LAB_DIR)


def run_lab(
    args: list[str], tmp_path: Path, timeout: float = 600, lab_dir: Path = LAB_DIR, **env: str
) -> subprocess.CompletedProcess:
    """Run a lab as a user would, with its own MLflow store and outputs under tmp_path."""
    environment = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, str(lab_dir / "train.py"), "--output-dir", str(tmp_path / "outputs"), *args],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


README_LAB_COMMAND = ["uv", "run", "python", "labs/grpo-first/train.py"]


@pytest.fixture(scope="session")
def cpu_lab_run(tmp_path_factory):
    """The README's lab command, run once on CPU into its own MLflow store, then read back."""
    import mlflow

    store = tmp_path_factory.mktemp("store")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    # Exactly the README's command when uv is on PATH (CI and users), else the same script.
    command = README_LAB_COMMAND if shutil.which("uv") else [sys.executable, "labs/grpo-first/train.py"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    (run,) = mlflow.search_runs(experiment_names=["grpo-first"], output_format="list")
    yield {
        "run": run,
        "client": mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]),
        "stdout": result.stdout,
        "seconds": seconds,
        "store": store,
    }
    shutil.rmtree(REPO_ROOT / "outputs" / "grpo-first" / run.info.run_name, ignore_errors=True)
