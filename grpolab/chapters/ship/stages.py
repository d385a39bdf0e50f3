"""The stages an adapter goes through on its way to users, each scored on the training run's held-out
prompts, greedy, with the task's exact checker (grpolab.judging.evaluate), against what the adapter scored.

    reload        the saved adapter, loaded by Unsloth's loader from its folder in this (fresh) process
    merged_16bit  merged into the base's weights in 16 bit: a plain transformers folder
    merged_4bit   merged into the 4-bit weights and requantized: the trap
    gguf          the 16-bit merge as a GGUF file (llama.cpp's format)
    served        the registered 16-bit merge behind a real HTTP server, asked by a small client
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from grpolab.judging.evaluate import EvalResult


@dataclass
class Stage:
    """One stage, scored: its held-out result, how it was made and scored, what else it measured."""

    name: str
    result: EvalResult
    note: str = ""  # how it was made and scored, and what went wrong when something did
    figures: dict[str, float] = field(default_factory=dict)  # what else it measured: ship/<stage>/<name>

    @property
    def right(self) -> int:
        """Held-out prompts it answered right."""
        return round(self.result.accuracy * self.result.prompts)

    def changed(self, reference: EvalResult) -> int:
        """Held-out prompts whose answer differs, character for character, from the reload's."""
        return sum(a != b for a, b in zip(self.result.completions, reference.completions, strict=True))

    def metrics(self, reference: EvalResult, logged_accuracy: float) -> dict[str, float]:
        """ship/<stage>/*: its accuracy, its difference from the training run's logged accuracy, the
        answers it changed from the reload's, and its own figures."""
        return {
            f"ship/{self.name}/accuracy": self.result.accuracy,
            f"ship/{self.name}/accuracy_diff": self.result.accuracy - logged_accuracy,
            f"ship/{self.name}/answers_changed": float(self.changed(reference)),
            **{f"ship/{self.name}/{k}": v for k, v in self.figures.items()},
        }


# --- reload ---------------------------------------------------------------------------------------
def load_adapter_as_a_user_does(adapter_dir: Path, settings):
    """Unsloth's loader on the adapter folder (it reads the base from adapter_config.json and attaches
    the adapter through PEFT): what chapter 6's page tells a user to write. Returns (model, tokenizer)."""
    from grpolab.model import policy

    return policy.load_model(str(adapter_dir), settings)


def adapter_applied(model, adapter_dir: Path) -> str:
    """Which load path served the model: "" when the saved adapter's tensors are the ones in it and
    active, else one line naming what was served instead."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from grpolab.chapters.ship.merge import lora_layers

    if not hasattr(model, "peft_config"):
        return f"the loader served the base alone: no adapter is attached to {type(model).__name__}"
    if any(layer.disable_adapters for _, layer in lora_layers(model)) or not model.active_adapters:
        return "the adapter is attached but disabled: the base answered"
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    # PEFT's own view of the adapter, under the names it saves them with.
    mine = get_peft_model_state_dict(model)
    same = [k for k, v in saved.items() if k in mine and _same(mine[k], v)]
    if len(same) < len(saved):
        return f"only {len(same)} of the adapter's {len(saved)} tensors are the saved ones: another adapter answered"
    return ""


def _same(a, b) -> bool:
    return a.shape == b.shape and bool((a.detach().float().cpu() == b.float()).all())


def held_out_logits(model, tokenizer, settings, completions: tuple[str, ...]) -> Iterator:
    """A model's logits over every token of each held-out prompt followed by the adapter's answer
    (teacher-forced, so that two models read the same text), in float32 on the CPU, a batch at a time:
    only the tokens each batch really holds (padding dropped)."""
    import torch

    from grpolab.judging.evaluate import eval_rows, held_out_prompts

    prompts = held_out_prompts(tokenizer, eval_rows(settings))
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    with torch.no_grad():
        for start in range(0, len(texts), 16):
            batch = tokenizer(
                texts[start : start + 16],
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=False,
            ).to(model.device)
            logits = model(**batch).logits.float()
            yield logits[batch["attention_mask"].bool()].cpu()


def largest_gap(a: Iterable, b: Iterable) -> float:
    """The largest difference between two models' logits for the same token, a batch of each at a time."""
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


