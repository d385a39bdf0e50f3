"""What the device really held: the measured side of the budget sheet.

`torch.cuda.max_memory_allocated()` alone misses vLLM's memory pool and the CUDA
context, so on a GPU the probe reads three sources:

* torch's allocator peaks (allocated and reserved), reset at the start of each phase;
* NVML's figure for this process, sampled by a background thread every few
  milliseconds so that a peak lasting a fraction of a second is still caught;
* NVML's device total, the number nvidia-smi shows, as a cross-check.

On a CPU there is no device: the probe samples the process's resident set instead and,
for the budget comparison, counts the bytes of the model's tensors by kind (4-bit
weights, LoRA parameters, their gradients, optimizer states), which are exactly the
budget lines that do not need a GPU to exist.
"""

from __future__ import annotations

import os
import resource
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1024**3


@dataclass
class PhasePeak:
    """The peaks seen during one phase (load, engine start, generation, training...)."""

    name: str
    process_bytes: int = 0  # NVML process memory (GPU) or resident set (CPU)
    torch_allocated_bytes: int = 0  # GPU only
    torch_reserved_bytes: int = 0  # GPU only
    seconds: float = 0.0


@dataclass
class _Sampler:
    """A background thread that keeps the largest value a reader returns."""

    read: object  # Callable[[], int]
    interval_s: float
    peak: int = 0
    window_peak: int = 0
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
    """Peaks per phase and over the run, from NVML and torch on a GPU, from the RSS on a CPU."""

    def __init__(self, device: str, interval_s: float = 0.005) -> None:
        self.device = device
        self.phases: list[PhasePeak] = []
        self.step_phase_peaks: dict[str, list[PhasePeak]] = {}
        self._open: list[PhasePeak] = []
        self._step_peak = 0
        self.failed_phase: str | None = None
        self.current_phase = "start"
        self.context_bytes: int | None = None
        self.host_runtime_bytes: int | None = None
        self.device_total_peak_bytes = 0
        self.device_capacity_bytes: int | None = None
        self._nvml_handle = None
        if device == "cuda":
            import pynvml

            pynvml.nvmlInit()
            index = int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0)
            # NVML numbers devices physically; with CUDA_VISIBLE_DEVICES the first visible is ours.
            self._nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(index if index >= 0 else 0)
            self.device_capacity_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).total)
            read = self._nvml_process_bytes
        else:
            read = _rss_bytes
        self._sampler = _Sampler(read, interval_s)
        self._started = False

    # --- reading the device ---------------------------------------------------
    def _nvml_process_bytes(self) -> int:
        import pynvml

        used = 0
        pid = os.getpid()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(self._nvml_handle):
            if proc.pid == pid and proc.usedGpuMemory:
                used = int(proc.usedGpuMemory)
        total_used = int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
        self.device_total_peak_bytes = max(self.device_total_peak_bytes, total_used)
        # Inside some containers NVML cannot see this process's pid: fall back to the device figure.
        return used or total_used

    # --- lifecycle ------------------------------------------------------------
    def start(self) -> MemoryProbe:
        """Start sampling; call it after the imports and before the model loads."""
        if not self._started:
            if self.device == "cuda":
                self._measure_cuda_context()
            else:
                # What the process holds before any model: the interpreter and the imported libraries.
                self.host_runtime_bytes = _rss_bytes()
            self._sampler.start()
            self._started = True
        return self

    def stop(self) -> None:
        self._sampler.stop()
        if self._nvml_handle is not None:
            import pynvml

            pynvml.nvmlShutdown()
            self._nvml_handle = None

    def cap(self, gib: float) -> None:
        """Cap this process's memory, to rehearse an out-of-memory on purpose.

        GPU: torch's allocator refuses beyond the cap (torch.OutOfMemoryError).
        CPU: the address space may grow only `gib` beyond what it is now (an allocation
        past it fails inside torch's CPU allocator).
        """
        if self.device == "cuda":
            import torch

            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, gib * GIB / total))
        else:
            import psutil

            limit = psutil.Process().memory_info().vms + int(gib * GIB)
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    def record_history(self) -> None:
        """Keep the allocator's history so an out-of-memory can be dumped for pytorch.org/memory_viz."""
        if self.device == "cuda":
            import torch

            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def dump_snapshot(self) -> Path | None:
        """Write the CUDA memory snapshot (GPU only); None on a CPU."""
        if self.device != "cuda":
            return None
        import torch

        path = Path(tempfile.mkdtemp(prefix="memory-")) / "cuda_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        return path

    def _measure_cuda_context(self) -> None:
        """The CUDA context: what the process holds on the device with no tensor allocated."""
        import torch

        before = self._nvml_process_bytes()
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        self.context_bytes = self._nvml_process_bytes() - before - torch.cuda.memory_reserved()

    def _fold(self) -> None:
        """Read the peaks since the last fold and credit them to every open phase."""
        process = self._sampler.take_window()
        allocated = reserved = 0
        if self.device == "cuda":
            import torch

            allocated, reserved = (
                int(torch.cuda.max_memory_allocated()),
                int(torch.cuda.max_memory_reserved()),
            )
            torch.cuda.reset_peak_memory_stats()
        self._step_peak = max(self._step_peak, process)
        for open_phase in self._open:
            open_phase.process_bytes = max(open_phase.process_bytes, process)
            open_phase.torch_allocated_bytes = max(open_phase.torch_allocated_bytes, allocated)
            open_phase.torch_reserved_bytes = max(open_phase.torch_reserved_bytes, reserved)

    @contextmanager
    def phase(self, name: str, keep: bool = True) -> Iterator[PhasePeak]:
        """Measure one phase. Phases nest (a training step inside "train"): a peak counts
        for every phase open when it happened."""
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

    def instrument(self, trainer) -> None:
        """Measure each generation and each training pass of a GRPOTrainer as phases of their own.

        TRL generates inside `_generate_and_score_completions` and trains in `compute_loss`;
        wrapping the two methods on this trainer instance gives per-step peaks for both.
        """
        for method, phase in (
            ("_generate_and_score_completions", "generate"),
            ("compute_loss", "train_step"),
        ):
            original = getattr(trainer, method)

            def measured(*args, _original=original, _phase=phase, **kwargs):
                with self.phase(_phase, keep=False) as peak:
                    result = _original(*args, **kwargs)
                self.step_phase_peaks.setdefault(_phase, []).append(peak)
                return result

            setattr(trainer, method, measured)

    def step_peak_bytes(self) -> int:
        """The process peak since the previous call (one training step, when called per step)."""
        self._fold()
        peak, self._step_peak = self._step_peak, 0
        return peak

    @property
    def process_peak_bytes(self) -> int:
        """The run's peak: NVML process memory on a GPU, the resident set on a CPU."""
        self._sampler.sample()
        return max(self._sampler.peak, _ru_maxrss_bytes() if self.device != "cuda" else 0)

    def torch_peak_bytes(self) -> tuple[int, int]:
        """The largest allocated and reserved peaks over all phases (GPU)."""
        return (
            max((p.torch_allocated_bytes for p in self.phases), default=0),
            max((p.torch_reserved_bytes for p in self.phases), default=0),
        )

    def summary(self) -> dict[str, float]:
        """The run's peaks in GiB under names that say what they count (see MEMORY_LABELS)."""
        out = {"memory/process_peak_gib": self.process_peak_bytes / GIB}
        if self.device == "cuda":
            allocated, reserved = self.torch_peak_bytes()
            out["memory/torch_allocated_peak_gib"] = allocated / GIB
            out["memory/torch_reserved_peak_gib"] = reserved / GIB
            out["memory/device_used_peak_gib"] = self.device_total_peak_bytes / GIB
            if self.context_bytes is not None:
                out["memory/cuda_context_gib"] = self.context_bytes / GIB
        for p in self.phases:
            out[f"memory/phase/{p.name}/process_peak_gib"] = p.process_bytes / GIB
            if self.device == "cuda":
                out[f"memory/phase/{p.name}/torch_allocated_peak_gib"] = p.torch_allocated_bytes / GIB
        return out


