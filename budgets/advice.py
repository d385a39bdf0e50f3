"""What to change when a line does not fit, named as the settings a command accepts.

Advice is data (`Change`s), rendered against the plan's current values and the settings the
printing command accepts: it never names a flag the command lacks, and never advises what is
already set. The lab and the budget CLI render the same advice with their own parsers' settings.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    setting: str  # a Plan / lab.toml setting; its flag is --setting-with-dashes
    how: str  # "lower", "raise" or "set"
    value: Any = None  # "set": the value to set; "lower"/"raise": an optional bound

    def applies(self, values: Mapping[str, Any], accepts: Collection[str] | None) -> bool:
        if accepts is not None and self.setting not in accepts:
            return False
        now = values.get(self.setting)
        if self.how == "set":
            return _same(now, self.value) is False
        if self.how == "lower":
            return now is None or (not isinstance(now, bool) and now > (self.value or 0) and now > 0)
        return True

    def render(self, values: Mapping[str, Any]) -> str:
        flag = "--" + self.setting.replace("_", "-")
        now = values.get(self.setting)
        if self.how == "set":
            return f"set {flag} {value_text(self.value)}"
        current = f" (now {value_text(now)})" if now is not None else ""
        bound = (
            f" to {'<=' if self.how == 'lower' else '>='} {value_text(self.value)}"
            if self.value is not None
            else ""
        )
        return f"{self.how} {flag}{current}{bound}"


def lower(setting: str, to: Any = None) -> Change:
    return Change(setting, "lower", to)


def raise_(setting: str, to: Any = None) -> Change:
    return Change(setting, "raise", to)


def set_to(setting: str, value: Any) -> Change:
    return Change(setting, "set", value)


# The lines that grow with a setting, and the settings that shrink them, most effective first.
BY_LINE: dict[str, tuple[Change, ...]] = {
    "train_activations": (
        lower("per_device_train_batch_size"),
        lower("max_completion_length"),
        set_to("use_gradient_checkpointing", "unsloth"),
    ),
    "logits": (
        lower("per_device_train_batch_size"),
        lower("max_completion_length"),
        set_to("chunked_logits", True),
    ),
    "kv_cache": (lower("gpu_memory_utilization"), set_to("unsloth_vllm_standby", True)),
    "generate_kv_cache": (
        lower("num_generations"),
        lower("per_device_train_batch_size"),
        lower("max_completion_length"),
    ),
    "base_weights": (set_to("load_in_4bit", True), set_to("trainer_sharding", "fsdp")),
    "optimizer_states": (
        set_to("optim", "adamw_8bit"),
        lower("lora_rank"),
        set_to("trainer_sharding", "fsdp"),
    ),
    "lora_params": (lower("lora_rank"),),
    "lora_grads": (lower("lora_rank"),),
    "full_grads": (set_to("full_finetuning", False), set_to("trainer_sharding", "fsdp")),
    "reference_policy": (set_to("beta", 0.0), set_to("full_finetuning", False)),
    "vllm_weights": (set_to("layout", "shared"), set_to("unsloth_vllm_standby", True)),
    "vllm_profile_activations": (lower("max_num_seqs"),),
    "cuda_graphs": (set_to("enforce_eager", True),),
    "vllm_lora_slots": (lower("max_lora_rank"),),
    "host_shape_caches": (lower("max_completion_length"),),
}


def render(
    changes: tuple[Change, ...], values: Mapping[str, Any], accepts: Collection[str] | None = None
) -> str:
    """`lower --x (now 8) or --y (now 768), or set --z true`; a plain sentence when nothing applies."""
    usable = [c for c in changes if c.applies(values, accepts)]
    if not usable:
        return "no setting of this command shrinks it: free memory on the card or use a larger one"
    return " or ".join(c.render(values) for c in usable)


# One rendered change: `raise --x (now 3) to >= 13`, `lower --x (now 8)`, `set --z true`.
_RENDERED = re.compile(
    r"\b(?P<how>raise|lower) --(?P<flag>[a-z0-9-]+)(?: \(now [^)]*\))?(?: to [<>]= (?P<bound>[^\s,:;)]+))?"
    r"|\bset --(?P<set_flag>[a-z0-9-]+) (?:'(?P<quoted>[^']*)'|(?P<value>[^\s,:;)]+))"
)


def parse(text: str) -> tuple[Change, ...]:
    """The changes a line of advice names, in its order: the inverse of `render`, so a program applies
    the advice a reader was shown, not a copy of it. A raise or lower with no bound has no value."""
    changes = []
    for m in _RENDERED.finditer(text):
        if m["set_flag"]:
            value = m["quoted"] if m["quoted"] is not None else m["value"]
            changes.append(Change(m["set_flag"].replace("-", "_"), "set", value))
        else:
            changes.append(Change(m["flag"].replace("-", "_"), m["how"], m["bound"]))
    return tuple(changes)


def for_line(line: str, values: Mapping[str, Any], accepts: Collection[str] | None = None) -> str:
    return render(BY_LINE.get(line, ()), values, accepts)


def _same(a: Any, b: Any) -> bool | None:
    if a is None:
        return None
    if isinstance(b, bool) or isinstance(a, bool):
        return str(a).lower() == str(b).lower()
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        return a == b
    return str(a).lower() == str(b).lower()


def value_text(value: Any) -> str:
    """A value as the advice writes it after its flag, and a shell takes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    # A value a shell would split or read (a task_config's JSON) is quoted as a shell takes it, so the
    # advice can be pasted, and read back whole (`parse`).
    return str(value) if _PLAIN.fullmatch(str(value)) else shlex.quote(str(value))


_PLAIN = re.compile(r"[\w.+/=@%-]+")