# --- the stages, in order -------------------------------------------------------------------------
def run_stages(found, profile: str, folder: Path, args) -> tuple[list[Stage], str]:
    """Every stage of `found`'s adapter, in order, each printed as it is scored: (the stages, the
    registered model's URI)."""
    print(
        "Each stage, scored on the training run's held-out prompts (greedy, the task's exact checker):",
        flush=True,
    )
    shipment = Shipment(found, profile == "gpu", folder, args)
    stages = []
    for stage in (
        shipment.reload,
        shipment.merged_16bit,
        shipment.merged_4bit,
        shipment.gguf,
        shipment.served,
    ):
        stages.append(said(stage()))
    return stages, shipment.registered


def said(stage: Stage) -> Stage:
    line = stage.result.line() if stage.result else "not scored"
    print(f"  {stage.name:<13} {line}" + (f"\n  {'':<13} {stage.note}" if stage.note else ""), flush=True)
    return stage


class Shipment:
    """One adapter on its way: what each stage leaves for the next (the reloaded model, the merge's
    folder, the registered version). Each method is one stage; a stop is acted on between them."""

    def __init__(self, found, on_gpu: bool, folder: Path, args) -> None:
        self.found, self.settings, self.on_gpu, self.folder, self.args = (
            found,
            found.settings,
            on_gpu,
            folder,
            args,
        )
        self.merged_dir = folder / "merged_16bit"
        self.model = self.tokenizer = self.reference = self.adapter_logits = self.merged_tokenizer = None
        self.registered = ""

    def reload(self) -> Stage:
        """What a user gets who loads the saved adapter the way the chapter's page says."""
        from grpolab.judging.evaluate import evaluate
        from grpolab.lifecycle.endings import STOPS

        STOPS.enter("the reload (Unsloth's loader on the adapter folder)")
        adapter_dir = self.found.adapter_dir
        self.model, self.tokenizer = load_adapter_as_a_user_does(adapter_dir, self.settings)
        wrong = adapter_applied(self.model, adapter_dir)
        STOPS.enter("the reload's held-out evaluation")
        self.reference = evaluate(self.model, self.tokenizer, self.settings, "reload", adapter_dir)
        return Stage("reload", self.reference, reload_note(self.reference, self.found, wrong))

    def merged_16bit(self) -> Stage:
        """The adapter folded into 16-bit weights: a folder transformers loads alone."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpolab.chapters.ship import merge
        from grpolab.judging.evaluate import evaluate
        from grpolab.lifecycle.endings import STOPS

        STOPS.enter("the 16-bit merge")
        if self.on_gpu:
            self.model.save_pretrained_merged(
                str(self.merged_dir), self.tokenizer, save_method="merged_16bit"
            )
            how = "Unsloth's save_pretrained_merged(merged_16bit)"
        else:
            merge.save_merged_16bit(self.model, self.tokenizer, self.merged_dir)
            how = "bitsandbytes' dequantized base + PEFT's delta, in float16 (Unsloth's CPU loader refuses this merge)"
        # Loaded as anyone would: transformers alone, with the folder's own tokenizer and chat template.
        # On a CPU the float16 weights compute in float32 (an exact upcast); on a card already holding the
        # 4-bit policy, "auto" places what does not fit on the host.
        plain = AutoModelForCausalLM.from_pretrained(
            self.merged_dir,
            dtype=torch.bfloat16 if self.on_gpu else torch.float32,
            device_map="auto" if self.on_gpu else None,
        ).eval()
        self.merged_tokenizer = AutoTokenizer.from_pretrained(self.merged_dir)
        lost_template = not self.merged_tokenizer.chat_template
        STOPS.enter("the 16-bit merge's held-out evaluation")
        result = evaluate(plain, self.merged_tokenizer, self.settings, "merged_16bit")
        # The adapter's logits are kept for the 4-bit merge's comparison on a CPU. On a GPU, Qwen3-4B's for
        # every held-out token would take gigabytes of host memory: compared a batch at a time, then gone
        # (the 4-bit merge's answers are compared instead).
        adapter = self._logits(self.model)
        if not self.on_gpu:
            self.adapter_logits = adapter = list(adapter)
        gap = largest_gap(adapter, self._logits(plain))
        note = f"{how}; largest logit difference from the adapter {gap:.2g}"
        if lost_template:
            note += "; its tokenizer has NO chat template: the prompts would not be the trained ones"
        return Stage("merged_16bit", result, note, {"max_logit_diff": gap})

    def merged_4bit(self) -> Stage:
        """The same merge into the 4-bit weights, requantized: the trap. The adapter is gone after it."""
        from grpolab.chapters.ship import merge
        from grpolab.judging.evaluate import evaluate
        from grpolab.lifecycle.endings import STOPS

        STOPS.enter("the 4-bit merge")
        merged, lost = merge.merge_4bit_in_place(self.model)
        self.model = None
        STOPS.enter("the 4-bit merge's held-out evaluation")
        result = evaluate(merged, self.tokenizer, self.settings, "merged_4bit")
        figures = {
            "delta_below_half_step": lost.below_half_step,
            "delta_rounded_away": lost.same_code,
            "median_delta_over_half_step": lost.median_ratio,
        }
        note = lost.line()
        if self.adapter_logits is not None:
            figures["max_logit_diff"] = largest_gap(self.adapter_logits, self._logits(merged))
            note += f"; largest logit difference from the adapter {figures['max_logit_diff']:.2g}"
        return Stage("merged_4bit", result, note, figures)

    def gguf(self) -> Stage:
        """The 16-bit merge in llama.cpp's format, read back tensor by tensor, and scored."""
        from grpolab.chapters.ship import gguf_file
        from grpolab.judging.evaluate import evaluate
        from grpolab.lifecycle.endings import STOPS

        STOPS.enter("the GGUF file")
        written = gguf_file.write(self.merged_dir, self.folder / "model-f16.gguf", self.args.llama_cpp)
        tensors, worst = gguf_file.compare(written.path, self.merged_dir)
        from_file = gguf_file.load_with_transformers(written.path, self.merged_dir)
        STOPS.enter("the GGUF file's held-out evaluation")
        result = evaluate(from_file, self.merged_tokenizer, self.settings, "gguf")
        same = "bit for bit" if worst == 0 else f"largest difference {worst:.2g}"
        note = (written.note or written.writer) + (
            f"; {tensors} tensors read back, each equal to the merge's {same}; scored by transformers' GGUF loader"
        )
        return Stage("gguf", result, note, {"tensors": float(tensors), "max_tensor_diff": worst})

    def served(self) -> Stage:
        """The registered merge behind a real server, asked over HTTP."""
        import mlflow

        from grpolab.chapters.ship import serve
        from grpolab.judging.evaluate import eval_rows, held_out_prompts, score
        from grpolab.lifecycle.endings import STOPS

        s = self.settings
        STOPS.enter("the registered model's logging")
        name = f"{self.found.run.data.tags.get('model_id', 'model')}-{s.task}-grpo"
        self.registered = serve.log_merged(self.merged_dir, s.max_completion_length, name, self.found.run_id)
        mlflow.set_tag("ship.registered_model", self.registered)
        rows = eval_rows(s)
        tokenizer = self.merged_tokenizer
        prompts = held_out_prompts(tokenizer, rows)
        port = self.args.port or serve.free_port()
        STOPS.enter("the server's start and its held-out answers")
        if self.on_gpu:
            with serve.vllm_server(self.merged_dir, port, s.max_seq_length) as url:
                answers = serve.ask_openai(url, "merged", prompts, s.max_completion_length)
            how = "vLLM's OpenAI-compatible server (vllm serve) on the 16-bit merge"
        else:
            with serve.mlflow_server(self.registered, port) as url:
                answers = serve.ask_mlflow(url, prompts, s.max_completion_length)
            how = f"MLflow's scoring server (mlflow models serve --env-manager local) on {self.registered}"
        lengths = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
        return Stage("served", score(s, rows, answers, lengths, "served"), f"{how}, asked over HTTP")

    def _logits(self, model) -> Iterator:
        return held_out_logits(model, self.tokenizer, self.settings, self.reference.completions)


def reload_note(reloaded: EvalResult, found, wrong: str) -> str:
    """ "" when the reload answered as the training run logged; else which load path served what."""
    n = reloaded.prompts
    if round(reloaded.accuracy * n) == round(found.adapter_accuracy * n) and not wrong:
        return ""
    if wrong:
        return wrong
    if found.base_accuracy is not None and reloaded.accuracy == found.base_accuracy:
        return "scored as the base did: the load path served the base, not the adapter"
    return (
        f"differs from the logged {found.adapter_accuracy:.1%}: the reload is not the model that was scored"
    )
