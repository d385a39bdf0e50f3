"""The CPU profile's model: a tiny random-weight Qwen3 and a character-level tokenizer.

Without a GPU (and without the Hub) the lab still runs its whole loop, so it needs a
model it can build offline. This one has Qwen3's architecture, the shape in
budgets/models/tiny-qwen3.json, and a tokenizer whose tokens are single characters plus
the few special tokens the chat template and the task's answer tags need. Built once,
then cached as an ordinary `save_pretrained` folder that Unsloth and transformers load
like any model from the Hub.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from grpolab.atomic import save_pretrained_atomically

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_PATH = REPO_ROOT / "budgets" / "models" / "tiny-qwen3.json"
DEFAULT_CACHE = REPO_ROOT / ".cache" / "tiny-qwen3"
BUILD_SEED = 0

# Special tokens first so their ids are fixed: pad 0, bos 1, eos/im_end 2.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<ans>", "</ans>"]
# Printable ASCII and the newline: every character the addition prompts and answers use.
CHARACTERS = ["\n"] + [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]

# ChatML, as Qwen3 uses it, without the thinking block: the tiny model never thinks.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_config_dict() -> dict:
    """The tiny model's config.json fields (one source: budgets reads the same file)."""
    config = json.loads(CONFIG_PATH.read_text())
    config.pop("_comment", None)
    return config


def build_tokenizer():
    """A character-level fast tokenizer with `<ans>`/`</ans>` as single tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # An unknown character (a non-ASCII digit, say) becomes "?" rather than failing.
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    # Split into single characters; special tokens are matched before splitting.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    from tokenizers import decoders

    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<|endoftext|>",
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token="?",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=tiny_config_dict()["max_position_embeddings"],
    )
    # The answer tags are ordinary (not special) added tokens so decoding keeps them.
    tokenizer.add_tokens(["<ans>", "</ans>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_model(seed: int = BUILD_SEED):
    """A random-weight Qwen3ForCausalLM of the tiny shape, deterministic for a seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**tiny_config_dict())
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def ensure_tiny_model(path: Path = DEFAULT_CACHE) -> Path:
    """Build and cache the tiny model and tokenizer at `path` unless already there.

    The folder is written under a temporary name and renamed into place, so an
    interrupted build never leaves a half-written model that later runs would load.
    """
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer, model = build_tokenizer(), build_model()
    if model.config.vocab_size < len(tokenizer):
        raise RuntimeError(f"tiny vocab {model.config.vocab_size} < tokenizer size {len(tokenizer)}")
    return save_pretrained_atomically(model, tokenizer, path)
