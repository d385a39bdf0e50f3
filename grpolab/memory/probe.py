"""The memory probe: a sampler thread and the phases of a run (load, generate, train...).

On a GPU the probe reads this process's device memory from NVML every few milliseconds, so a peak
lasting a fraction of a second is still caught, plus torch's allocator peaks per phase. On a CPU it
samples the resident set. What each figure counts is in MEMORY_LABELS, logged beside the numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from budgets.units import GIB, MIB
from grpolab.memory.device import Device

_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h): the most heap arenas the process may have
CAPPED_THREAD_STACK = 1 * MIB  # a thread's stack under the cap (glibc's default is 8 MiB)
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class PhasePeak:
    """The peaks seen during one phase."""

    name: str
    process_bytes: int = 0  # NVML process memory (GPU) or resident set (CPU)
    torch_allocated_bytes: int = 0  # GPU only
    torch_reserved_bytes: int = 0  # GPU only
    seconds: float = 0.0


@dataclass
class Sampler:
    """A background thread that keeps the largest value a reader returns."""

    read: Callable[[], int]
    interval_s: float
    peak: int = 0
    window_peak: int = 0
    samples: int = 0  # how many it has taken
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="memory-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> int:
        value = self.read()
        self.peak = max(self.peak, value)
        self.window_peak = max(self.window_peak, value)
        self.samples += 1
        return value

    def take_window(self) -> int:
        """The peak since the last call, then start a new window."""
        value = max(self.window_peak, self.sample())
        self.window_peak = 0
        return value

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class MemoryProbe:
    """Peaks per phase and over the run: NVML and torch on a GPU, the resident set on a CPU."""

    def __init__(self, device: Device, interval_s: float = 0.005) -> None:
        self.device = device
        self.on_gpu = device.on_gpu
        self.phases: list[PhasePeak] = []
        self.step_phase_peaks: dict[str, list[PhasePeak]] = {}
        self._open: list[PhasePeak] = []
        self._step_peak = 0
        self.failed_phase: str | None = None
        self.current_phase = "start"
        self.context_bytes: int | None = None  # GPU: the CUDA context, measured at start
        self.host_runtime_bytes: int | None = None  # CPU: the interpreter and libraries
        self.device_used_peak_bytes = 0
        self._sampler = Sampler(self._read, interval_s)
        self._started = False
        self._peak_resets: dict[tuple[object, str], Callable] = {}  # torch's resets, while guarded
        self._uncapped: tuple[int, int] | None = None  # the data limit before `cap`

    def _read(self) -> int:
        if not self.on_gpu:
            return _rss_bytes()
        used = self.device.process_bytes()
        self.device_used_peak_bytes = max(self.device_used_peak_bytes, self.device.used_bytes())
        return used

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> MemoryProbe:
        """Start sampling; call it after the imports and before the model loads."""
        if not self._started:
            if self.on_gpu:
                self.context_bytes = self.device.measure_context()
                self.guard_peak_resets()
            else:
                self.host_runtime_bytes = _rss_bytes()
            self._sampler.start()
            self._started = True
        return self

    def stop(self) -> None:
        self._sampler.stop()
        for (owner, name), original in self._peak_resets.items():
            setattr(owner, name, original)
        self._peak_resets.clear()

    def guard_peak_resets(self) -> None:
        """Credit torch's peaks to the open phases before anyone else resets them.

        vLLM resets torch's peak counters while it starts (`torch.accelerator.reset_peak_memory_stats`
        in its memory profiling, `torch.cuda.reset_peak_memory_stats` through its platform), in the
        middle of the "load" phase: without this, the load's torch peak would be what came after the
        last reset only. The originals are put back by `stop`."""
        import torch

        for owner in (torch.cuda, torch.cuda.memory, getattr(torch, "accelerator", None)):
            original = getattr(owner, "reset_peak_memory_stats", None)
            if original is None or (owner, "reset_peak_memory_stats") in self._peak_resets:
                continue

            def guarded(*args, _original=original, **kwargs):
                self._credit_torch_peaks()
                return _original(*args, **kwargs)

            self._peak_resets[(owner, "reset_peak_memory_stats")] = original
            owner.reset_peak_memory_stats = guarded

    def _credit_torch_peaks(self) -> tuple[int, int]:
        """torch's allocated and reserved peaks since the last reset, credited to every open phase."""
        import torch

        allocated, reserved = int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        for open_phase in self._open:
            open_phase.torch_allocated_bytes = max(open_phase.torch_allocated_bytes, allocated)
            open_phase.torch_reserved_bytes = max(open_phase.torch_reserved_bytes, reserved)
        return allocated, reserved

    def _reset_torch_peaks(self) -> None:
        import torch

        reset = self._peak_resets.get(
            (torch.cuda, "reset_peak_memory_stats"), torch.cuda.reset_peak_memory_stats
        )
        reset()

    def cap(self, gib: float) -> None:
        """Let memory grow by at most `gib` beyond what is held now, to rehearse an out-of-memory.

        GPU: torch's allocator refuses beyond what it has reserved (vLLM's share included: its
        weights and KV cache are torch tensors) plus the cap. CPU: the memory the process can write
        to (RLIMIT_DATA: its heap and private mappings) may grow only `gib` beyond what it is now.

        Not the address space (RLIMIT_AS): glibc reserves 64 MiB of it for each new thread's heap
        arena, up to eight per core, and 8 MiB for each thread's stack, and the threads a run starts
        once the model is loaded (MLflow's exporters: nine, measured 2026-12-03) took 741 MiB of
        address space for 96 MiB of resident memory, more on a machine with more cores; a cap of a
        few hundred MiB left MLflow's exporter unable to start a thread, and the run hung at its end.
        So from here no new arena (the threads share the existing ones), threads start with 1 MiB
        stacks, and the tokenizer starts no thread pool of its own: what the cap meets is what the
        step holds, on any machine.
        """
        if self.on_gpu:
            import torch

            total = torch.cuda.get_device_properties(0).total_memory
            limit = torch.cuda.memory_reserved() + gib * GIB
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
        else:
            # Unsloth's trainer compiles its loss at the first step, and torch.compile then loads z3
            # (torch.fx's validator) on first use: a shared library mapped under the cap fails, and z3
            # reports that as "libz3.so not found". Load it now: the cap is for what the step holds.
            with contextlib.suppress(Exception):
                import torch.fx.experimental.validator
            # Nor may torch.compile run under the cap: it compiles the step's functions the first time
            # they run, and a limit that binds inside its compiler raises MemoryError there, whose
            # context chain (CPython reuses MemoryError objects) can loop contextlib's exit forever: a
            # fresh clone's suite once hung so. The capped step runs eagerly.
            import torch._dynamo

            torch._dynamo.config.disable = True
            # MLflow's trace exporter starts worker threads as traces queue up; one that cannot start
            # under the cap made its consumer handle a task twice and die (2026-12-04, a fresh clone's
            # CI: "task_done() called too many times"), and the run's last flush then waited forever.
            # From here traces are written in the thread that logs them: no exporter thread to start.
            os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"  # an exporter created later
            import mlflow

            mlflow.flush_trace_async_logging(terminate=True)  # one that exists: written, its threads ended
            ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)
            threading.stack_size(CAPPED_THREAD_STACK)
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            limit = _data_bytes() + int(gib * GIB)
            self._uncapped = resource.getrlimit(resource.RLIMIT_DATA)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, self._uncapped[1]))

    def uncap(self) -> None:
        """Lift the rehearsal's cap once it has done its job (the run ran out of memory): recording how
        the run ended (MLflow, the checkpoint) must not run out too. A real out-of-memory has freed the
        failed step's memory by then; a capped one has not always, depending on where the allocator
        keeps what was freed."""
        if self._uncapped is not None:
            resource.setrlimit(resource.RLIMIT_DATA, self._uncapped)
            self._uncapped = None

    # --- phases ---------------------------------------------------------------------------------
    def _fold(self) -> None:
        """Read the peaks since the last fold and credit them to every open phase."""
        process = self._sampler.take_window()
        if self.on_gpu:
            self._credit_torch_peaks()
            self._reset_torch_peaks()
        self._step_peak = max(self._step_peak, process)
        for open_phase in self._open:
            open_phase.process_bytes = max(open_phase.process_bytes, process)

    @contextmanager
    def phase(self, name: str, keep: bool = True) -> Iterator[PhasePeak]:
        """Measure one phase. Phases nest (a training step inside "train"): a peak counts for every
        phase open when it happened."""
        self._fold()
        peak = PhasePeak(name)
        self._open.append(peak)
        outer = self.current_phase
        self.current_phase = name
        started = time.perf_counter()
        try:
            yield peak
        except BaseException:
            # Remember the innermost phase an error (an out-of-memory, say) escaped from.
            self.failed_phase = self.failed_phase or name
            raise
        finally:
            self._fold()
            self._open.remove(peak)
            peak.seconds = time.perf_counter() - started
            self.current_phase = outer
            if keep:
                self.phases.append(peak)
            else:
                self.step_phase_peaks.setdefault(name, []).append(peak)

    def step_peak_bytes(self) -> int:
        """The process peak since the previous call (one training step, when called per step)."""
        self._fold()
        peak, self._step_peak = self._step_peak, 0
        return peak

    @property
    def process_peak_bytes(self) -> int:
        """The run's peak: NVML process memory on a GPU, the resident set on a CPU."""
        self._sampler.sample()
        return max(self._sampler.peak, _ru_maxrss_bytes() if not self.on_gpu else 0)

    def torch_peak_bytes(self) -> tuple[int, int]:
        """The largest allocated and reserved peaks over all phases (GPU)."""
        return (
            max((p.torch_allocated_bytes for p in self.phases), default=0),
            max((p.torch_reserved_bytes for p in self.phases), default=0),
        )

    def summary(self) -> dict[str, float]:
        """The run's peaks in GiB under names that say what they count (see MEMORY_LABELS)."""
        out = {"memory/process_peak_gib": self.process_peak_bytes / GIB}
        if self.on_gpu:
            allocated, reserved = self.torch_peak_bytes()
            out["memory/torch_allocated_peak_gib"] = allocated / GIB
            out["memory/torch_reserved_peak_gib"] = reserved / GIB
            out["memory/device_used_peak_gib"] = self.device_used_peak_bytes / GIB
            if self.context_bytes is not None:
                out["memory/cuda_context_gib"] = self.context_bytes / GIB
        for p in self.phases:
            out[f"memory/phase/{p.name}/process_peak_gib"] = p.process_bytes / GIB
            if self.on_gpu:
                out[f"memory/phase/{p.name}/torch_allocated_peak_gib"] = p.torch_allocated_bytes / GIB
        return out