# What each figure counts and what it misses, logged beside the numbers.
MEMORY_LABELS = {
    "memory/process_peak_gib": (
        "GPU: this process's device memory from NVML, sampled every few ms (counts vLLM's pool, the CUDA "
        "context and torch's cache; misses peaks shorter than the interval). CPU: peak resident set "
        "(counts everything the process touched, Python and libraries included)."
    ),
    "memory/torch_allocated_peak_gib": (
        "torch.cuda.max_memory_allocated(): tensors torch allocated; misses vLLM's pool, the CUDA context, "
        "allocator fragmentation and non-torch allocations."
    ),
    "memory/torch_reserved_peak_gib": "torch.cuda.max_memory_reserved(): torch's caching allocator incl. free blocks.",
    "memory/device_used_peak_gib": "NVML device used memory (nvidia-smi's figure): all processes on the card.",
    "memory/cuda_context_gib": "NVML process memory before any tensor minus torch's reservation: the CUDA context.",
}


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _ru_maxrss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


# --- the model's tensors by kind (the lines measurable without a GPU) ---------------------------


def tensor_bytes(t) -> int:
    return int(t.numel() * t.element_size())


def quant_state_bytes(param) -> int:
    """The bytes of a bitsandbytes 4-bit weight's quantization constants (absmax, code, nested)."""
    qs = getattr(param, "quant_state", None)
    if qs is None:
        return 0
    total = 0
    for name in ("absmax", "code", "offset"):
        t = getattr(qs, name, None)
        if t is not None and hasattr(t, "element_size"):
            total += tensor_bytes(t)
    nested = getattr(qs, "state2", None)
    if nested is not None:
        for name in ("absmax", "code"):
            t = getattr(nested, name, None)
            if t is not None and hasattr(t, "element_size"):
                total += tensor_bytes(t)
    return total


