"""The merged model as others run it: logged to MLflow, registered, and behind a real HTTP server.

On a CPU the server is MLflow's own scoring server (`mlflow models serve --env-manager local`) for the
registered version, so what is scored is exactly what a user who pulls `models:/<name>/<version>`
serves. On a GPU it is vLLM's OpenAI-compatible server (`vllm serve`) on the 16-bit merge. Either way a
small client sends each held-out prompt, greedy, over HTTP, and the task's exact checker scores the
answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpolab.config.errors import LabSettingsError

READY_TIMEOUT_S = 300  # the server's start: imports, the model's load (minutes on a loaded CPU)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """A port another process holds is refused in one line, before anything starts."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise LabSettingsError(
                f"ship: port {port} is in use: pass another --port, or 0 for any free one"
            ) from None


def log_merged(merged: Path, max_new_tokens: int, registered_name: str, training_run: str) -> str:
    """The 16-bit merge as an MLflow model (transformers flavor, greedy by default) in the active run,
    registered as a new version of `registered_name` whose tags point at the training run: its
    `models:/` URI."""
    import logging

    import mlflow
    import torch

    # Its notes about a folder that is not on the Hub (no model card, no licence) and about pip's version.
    for noisy in ("mlflow.transformers", "mlflow.utils.environment", "mlflow.utils.uv_utils"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    info = mlflow.transformers.log_model(
        transformers_model=str(merged),
        name="merged_16bit",
        task="text-generation",
        # Scored in float32 on a CPU (the 16-bit weights upcast exactly), as the lab scores the merge.
        torch_dtype=None if torch.cuda.is_available() else torch.float32,
        # Greedy, and only what the model wrote: the pipeline's "full text" would repeat the prompt.
        model_config={"do_sample": False, "max_new_tokens": max_new_tokens, "return_full_text": False},
        pip_requirements=[],  # served here with --env-manager local: the lock already holds them
    )
    version = mlflow.register_model(
        info.model_uri,
        registered_name,
        tags={"training_run": training_run, "ship_run": mlflow.active_run().info.run_id},
    )
    client = mlflow.MlflowClient()
    client.update_model_version(
        registered_name,
        version.version,
        description=f"GRPO adapter of training run {training_run}, merged into the base's 16-bit weights.",
    )
    return f"models:/{registered_name}/{version.version}"


@contextmanager
def mlflow_server(model_uri: str, port: int) -> Iterator[str]:
    """`mlflow models serve` for `model_uri` on `port`, until the block ends: its base URL."""
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    command += ["-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    with _serving(command, port, "/ping", "the MLflow scoring server", READY_TIMEOUT_S) as url:
        yield url


@contextmanager
def vllm_server(merged: Path, port: int, max_model_len: int) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on the 16-bit merge (GPU), until the block ends: its base URL."""
    # `vllm serve`, the console script of this environment (vLLM deprecates `-m ...openai.api_server`).
    command = [str(Path(sys.executable).parent / "vllm"), "serve", str(merged)]
    command += ["--served-model-name", "merged", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", str(max_model_len), "--gpu-memory-utilization", "0.5"]
    with _serving(command, port, "/health", "vLLM's server", READY_TIMEOUT_S * 2) as url:
        yield url


@contextmanager
def _serving(command: list[str], port: int, health: str, what: str, timeout_s: float) -> Iterator[str]:
    """A server process in a session of its own (its workers go with it), its output in a log file,
    until its `health` path answers; stopped (SIGTERM, then SIGKILL) whatever ends the block."""
    check_port(port)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"grpolab-serve-{port}.log"
    # Servers start their workers by name (uvicorn): this environment's scripts first on the PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with open(log, "w") as out:
        process = subprocess.Popen(
            command,
            env={**os.environ, "PATH": path},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}{health}", process, what, log, timeout_s)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.unlink(missing_ok=True)


def _wait_ready(health: str, process: subprocess.Popen, what: str, log: Path, timeout_s: float) -> None:
    from grpolab.lifecycle.endings import STOPS

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        STOPS.check()  # a stop while the server starts ends the run at once
        if process.poll() is not None:
            tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{what} exited ({process.returncode}): {tail[0]}")
        try:
            with urllib.request.urlopen(health, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} was not ready in {timeout_s:.0f} s")


def ask_mlflow(url: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Each prompt through the server's /invocations, greedy; the text it generated after the prompt."""
    body = {"inputs": prompts, "params": {"max_new_tokens": max_new_tokens, "do_sample": False}}
    request = urllib.request.Request(
        f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        answer = json.loads(reply.read())["predictions"]
    return [a if isinstance(a, str) else a.get("generated_text", "") for a in answer]


def ask_openai(url: str, model: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Each prompt through an OpenAI-compatible /v1/completions (vLLM's server), greedy."""
    body = {"model": model, "prompt": prompts, "max_tokens": max_new_tokens, "temperature": 0.0}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        choices = json.loads(reply.read())["choices"]
    return [c["text"] for c in sorted(choices, key=lambda c: c["index"])]
