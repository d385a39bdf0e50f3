"""The comparison of budget and measurement, on hand-built figures: what each line missed by,
what no line explains, and the CPU line measured from the step peaks."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from budgets.units import GIB, MIB
from grpolab.lab.meter import Meter
from grpolab.memory.device import Device
from grpolab.memory.probe import MemoryProbe

from suite import sample_comparison as comparison


def test_what_no_line_explains_is_the_total_miss_less_the_misses_of_the_lines_the_peak_holds():
    c = comparison()
    # +50 MiB over in total; base_weights +10 and kv_cache -10 explain none of it.
    assert c.unattributed == 50 * MIB
    c = comparison(total_measured=460 * MIB, measured={**c.measured, "kv_cache": 330 * MIB})
    # +10 MiB over in total; base_weights +10 and kv_cache +30 explain 40: 30 MiB were over-budgeted.
    assert c.unattributed == -30 * MIB


def test_the_verdict_says_whether_it_held_the_line_that_missed_most_and_what_no_line_explains():
    verdict = comparison().verdict()
    assert verdict.startswith("The budget did not hold: measured peak 500.00 MiB vs budgeted 450.00 MiB")
    assert "the line that missed most: logits (+20.00 MiB, +40.0%)" in verdict
    assert verdict.endswith("outside every line: +50.00 MiB.")
    assert comparison(total_measured=400 * MIB).verdict().startswith("The budget held")


def test_each_sentence_and_table_holds_one_unit_the_runs():
    """The verdict and the tables write every figure in the run's memory unit (tag `memory_unit`): on the
    CPU a 1.55 GiB budget beside a 1009 MiB peak reads 1587.20 MiB vs 1009.12 MiB, and a KiB-sized
    line keeps three significant digits instead of reading 0.00; on a GPU every figure is in GiB."""
    from grpolab.judging import overview
    from grpolab.memory import comparison as module

    cpu = comparison(
        unit="mib",
        total_budget=int(1.55 * GIB),
        total_measured=int(1009.12 * MIB),
        budget={"base_weights": 79 * 1024, "host_runtime": 1280 * MIB},
        measured={"base_weights": 80 * 1024, "host_runtime": 1000 * MIB},
        peak_phase_lines=["base_weights", "host_runtime"],
    )
    verdict = cpu.verdict()
    assert verdict.startswith("The budget held: measured peak 1009.12 MiB vs budgeted 1587.20 MiB")
    assert "host_runtime (-280.00 MiB, -21.9%)" in verdict
    for text in (verdict, module.table(cpu), overview.line_table(cpu)):
        assert set(re.findall(r"\b[KMG]iB\b", text)) == {"MiB"}, text
    assert "| base_weights | 0.0771 MiB | 0.0781 MiB | +0.000977 MiB |" in overview.line_table(cpu)
    gpu = comparison(unit="gib", total_budget=int(13.5 * GIB), total_measured=int(12.25 * GIB))
    assert gpu.verdict().startswith("The budget held: measured peak 12.25 GiB vs budgeted 13.50 GiB")
    for text in (gpu.verdict(), module.table(gpu), overview.line_table(gpu)):
        assert set(re.findall(r"\b[KMG]iB\b", text)) == {"GiB"}, text
    # compare() takes the unit from where the run computed, as the run's tag `memory_unit` does.
    sheet = SimpleNamespace(
        lines=[SimpleNamespace(name="host_runtime", bytes=GIB, formula="", phases=("train",))],
        total_bytes=GIB,
        peak_phase="train",
    )
    assert module.compare(sheet, {}, GIB, on_gpu=False).unit == "mib"
    assert module.compare(sheet, {}, GIB, on_gpu=True).unit == "gib"


def test_the_printed_peak_is_the_logged_total():
    cpu = comparison(total_measured=int(1.5 * GIB), total_label="resident-set peak")
    assert cpu.peak_lines() == ["Peak memory (resident set of this process, CPU): 1.50 GiB"]
    gpu = comparison(total_measured=int(6.25 * GIB), unpaired_measured={"torch_allocated_peak": 3 * GIB})
    assert gpu.peak_lines() == [
        "Peak memory (NVML, whole process incl. vLLM and CUDA context): 6.25 GiB",
        "Peak memory (torch allocator; vLLM's weights and KV cache included unless standby): 3.00 GiB",
    ]


def test_on_a_cpu_the_growth_over_the_steps_is_the_shape_cache_line():
    probe = MemoryProbe(Device("cpu"))
    probe.start()
    try:
        meter = Meter(probe, sheet=None)
        meter.step_peaks = [(1, 1000 * MIB), (2, 1010 * MIB), (3, 1180 * MIB), (4, 1170 * MIB)]
        measured = meter.lines()
    finally:
        probe.stop()
    assert measured["host_shape_caches"] == 180 * MIB
    assert 0 < measured["host_runtime"] < 8 * GIB


def test_the_steps_two_phases_are_paired_with_the_sheets_without_other_processes():
    """Standby moves memory between generation and training: each is logged budget beside measured,
    the largest step's, and the budget leaves out what other processes hold (not this process's peak)."""
    from budgets import compute
    from grpolab.config.settings import lab_settings
    from grpolab.memory.comparison import phase_pairs
    from grpolab.memory.probe import PhasePeak

    plan = lab_settings("labs/grpo-first", "gpu").plan().with_(other_processes_gib=1.0)
    off, on = compute(plan), compute(plan.with_(unsloth_vllm_standby=True))
    peaks = {
        "generate": [
            PhasePeak("generate", process_bytes=9 << 30),
            PhasePeak("generate", process_bytes=10 << 30),
        ],
        "train_step": [PhasePeak("train_step", process_bytes=11 << 30)],
    }
    pairs = phase_pairs(off, peaks)
    assert pairs["phase/generate/budget_gib"] == pytest.approx((off.phases["generate"] - (1 << 30)) / GIB)
    assert pairs["phase/generate/measured_gib"] == 10.0 and pairs["phase/train/measured_gib"] == 11.0
    assert pairs["phase/train/rel_error"] == pytest.approx(11 / pairs["phase/train/budget_gib"] - 1)
    # Under standby the KV cache is gone while training: the train phase's budget holds no KV cache.
    kv = on.line("kv_cache")
    assert "train" not in kv.phases and "generate" in kv.phases
    assert phase_pairs(on, {}) == {}  # nothing measured, nothing paired
