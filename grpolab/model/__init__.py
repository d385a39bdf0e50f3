"""The policy and what it trains with: loading it, its trainer, its precision, its CUDA set-up.

- `policy`: the 4-bit base through Unsloth plus the LoRA adapter (the stand-in on a CPU).
- `unsloth_trainer`: Unsloth's generated GRPO trainer, on both profiles.
- `compile_once`: a graph compiled once when processes that start together miss torch's cache.
- `precision`: bf16, fp16 or fp32, from the dtype the model really loaded in.
- `cuda_env`: Unsloth's standby switch and allocator, set before CUDA starts.
- `rehearsal`: the model's exact shape with random weights, to rehearse a run before the download.

May import: task, budgets, grpolab.config, grpolab.memory, grpolab.lifecycle, grpolab.tiny_model.
"""
