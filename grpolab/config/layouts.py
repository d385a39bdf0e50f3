"""How a chapter's generation and training share the cards: the seam a chapter's `layout` chooses.

The budget already sheets three layouts (budgets/layouts/): `shared` (Unsloth's vLLM in the
trainer's process, on the trainer's own 4-bit weights), `colocate` (TRL's vLLM in the trainer's
process with its own copy of the weights, asleep while training) and `server` (`trl vllm-serve` on
cards of its own, the trainer sending full weights each step). A chapter declares one in its
lab.toml (`layout = "server"`); the settings hand it to the budget's Plan, and the harness reads
here what runs in that layout: which GRPO trainer, where the rollouts are decoded, what the memory
probe can see. The harness runs `shared` today; the others are described so a chapter that needs
one fails in one line that says what it would take, instead of training in the wrong layout.

What a server-mode chapter adds (docs/chapters.md has the whole contract): TRL's own GRPOTrainer
with `use_vllm=True, vllm_mode="server"` (Unsloth's generated trainer drives only its in-process
engine), a bf16 base (TRL server mode merges the adapter and sends full weights; it cannot with a
4-bit base), a launcher for `trl vllm-serve` on its own cards, and a probe per process and card
(NVML by the server's pid), whose figures pair with the sheet's per-card lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpolab.config.errors import LabSettingsError


@dataclass(frozen=True)
class Layout:
    name: str  # the budget's layout (budgets.vocabulary.LAYOUTS)
    trainer: str  # the GRPO trainer that runs: "unsloth" (its generated trainer) or "trl"
    generation: str  # where the rollouts are decoded
    measured: str  # what the memory probe sees
    runs_here: str = ""  # empty: the harness runs it; else what running it would take


LAYOUTS = {
    "shared": Layout(
        "shared",
        trainer="unsloth",
        generation="Unsloth's vLLM in this process, on the trainer's 4-bit weights (transformers' generate on a CPU)",
        measured="this process on one card: NVML sampled every few ms, torch's allocator, the tensors of each line",
    ),
    "colocate": Layout(
        "colocate",
        trainer="trl",
        generation="TRL's vLLM in this process with its own copy of the weights, asleep while training",
        measured="this process on one card",
        runs_here="TRL's own GRPOTrainer with vllm_mode='colocate' and a 16-bit base",
    ),
    "server": Layout(
        "server",
        trainer="trl",
        generation="a `trl vllm-serve` process on cards of its own",
        measured="each process on each card (the trainer's and the server's)",
        runs_here=(
            "TRL's own GRPOTrainer with vllm_mode='server', a 16-bit base, a launcher for trl vllm-serve and a "
            "probe per process and card"
        ),
    ),
}


def get_layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise LabSettingsError(
            f"layout: unknown layout {name!r}; use one of {', '.join(LAYOUTS)} in lab.toml"
        )
    return LAYOUTS[name]


def require_runnable(name: str) -> None:
    """One line when the harness cannot run a chapter's layout, naming what it would take."""
    layout = get_layout(name)
    if layout.runs_here:
        raise LabSettingsError(
            f"layout: {name} is sheeted by the budget but the harness runs the shared layout only; a {name} "
            f"chapter needs {layout.runs_here} (docs/chapters.md): use the budget CLI's --layout {name} to size it"
        )
