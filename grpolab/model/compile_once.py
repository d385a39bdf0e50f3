"""One compile of a graph for all the processes that need it at the same moment.

Torch's inductor keeps each graph it compiles on disk (its FX graph cache, keyed by the graph, its
inputs' shapes and inductor's config), and a process that finds the graph there loads it instead of
compiling it. But processes that start together on a machine whose cache is cold all miss together,
and all compile the same graph: in a fresh machine's `uv run pytest`, eleven labs forked at once each
compiled chapter 1's GRPO loss (eleven entries under one key, written within 0.2 s of one another,
2026-12-07, a 2-core AMD EPYC); a matrix's cells and a chapter's arms start together the same way.
Torch already builds each C++ kernel once (a file lock per source, `CppCodeCache`); the lowering and
code generation before it, seconds of CPU a graph, it did eleven times.

`compile_each_graph_once()` makes a miss take a file lock named by the graph's key, in torch's own
lock folder, and look again once it holds it: the first process compiles and saves, then lets go; the
others wait, find the graph saved, and load it. A hit takes no lock, so a warm cache costs nothing
more; a compile that fails lets go at once (Dynamo may run the function eagerly and go on), and the
next process compiles it. No figure a run computes changes: a graph loaded from the cache is the code
the first process generated from the same key, the code each would have generated.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

# A holder that never lets go (a stopped process lets go as it exits: the lock is the OS's) must not
# hang a run: past this long, a waiter compiles the graph itself, as it would have without the lock.
LOCK_TIMEOUT_S = 600.0

_held: dict[str, Any] = {}  # key -> the lock this process holds while it compiles that graph
_install = threading.Lock()
_installed = False


def compile_each_graph_once() -> None:
    """Make inductor's FX graph cache compile a graph once when processes miss it together (see the
    module's docstring). Safe to call more than once: it installs once per process, and a child forked
    after it keeps it."""
    global _installed
    with _install:
        if _installed:
            return
        import torch._inductor.compile_fx as compile_fx
        from filelock import FileLock, Timeout
        from torch._inductor.codecache import FxGraphCache, get_lock_dir

        lookup = getattr(FxGraphCache, "load_with_key", None)
        save = getattr(FxGraphCache, "_save_graph", None)
        codegen = getattr(compile_fx, "fx_codegen_and_compile", None)
        if lookup is None or save is None or codegen is None:  # a torch that moved them: as torch does
            _installed = True  # (tests/test_compile_once.py fails there, saying how many compiled)
            return
        signature = inspect.signature(lookup)

        def load_with_key(key: str, *args: Any, **kwargs: Any) -> tuple[Any, dict]:
            graph, info = lookup(key, *args, **kwargs)
            if graph is not None or info.get("cache_state") != "miss" or key in _held:
                return graph, info
            if not signature.bind(key, *args, **kwargs).arguments.get("local", True):
                return graph, info  # no cache on disk to wait for
            lock = FileLock(os.path.join(get_lock_dir(), f"fxgraph-{key}.lock"))
            try:
                lock.acquire(timeout=LOCK_TIMEOUT_S)
            except Timeout:
                return graph, info
            graph, info = lookup(key, *args, **kwargs)  # saved by the process that held the lock?
            if graph is not None:
                lock.release()
            else:
                _held[key] = lock  # this process compiles it; `_save_graph` lets go
            return graph, info

        def save_graph(key: str, *args: Any, **kwargs: Any) -> None:
            try:
                save(key, *args, **kwargs)
            finally:
                lock = _held.pop(key, None)
                if lock is not None:
                    lock.release()

        def fx_codegen_and_compile(*args: Any, **kwargs: Any) -> Any:
            try:
                return codegen(*args, **kwargs)
            except BaseException:  # a compile that fails (Dynamo may run the code eagerly and go on)
                while _held:  # lets the others go at once: one of them compiles instead
                    _held.popitem()[1].release()
                raise

        compile_fx.fx_codegen_and_compile = fx_codegen_and_compile
        FxGraphCache.load_with_key = staticmethod(load_with_key)
        FxGraphCache._save_graph = staticmethod(save_graph)
        _installed = True
