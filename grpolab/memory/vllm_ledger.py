"""vLLM's own memory ledger: what the in-process engine says it took at start-up, line by line.

vLLM 0.31 sizes its share in its worker (vllm/v1/worker/gpu_worker.py, `determine_available_memory`)
and keeps the figures on the worker and its configs, so they are read from there, not from log text:

    worker.model_runner.model_memory_usage     the weights vLLM loaded ("Model loading took X GiB")
    worker.total_consumed                      weights + non-torch memory, from cudaMemGetInfo
    worker.peak_activation_memory              the profiling pass's transient peak, plus the CUDA
                                               graph estimate when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    worker.cudagraph_memory_estimate           the graphs' profiled size
    worker.available_kv_cache_memory_bytes     what was left for the KV cache
    worker.requested_memory, init_snapshot     the share it claimed, what was free when it looked
    cache_config.kv_cache_size_tokens          the KV cache in tokens, and the concurrency it allows
    cache_config.kv_cache_max_concurrency      at max_model_len

Only the captured CUDA graphs' real size is logged and nowhere stored ("CUDA graph pool memory: X
GiB (actual)"), so the harness listens to vLLM's logger while the engine starts (`capture`) and
takes that one figure from the text; the parser reads every start-up line it knows, and the tests
hold it against the format strings in vLLM's installed source.

Unsloth runs the engine in the trainer's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the worker
is `llm.llm_engine.model_executor.driver_worker.worker`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from budgets.units import GIB

# vLLM 0.31's start-up lines (the format strings are checked against its source by the tests).
LOG_PATTERNS = {
    "weights_bytes": re.compile(r"Model loading took ([\d.]+) GiB memory"),
    "kv_cache_available_bytes": re.compile(r"Available KV cache memory: (-?[\d.]+) GiB"),
    "cuda_graph_bytes": re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\)"),
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
}
IN_GIB = {"weights_bytes", "kv_cache_available_bytes", "cuda_graph_bytes"}


@dataclass
class Ledger:
    """vLLM's start-up figures, in bytes (None: not reported)."""

    weights_bytes: int | None = None
    profile_activation_bytes: int | None = None  # the profiling pass's transient peak
    non_torch_bytes: int | None = None  # consumed at start beyond the weights (NCCL, buffers, context)
    cuda_graph_bytes: int | None = None
    cuda_graph_source: str = ""  # "captured" (the log's actual figure) or "profiled" (the estimate)
    kv_cache_available_bytes: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    requested_bytes: int | None = None
    free_at_start_bytes: int | None = None

    def metrics(self) -> dict[str, float]:
        """As MLflow metrics: `vllm/<figure>_gib`, the token count and the concurrency as they are."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or isinstance(value, str):
                continue
            if f.name.endswith("_bytes"):
                out[f"vllm/{f.name.removesuffix('_bytes')}_gib"] = value / GIB
            else:
                out[f"vllm/{f.name}"] = float(value)
        return out

    def lines(self, budget_lines: set[str]) -> dict[str, int]:
        """vLLM's figures as the measured values of the sheet's lines that model them."""
        measured: dict[str, int] = {}
        if self.weights_bytes is not None and "vllm_weights" in budget_lines:
            measured["vllm_weights"] = self.weights_bytes  # its own copy (colocate, server layouts)
        if self.profile_activation_bytes is not None:
            # The sheet's line is the profiling peak plus the forward's non-torch memory.
            measured["vllm_profile_activations"] = self.profile_activation_bytes + (self.non_torch_bytes or 0)
        if self.cuda_graph_bytes is not None:
            measured["cuda_graphs"] = self.cuda_graph_bytes
        return {name: value for name, value in measured.items() if name in budget_lines}


def worker_of(llm: Any) -> Any | None:
    """The in-process vLLM worker behind Unsloth's engine (`model.vllm_engine`), or None."""
    engine = getattr(llm, "llm_engine", llm)
    executor = getattr(engine, "model_executor", None)
    wrapper = getattr(executor, "driver_worker", None)
    return getattr(wrapper, "worker", wrapper)


def from_engine(llm: Any, log_lines: list[str] | None = None) -> Ledger:
    """The ledger read from the engine's worker and configs; the captured log fills what they lack
    (the captured CUDA graphs' size)."""
    ledger = parse_log(log_lines or [])
    worker = worker_of(llm)
    runner = getattr(worker, "model_runner", None)
    weights = _int(getattr(runner, "model_memory_usage", None))
    consumed = _int(getattr(worker, "total_consumed", None))
    peak = _int(getattr(worker, "peak_activation_memory", None))
    graphs = _int(getattr(worker, "cudagraph_memory_estimate", None))
    if weights is not None:
        ledger.weights_bytes = weights
    if consumed is not None and weights is not None:
        ledger.non_torch_bytes = max(consumed - weights, 0)
    if peak is not None:
        estimate_applied = (
            graphs if os.environ.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0" else 0
        )
        ledger.profile_activation_bytes = max(peak - (estimate_applied or 0), 0)
    if ledger.cuda_graph_bytes is not None:
        ledger.cuda_graph_source = "captured"
    elif graphs:
        ledger.cuda_graph_bytes, ledger.cuda_graph_source = graphs, "profiled"
    for name, attribute in (
        ("kv_cache_available_bytes", "available_kv_cache_memory_bytes"),
        ("requested_bytes", "requested_memory"),
    ):
        value = _int(getattr(worker, attribute, None))
        if value is not None:
            setattr(ledger, name, value)
    snapshot = getattr(worker, "init_snapshot", None)
    if _int(getattr(snapshot, "free_memory", None)) is not None:
        ledger.free_at_start_bytes = _int(snapshot.free_memory)
    cache = getattr(getattr(getattr(llm, "llm_engine", llm), "vllm_config", None), "cache_config", None)
    if _int(getattr(cache, "kv_cache_size_tokens", None)) is not None:
        ledger.kv_cache_tokens = _int(cache.kv_cache_size_tokens)
    if getattr(cache, "kv_cache_max_concurrency", None) is not None:
        ledger.max_concurrency = float(cache.kv_cache_max_concurrency)
    return ledger


def parse_log(lines: list[str]) -> Ledger:
    """vLLM's start-up lines as a ledger: the figures these lines carry, the rest None."""
    ledger = Ledger()
    for line in lines:
        for name, pattern in LOG_PATTERNS.items():
            found = pattern.search(line)
            if not found:
                continue
            text = found.group(1).replace(",", "")
            if name in IN_GIB:
                setattr(ledger, name, int(float(text) * GIB))
            elif name == "kv_cache_tokens":
                ledger.kv_cache_tokens = int(text)
            else:
                ledger.max_concurrency = float(text)
    if ledger.cuda_graph_bytes is not None:
        ledger.cuda_graph_source = "captured"
    return ledger


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a record that cannot format itself is not one of ours
            return


@contextmanager
def capture() -> Iterator[list[str]]:
    """vLLM's log lines while the block runs (the engine's start-up), as text; vLLM's own output is
    left as it is."""
    handler = _Lines()
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