def model_bytes_by_kind(model) -> dict[str, int]:
    """Bytes of the base weights (packed 4-bit + constants + 16-bit leftovers), of the LoRA
    parameters, and of TRL's frozen "ref" adapter copy when there is one.

    Tied embeddings are one tensor and counted once.
    """
    seen: set[int] = set()
    base = lora = ref = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        size = tensor_bytes(p) + quant_state_bytes(p)
        if "lora_" in name and ".ref." in name:
            ref += size  # TRL's frozen copy of the adapter: the reference policy when beta > 0
        elif "lora_" in name:
            lora += size
        else:
            base += size
    for _, b in model.named_buffers():
        if id(b) not in seen and b is not None:
            seen.add(id(b))
            base += tensor_bytes(b)
    kinds = {"base_weights": base, "lora_params": lora}
    if ref:
        kinds["reference_policy"] = ref
    return kinds


def grad_bytes(model) -> int:
    return sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer) -> int:
    """Every tensor the optimizer keeps per parameter (Adam's two moments, 8-bit quantization maps...)."""
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
    total = 0
    seen: set[int] = set()  # bitsandbytes' 8-bit Adam shares its quantization maps across parameters
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += tensor_bytes(value)
    return total


def is_out_of_memory(error: BaseException) -> bool:
    """torch's CUDA OOM, Python's MemoryError, torch's CPU allocator refusing an allocation, or
    oneDNN failing to build a kernel under an address-space limit."""
    import torch

    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    if "can't allocate memory" in text or "not enough memory" in text or "out of memory" in text:
        return True
    # oneDNN reports a failed allocation for its JIT kernel only as "could not create a primitive".
    # Without an address-space limit Linux overcommits and the OOM killer ends the process instead,
    # so under a limit (--memory-cap-gib, a container's ulimit -v) that message means memory.
    return "could not create a primitive" in text and _address_space_limited()


def _address_space_limited() -> bool:
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
