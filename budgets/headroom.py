"""Spending the headroom: the largest group, completion length or batch that still fits, with the
line that binds, and the vLLM share that starts and leaves the trainer room."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .compute import compute
from .errors import BudgetError
from .plan import Plan, resolve
from .sheet import Sheet
from .units import GIB

KNOBS = ("num_generations", "max_completion_length", "per_device_train_batch_size")


@dataclass
class Headroom:
    knob: str
    current: int
    largest: int | None  # None: not even the smallest value fits
    binding: str  # the line (or input) that stops the next value, and why

    def to_dict(self) -> dict:
        return {"knob": self.knob, "current": self.current, "largest": self.largest, "binding": self.binding}


def _variant(plan: Plan, knob: str, value: int) -> Plan:
    """The plan with one knob changed, keeping what the lab keeps fixed: completions per micro-batch
    follow the group (batch stays a whole number of groups), the sequence grows with the completion."""
    if knob == "num_generations":
        return plan.with_num_generations(value)
    if knob == "max_completion_length":
        max_seq = plan.max_seq_length
        if max_seq is not None:
            max_seq = max(max_seq, plan.max_prompt_length + value)
        return plan.with_(max_completion_length=value, max_seq_length=max_seq)
    if knob == "per_device_train_batch_size":
        return plan.with_(per_device_train_batch_size=value)
    raise BudgetError(f"knob: must be one of {', '.join(KNOBS)}, got {knob!r}")


def _try(plan: Plan) -> tuple[bool, str]:
    try:
        sheet = compute(plan, _alternative=False)
    except BudgetError as exc:
        return False, str(exc)
    return sheet.fits, "" if sheet.fits else sheet.verdict().removeprefix("does not fit: ")


def largest(plan: Plan, knob: str, limit: int = 1 << 16) -> Headroom:
    """The largest value of `knob` for which the sheet fits (doubling, then bisection), and why the
    next value does not. Values that break divisibility (batch vs group) are skipped by stepping
    in multiples of the smallest valid step."""
    current = int(getattr(plan, knob))
    step = 1
    if knob == "per_device_train_batch_size":
        r = resolve(plan)
        g = plan.num_generations
        step = g // math.gcd(g, r.trainer_cards * plan.gradient_accumulation_steps)
    elif knob == "max_completion_length":
        step = 16  # vLLM's block: one more block of KV per rollout
    ok, why = _try(_variant(plan, knob, step))
    if not ok:
        return Headroom(knob, current, None, why)
    lo, hi = 1, None  # in units of step
    n = max(1, current // step)
    while hi is None:
        ok, why_n = _try(_variant(plan, knob, n * step))
        if ok:
            lo = n
            if n * step >= limit:
                return Headroom(knob, current, n * step, f"search stopped at {limit}")
            n *= 2
        else:
            hi, why = n, why_n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, why_mid = _try(_variant(plan, knob, mid * step))
        if ok:
            lo = mid
        else:
            hi, why = mid, why_mid
    return Headroom(knob, current, lo * step, f"at {hi * step}: {why}")


def headroom(plan: Plan) -> list[Headroom]:
    return [largest(plan, knob) for knob in KNOBS]


def suggest_vllm_util(plan: Plan) -> tuple[float, str]:
    """The vLLM share to use on the plan's card: the smallest util (in steps of 0.01) whose KV cache
    holds every rollout of the step at once, if the trainer still fits beside it; else the largest
    that fits. Returns (util, reasoning)."""
    r = resolve(plan)
    if not r.uses_vllm:
        raise BudgetError("gpu_memory_utilization: this plan generates without vLLM (fast_inference false)")
    standby = plan.unsloth_vllm_standby and not plan.unsloth_vllm_standby_util_override
    base = plan.with_(unsloth_vllm_standby=False) if standby else plan
    results = {}
    for pct in range(5, 101):
        u = pct / 100
        try:
            sheet = compute(base.with_(gpu_memory_utilization=u), _alternative=False)
        except BudgetError:
            continue
        results[u] = sheet
    fitting = [u for u, s in results.items() if s.fits]
    if not fitting:
        worst = results.get(plan.gpu_memory_utilization) or next(iter(results.values()), None)
        why = worst.verdict() if worst else "no util in (0, 1] gives a valid sheet"
        raise BudgetError(f"gpu_memory_utilization: no share from 0.05 to 1.00 fits on {r.card.name}: {why}")
    want = r.local_gen_batch if r.layout != "server" else r.gen_batch
    holds_all = [u for u in fitting if results[u].metrics["max_concurrent_rollouts"] >= want]
    hi = max(fitting)
    if holds_all:
        # Both sides rest on estimates (vLLM's profiling peak on one, activations on the other), so
        # take the middle of the range that holds every rollout and still fits, rounded down to 0.05.
        need = min(holds_all)
        u = max(need, math.floor((need + hi) / 2 * 20) / 20)
        s = results[u]
        reason = (
            f"{u:.2f}: the middle of {need:.2f} (the smallest share whose KV cache holds all {want} "
            f"rollouts of T {r.seq_len} at once) and {hi:.2f} (the largest share that still fits "
            f"{r.card.name}; above it {_why_not(results, hi)}); at {u:.2f} the KV cache is "
            f"{s.line('kv_cache').bytes / GIB:.2f} GiB ({s.metrics['vllm']['rollouts_in_kv']} rollouts) "
            f"and the peak {s.total_bytes / GIB:.2f} of {s.capacity_bytes / GIB:.2f} GiB"
        )
    else:
        u = hi
        s = results[u]
        reason = (
            f"{u:.2f}: the largest share that fits; its KV cache holds "
            f"{s.metrics['max_concurrent_rollouts']} of {want} rollouts at once, so generation runs "
            f"in waves (above {hi:.2f}: {_why_not(results, hi)})"
        )
    return u, reason


def _why_not(results: dict[float, Sheet], hi: float) -> str:
    nxt = round(hi + 0.01, 2)
    if nxt > 1:
        return "util cannot exceed 1"
    s = results.get(nxt)
    return s.verdict().removeprefix("does not fit: ") if s else "invalid"
