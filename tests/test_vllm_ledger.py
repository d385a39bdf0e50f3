"""vLLM's own ledger, read as vLLM 0.31 keeps it: the attributes its worker and configs assign, and the
start-up lines it logs, both taken from the installed vLLM's source (vLLM cannot run without a GPU)."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from budgets import compute
from budgets.units import GIB
from grpolab.config.settings import lab_settings
from grpolab.memory import vllm_ledger

# From the installed distribution, not an import: a CPU-only process blocks `import vllm` (grpolab.model.policy).
VLLM = Path(importlib.metadata.distribution("vllm").locate_file("vllm"))


def source(relative: str) -> ast.Module:
    return ast.parse((VLLM / relative).read_text())


def logged_formats(relative: str) -> list[str]:
    """The format strings of every logger call in a vLLM source file (implicit concatenation joined)."""
    formats = []
    for node in ast.walk(source(relative)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"info", "info_once", "debug", "warning"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            formats.append(node.args[0].value)
    return formats


def the_format(relative: str, words: str) -> str:
    (found,) = [f for f in logged_formats(relative) if words in f]
    return found


def assigned(relative: str, owner: str) -> set[str]:
    """Attributes of `owner` (self, cache_config, ...) a vLLM source file assigns."""
    names = set()
    for node in ast.walk(source(relative)):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == owner
            ):
                names.add(target.attr)
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Attribute)
                and target.value.attr == owner
            ):
                names.add(target.attr)
    return names


def test_the_start_up_lines_vllm_logs_are_parsed_from_its_own_format_strings():
    lines = [
        the_format("v1/worker/gpu_model_runner.py", "Model loading took") % ("2.61", 12.5),
        the_format("v1/worker/gpu_worker.py", "Available KV cache memory") % ("3.94",),
        the_format("v1/worker/gpu_worker.py", "CUDA graph pool memory") % (0.42, 0.5, 0.08, 19.0),
        the_format("v1/core/kv_cache_utils.py", "KV cache size") % ("GPU", "28,672", "1,024", 28.0),
    ]
    ledger = vllm_ledger.parse_log(["unrelated line", *lines])
    assert ledger.weights_bytes == int(2.61 * GIB)
    assert ledger.kv_cache_available_bytes == int(3.94 * GIB)
    assert ledger.cuda_graph_bytes == int(0.42 * GIB) and ledger.cuda_graph_source == "captured"
    assert (ledger.kv_cache_tokens, ledger.max_concurrency) == (28672, 28.0)


def test_the_attributes_read_are_the_ones_vllm_assigns():
    worker = assigned("v1/worker/gpu_worker.py", "self")
    assert {
        "requested_memory",
        "init_snapshot",
        "total_consumed",
        "peak_activation_memory",
        "cudagraph_memory_estimate",
        "available_kv_cache_memory_bytes",
    } <= worker
    assert "model_memory_usage" in assigned("v1/worker/gpu_model_runner.py", "self")
    assert {"kv_cache_size_tokens", "kv_cache_max_concurrency"} <= assigned(
        "v1/core/kv_cache_utils.py", "cache_config"
    )
    # The way from Unsloth's engine (an LLM) to its in-process worker.
    assert "model_executor" in assigned("v1/engine/llm_engine.py", "self")
    assert "driver_worker" in assigned("v1/executor/uniproc_executor.py", "self")
    assert "worker" in assigned("v1/worker/worker_base.py", "self")


def engine(**worker_figures):
    """An engine with vLLM's attribute layout: llm.llm_engine.model_executor.driver_worker.worker."""
    worker = SimpleNamespace(
        model_runner=SimpleNamespace(model_memory_usage=int(2.6 * GIB)),
        total_consumed=int(2.9 * GIB),
        peak_activation_memory=int(0.7 * GIB),
        cudagraph_memory_estimate=int(0.5 * GIB),
        available_kv_cache_memory_bytes=int(3.9 * GIB),
        requested_memory=int(8.0 * GIB),
        init_snapshot=SimpleNamespace(free_memory=int(15.0 * GIB)),
        **worker_figures,
    )
    cache = SimpleNamespace(kv_cache_size_tokens=28672, kv_cache_max_concurrency=28.0)
    llm_engine = SimpleNamespace(
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)),
        vllm_config=SimpleNamespace(cache_config=cache),
    )
    return SimpleNamespace(llm_engine=llm_engine)


def test_the_ledger_is_read_from_the_engine_and_fills_the_lines_of_vllms_share(monkeypatch):
    monkeypatch.delenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", raising=False)
    ledger = vllm_ledger.from_engine(engine())
    assert ledger.weights_bytes == int(2.6 * GIB)
    assert ledger.non_torch_bytes == int(2.9 * GIB) - int(2.6 * GIB)
    # The graphs' estimate is inside peak_activation_memory by default: taken out of the activations.
    assert ledger.profile_activation_bytes == int(0.7 * GIB) - int(0.5 * GIB)
    assert (ledger.cuda_graph_bytes, ledger.cuda_graph_source) == (int(0.5 * GIB), "profiled")
    assert (ledger.kv_cache_tokens, ledger.max_concurrency) == (28672, 28.0)
    sheet = compute(lab_settings("labs/grpo-first", "gpu").plan())
    lines = ledger.lines({line.name for line in sheet.lines})
    assert set(lines) == {"vllm_profile_activations", "cuda_graphs"}  # shared layout: no vllm_weights line
    assert lines["vllm_profile_activations"] == ledger.profile_activation_bytes + ledger.non_torch_bytes
    metrics = ledger.metrics()
    assert metrics["vllm/kv_cache_available_gib"] == pytest.approx(3.9, abs=1e-6)
    assert metrics["vllm/kv_cache_tokens"] == 28672.0
    # The captured graphs' size, when vLLM logged it, wins over the estimate.
    captured = vllm_ledger.from_engine(
        engine(), ["CUDA graph pool memory: 0.42 GiB (actual), 0.5 GiB (estimated)"]
    )
    assert (captured.cuda_graph_bytes, captured.cuda_graph_source) == (int(0.42 * GIB), "captured")


def test_without_the_graph_estimate_in_the_share_the_activations_are_the_whole_peak(monkeypatch):
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0")
    assert vllm_ledger.from_engine(engine()).profile_activation_bytes == int(0.7 * GIB)


def test_no_engine_no_figures():
    assert vllm_ledger.from_engine(SimpleNamespace()).metrics() == {}


def test_capture_listens_to_vllms_logger_while_the_engine_starts():
    import logging

    with vllm_ledger.capture() as lines:
        logging.getLogger("vllm.v1.worker.gpu_worker").warning("Available KV cache memory: %s GiB", "3.94")
    logging.getLogger("vllm.v1.worker.gpu_worker").warning("after the block")
    assert lines == ["Available KV cache memory: 3.94 GiB"]
