"""A rehearsal checkpoint: the model's exact shape with random weights, saved in 4-bit, built offline.

`train.py --rehearse` runs the lab on it before anything is downloaded: the same loader (Unsloth,
reading a pre-quantized bitsandbytes checkpoint, vLLM in the same process on a GPU), the same
trainer, the same budget lines measured and compared. The weights are random, so the rewards mean
nothing; the memory is the real model's: every tensor has its shape and dtype, and random weights
never emit the end-of-turn token, so every completion runs to max_completion_length (the worst case).

The shape comes from the checkpoint's own config.json when it is in the local Hugging Face cache
(its quantization_config included, so what it keeps in 16 bit stays in 16 bit), else from the
shipped config in budgets/models/. The build runs in a process of its own, in a folder the user can
choose (`--rehearsal-dir`, default `<output-dir>/rehearsal`), checked for room first. The tokenizer
is the CPU stand-in's character-level one, padded with filler tokens to the model's vocabulary so
every id the random model samples decodes: a character per token makes prompts longer than a BPE
tokenizer would, which errs on the side of memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from budgets.shapes import catalog, hub_cache_config, load_shape
from budgets.units import GIB
from grpolab.config.paths import REPO_ROOT
from grpolab.config.settings import LabSettings, LabSettingsError
from grpolab.lifecycle.atomic import save_pretrained_atomically
from grpolab.lifecycle.endings import STOPS
from grpolab.tiny_model import build_tokenizer

REHEARSAL_SEED = 0
REHEARSAL_STEPS = 3  # enough for every phase to reach its peak: load, generate, train, optimizer step


def source_config(model: str) -> tuple[dict, str]:
    """The config.json to rebuild `model` from: the cached checkpoint's, else the shipped shape's."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text()), str(path / "config.json")
    cached = hub_cache_config(model)
    if cached is not None:
        return json.loads(cached.read_text()), str(cached)
    shape = load_shape(model)  # BudgetError names the known models when there is no match
    shipped = catalog()[Path(shape.source).stem.lower()]
    config = {k: v for k, v in json.loads(shipped.read_text()).items() if not k.startswith("_")}
    return config, str(shipped)


def rehearsal_tokenizer(vocab_size: int):
    """The character-level tokenizer, padded to `vocab_size` with filler tokens."""
    tokenizer = build_tokenizer()
    fillers = vocab_size - len(tokenizer)
    if fillers > 0:
        tokenizer.add_tokens([f"<|r{i}|>" for i in range(fillers)], special_tokens=True)
    return tokenizer


class RehearsalError(LabSettingsError):
    """The rehearsal checkpoint cannot be built here; the message is one line with the fix."""


def space_needed(model: str) -> tuple[int, int]:
    """Bytes the build writes at its peak: the 16-bit staging copy of the random weights, and the
    4-bit checkpoint made from it (both exist until the staging copy is removed)."""
    from budgets.arithmetic import base_weight_parts

    shape = load_shape(model)
    return shape.total_params() * 2, sum(base_weight_parts(shape, "nf4", 2).values())


