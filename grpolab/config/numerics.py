"""The CPU profile's arithmetic: the same bits on every x86-64 machine, in every process.

A float sum depends on the order it is added in, and torch's CPU kernels choose that order from the
machine: how many threads split a reduction, how wide a SIMD register is (AVX2's 8 floats or
AVX-512's 16), which code path MKL's matrix products take on this vendor's CPU. On a tiny model
trained with sampling, a last-bit difference flips a sampled token within a few steps and the run
goes elsewhere: measured 2026-12-03, the book's stand-in came out with other bytes under 4 threads
and under torch's scalar kernels than under 1 or 2 threads, and chapter 1's README command reached
26.6% held out on one machine and 56.2% on another.

So before torch computes anything, a CPU run fixes each of those choices (`pin`):

- **one thread** for torch and MKL: a reduction is added in one order whatever the core count;
- **ATen's AVX2 kernels** (`ATEN_CPU_CAPABILITY=avx2`), which every x86-64 CPU of the last decade
  runs; an AVX-512 machine would otherwise take its own kernels. Inductor, which Unsloth's compiled
  code goes through, reads the same variable for the code it generates, and bitsandbytes' CPU
  kernels follow ATen's choice;
- **MKL's compatible branch** (`MKL_CBWR=COMPATIBLE`): the one code path MKL promises to run the
  same on Intel's and on other vendors' CPUs (its AVX2 branch is Intel's only);
- oneDNN held to AVX2 as well (`ONEDNN_MAX_CPU_ISA`), for any kernel that reaches it.

What it costs, measured 2026-12-03 on a 2-core AMD EPYC (labs/grpo-first/README.md): chapter 1's
command takes 1.53x the wall clock of the commit before, which trained 60 steps on two threads
against its 80 on one, and 1.13x its CPU time. `current`
reads back what the process really computes with (torch's threads, ATen's kernels, MKL's branch),
and the run's tags say so: a process that computed before the pin (a notebook that trained in an
earlier cell) or a CPU without AVX2 still runs, and says that its figures may differ from the book's.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

THREADS = 1
CAPABILITY = "AVX2"  # ATen's name for its kernels, as torch.backends.cpu.get_cpu_capability() says it
MKL_BRANCH = "COMPATIBLE"
# Read by torch, MKL and oneDNN when they start: set before torch computes anything.
ENV = {
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "ATEN_CPU_CAPABILITY": CAPABILITY.lower(),
    "MKL_CBWR": MKL_BRANCH,
    "ONEDNN_MAX_CPU_ISA": CAPABILITY,
}
# MKL's own numbers for its branches (mkl_cbwr.h); mkl_serv_cbwr_get(MKL_CBWR_BRANCH) returns one.
_MKL_CBWR_BRANCH = 1
_MKL_BRANCHES = {
    1: "off",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    12: "AVX512",
}
_MKL_COMPATIBLE = 3


@dataclass(frozen=True)
class Numerics:
    """What this process's torch computes with: its threads, ATen's kernels and MKL's branch."""

    threads: int
    capability: str
    mkl_branch: str

    @property
    def pinned(self) -> bool:
        return (self.threads, self.capability, self.mkl_branch) == (THREADS, CAPABILITY, MKL_BRANCH)

    def describe(self) -> str:
        """One line: `book (1 thread, AVX2 kernels, MKL COMPATIBLE)` or what differs and why it matters."""
        what = f"{self.threads} thread{'s' * (self.threads != 1)}, {self.capability} kernels, MKL {self.mkl_branch}"
        if self.pinned:
            return f"book ({what})"
        return f"not the book's ({what}): its CPU figures may differ from the README's"

    def tags(self) -> dict[str, str]:
        return {"cpu_numerics": self.describe()}


def pin() -> Numerics:
    """Fix the CPU's arithmetic for this process and the processes it starts, and return what it
    computes with. Call it before torch computes anything: ATen's kernels and MKL's branch are chosen
    once, on first use (torch's thread count can change at any time)."""
    os.environ.update(ENV)
    import torch

    torch.set_num_threads(THREADS)
    _set_mkl_branch()
    return current()


def current() -> Numerics:
    """What this process computes with now (reading ATen's kernels fixes them, if nothing had yet)."""
    import torch

    return Numerics(torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(), _mkl_branch())


def _mkl() -> ctypes.CDLL | None:
    """torch's own MKL (linked into libtorch_cpu), whose CNR functions it exports; None without it."""
    if "torch" not in sys.modules:
        return None
    library = Path(sys.modules["torch"].__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        mkl = ctypes.CDLL(str(library))
        mkl.mkl_serv_cbwr_get, mkl.mkl_serv_cbwr_set  # noqa: B018 (present, or AttributeError)
    except (OSError, AttributeError):
        return None
    return mkl


def _set_mkl_branch() -> None:
    """MKL_CBWR is read when MKL starts; where MKL started before the variable was set, ask it directly
    (it refuses once it has computed: `current` then reports the branch it kept)."""
    mkl = _mkl()
    if mkl is not None and mkl.mkl_serv_cbwr_get(_MKL_CBWR_BRANCH) != _MKL_COMPATIBLE:
        mkl.mkl_serv_cbwr_set(_MKL_COMPATIBLE)


def _mkl_branch() -> str:
    mkl = _mkl()
    if mkl is None:
        return "absent"
    code = mkl.mkl_serv_cbwr_get(_MKL_CBWR_BRANCH)
    return _MKL_BRANCHES.get(code, str(code))