# What each figure counts and what it misses, logged beside the numbers.
MEMORY_LABELS = {
    "memory/process_peak_gib": (
        "GPU: this process's device memory from NVML, sampled every few ms (vLLM's share, the CUDA context "
        "and torch's cache included; misses peaks shorter than the interval). CPU: peak resident set "
        "(everything the process touched, Python and libraries included)."
    ),
    "memory/torch_allocated_peak_gib": (
        "torch.cuda.max_memory_allocated(): tensors torch allocated. Without standby, Unsloth's in-process "
        "vLLM allocates its weights and KV cache as torch tensors, so they are in it; with standby "
        "(UNSLOTH_VLLM_STANDBY=1) vLLM allocates through its own CuMemAllocator and they are not. Misses the "
        "CUDA context, allocator fragmentation and non-torch allocations."
    ),
    "memory/torch_reserved_peak_gib": "torch.cuda.max_memory_reserved(): torch's caching allocator, free blocks included.",
    "memory/device_used_peak_gib": "NVML device used memory (nvidia-smi's figure): every process on the card.",
    "memory/cuda_context_gib": (
        "NVML's figure for this process right after CUDA init and one small tensor, less torch's reservation: "
        "the CUDA context."
    ),
    "phase/<generate|train>/measured_gib": (
        "GPU: the largest step's NVML process peak while vLLM decoded the rollouts (generate) or while the "
        "trainer took its loss (train); its budget is the sheet's phase total less other processes' memory."
    ),
    "vllm/*": (
        "GPU: what the in-process vLLM engine reported at start-up, read from its worker and configs "
        "(cuda_graph_gib from its log when it captured graphs, else its profiled estimate)."
    ),
}


def _data_bytes() -> int:
    """What RLIMIT_DATA counts (the kernel's VmData): the heap and every private writable mapping."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmData:"))
    return int(line.split()[1]) * 1024


_statm: tuple[int, int] | None = None  # (pid, an open /proc/<pid>/statm): a forked child opens its own


def _rss_bytes() -> int:
    """The resident set, as psutil's `memory_info().rss` reads it (/proc/<pid>/statm's second field,
    in pages), from a descriptor kept open: the probe reads it every 5 ms, and a new psutil.Process
    and an open file each time cost a lab 2% of its CPU (a 1-thread matrix product beside the
    sampler, 2026-12-07: 5% slower with psutil, 3% with the kept descriptor). psutil where there is
    no /proc."""
    global _statm
    pid = os.getpid()
    try:
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


def _ru_maxrss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