def build(model: str, root: Path) -> tuple[Path, str]:
    """The rehearsal checkpoint of `model` under `root` (built once, under a lock, atomically): its
    folder, and the config.json its shape was read from.

    The build runs in a process of its own. It imports transformers and bitsandbytes and, on a GPU,
    quantizes there: none of that may happen in the lab's process before Unsloth is imported
    (grpolab.model.cuda_env), and what the build leaves in torch's CUDA cache would shrink vLLM's share
    (Unsloth sizes it from the free memory). A process that exits gives everything back."""
    config, source = source_config(model)
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    final = root / f"{load_shape(model).name.replace('/', '--')}-{key}"
    if (final / "config.json").is_file():
        return final, source
    require_room(model, root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "config.json").is_file():
            built = subprocess.Popen(
                [sys.executable, "-m", "grpolab.model.rehearsal", model, str(final)],
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                with STOPS.at_once():  # minutes on a GPU, all of it waiting: a stop stops the build too
                    _, stderr = built.communicate()
            except KeyboardInterrupt:
                built.terminate()  # its staging copy goes with it
                built.wait()
                raise
            if built.returncode != 0:
                lines = [line for line in stderr.splitlines() if line.strip()]
                raise RehearsalError(
                    f"rehearsal: building {model}'s random checkpoint failed: {lines[-1] if lines else built.returncode}"
                )
    return final, source


def require_room(model: str, root: Path) -> None:
    """Refuse in one line, before anything is written, a folder without room for the build."""
    staging, checkpoint = space_needed(model)
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    needed = int((staging + checkpoint) * 1.05)  # configs, the tokenizer, the file system's rounding
    if free < needed:
        raise RehearsalError(
            f"rehearsal: building {model}'s random checkpoint in {root} needs {needed / GIB:.2f} GiB (a 16-bit "
            f"staging copy of {staging / GIB:.2f} GiB and the 4-bit checkpoint of {checkpoint / GIB:.2f} GiB) but "
            f"{existing} has {free / GIB:.2f} GiB free: pass --rehearsal-dir with a folder on a larger disk"
        )


def quantization(config: dict):
    """The checkpoint's own bitsandbytes settings when the source config has them (what it keeps in 16
    bit, its quant type, its storage), else the NF4 of Unsloth's bnb-4bit uploads."""
    import torch
    from transformers import BitsAndBytesConfig

    own = config.get("quantization_config") or {}
    if own.get("quant_method") == "bitsandbytes" and own.get("load_in_4bit"):
        return BitsAndBytesConfig.from_dict(dict(own))
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def _random_4bit(config: dict, staging: Path):
    """Random weights of the config's shape, saved in 16 bit to `staging`, then loaded back quantized
    by bitsandbytes with the checkpoint's own quantization settings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    quant = quantization(config)
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
    torch.manual_seed(REHEARSAL_SEED)
    AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).save_pretrained(staging)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return AutoModelForCausalLM.from_pretrained(
        staging, quantization_config=quant, dtype=torch.bfloat16, device_map=device
    )


def _build_here(model: str, final: Path) -> None:
    """The build itself, in the process `build` starts: staged beside the checkpoint, not in a
    temp folder (a RAM-backed /tmp would hold 8 GB for Qwen3-4B), and removed whatever happens."""
    config, _ = source_config(model)
    staging = final.parent / f".staging-{final.name}-{os.getpid()}"
    try:
        model_4bit = _random_4bit(config, staging)
        save_pretrained_atomically(model_4bit, rehearsal_tokenizer(config["vocab_size"]), final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # absent, or built for another torch / CUDA
        return False
    return True


def rehearsal_settings(s: LabSettings) -> tuple[LabSettings, list[str]]:
    """The lab's settings for a rehearsal: a few steps (unless --max-steps says otherwise), no
    held-out evaluation (random weights answer nothing), and transformers' generate where vLLM
    cannot be imported. Returns the settings and what the rehearsal cannot measure."""
    changes: dict = {}
    if "max_steps" not in s.overridden:
        changes["max_steps"] = REHEARSAL_STEPS
    if "eval_prompts" not in s.overridden:
        changes["eval_prompts"] = 0
    cannot: list[str] = []
    if s.fast_inference and not vllm_importable():
        changes["fast_inference"] = False
        cannot.append(
            "vLLM cannot be imported here: generation runs through transformers, so the lines of vLLM's share "
            "(kv_cache, vllm_lora_slots, vllm_profile_activations, cuda_graphs) are not measured"
        )
    return s.replace(**changes), cannot


if __name__ == "__main__":  # `build` runs the build here, in a process of its own
    import signal

    # Stopped by its lab (a signal the lab received): the staging copy is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    _build_here(sys.argv[1], Path(sys.argv[2]))
