"""Model shapes: the few `config.json` fields that decide every byte of the budget.

The configs of the models the labs use ship in `budgets/models/*.json` (copied from each model's
`config.json` on the Hub), so nothing here needs the network. A shape can also be read from any
local `config.json` or model folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BudgetError

MODELS_DIR = Path(__file__).parent / "models"

# The seven linear layers of a Llama/Qwen3 decoder layer, in the order PEFT and Unsloth name them.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """What the budget needs from a dense decoder-only model's config.json."""

    name: str
    model_type: str
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    ffn: int  # intermediate_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim, or hidden // heads when the config has none
    vocab: int  # vocab_size
    tied: bool  # tie_word_embeddings: lm_head reuses the embedding matrix
    max_position: int = 0  # max_position_embeddings
    # Linear layers bitsandbytes leaves in 16 bit (quantization_config.llm_int8_skip_modules of a
    # pre-quantized checkpoint, e.g. Unsloth's dynamic "unsloth-bnb-4bit" quants keep a few).
    skip_modules: tuple[str, ...] = field(default=())
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises q and k per head (two RMSNorm weights of head_dim per layer)."""
        return self.model_type.startswith("qwen3")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer of one decoder layer."""
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.ffn
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }

    def linear_params_per_layer(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def norm_params_per_layer(self) -> int:
        # input_layernorm + post_attention_layernorm (+ q_norm and k_norm for Qwen3)
        return 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        """A separate output matrix only when the embeddings are not tied."""
        return 0 if self.tied else self.vocab * self.hidden

    def total_params(self) -> int:
        return (
            self.layers * (self.linear_params_per_layer() + self.norm_params_per_layer())
            + self.hidden  # final norm
            + self.embedding_params()
            + self.lm_head_params()
        )

    def is_skipped(self, layer: int, module: str) -> bool:
        """Whether bitsandbytes leaves model.layers.<layer>.<...>.<module> in 16 bit."""
        full = f"model.layers.{layer}.{'self_attn' if module[0] in 'qkvo' else 'mlp'}.{module}"
        # transformers' rule: a skip entry matches whole dotted parts of the module's name.
        return any(f".{s}." in f".{full}." for s in self.skip_modules)


def _from_config(cfg: dict[str, Any], name: str, source: str) -> ModelShape:
    """Read the fields; a multimodal config keeps the language model under text_config."""
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        quant = cfg.get("quantization_config") or {}
        skip = tuple(quant.get("llm_int8_skip_modules") or ())
        return ModelShape(
            name=name,
            model_type=str(cfg.get("model_type", "")),
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            ffn=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            max_position=int(cfg.get("max_position_embeddings") or 0),
            skip_modules=skip,
            source=source,
        )
    except KeyError as missing:
        raise BudgetError(
            f"model: {source} has no {missing} field; is it a decoder-only config.json?"
        ) from None


def catalog() -> dict[str, Path]:
    """Shipped configs by lower-case name (the file stem, e.g. "qwen3-4b")."""
    return {p.stem.lower(): p for p in sorted(MODELS_DIR.glob("*.json"))}


def _display_name(path: Path) -> str:
    cfg = json.loads(path.read_text())
    return str(cfg.get("_name") or path.stem)


def _catalog_match(text: str) -> Path | None:
    """Exact name (any case), else the longest shipped name that an HF-style id's last part starts
    with ("unsloth/Qwen3-4B-unsloth-bnb-4bit" -> qwen3-4b), up to a '-' or the end."""
    shipped = catalog()
    last = text.rstrip("/").split("/")[-1].lower()
    last = re.sub(r"^meta-", "", last)  # meta-llama/Meta-Llama-3.1-8B -> llama-3.1-8b
    if last in shipped:
        return shipped[last]
    best = None
    for key in shipped:
        whole = last.startswith(key) and (len(last) == len(key) or last[len(key)] in "-_")
        if whole and (best is None or len(key) > len(best)):
            best = key
    return shipped[best] if best else None


def hub_cache_config(model_id: str) -> Path | None:
    """A Hub model's config.json in the local Hugging Face cache, if it was downloaded before: the
    checkpoint's own config, with its quantization_config (what a pre-quantized checkpoint keeps in
    16 bit). Read offline; nothing is fetched."""
    if model_id.count("/") != 1 or model_id.startswith((".", "/", "~")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    repo = Path(hub) / f"models--{model_id.replace('/', '--')}"
    main = repo / "refs" / "main"
    snapshots = [repo / "snapshots" / main.read_text().strip()] if main.is_file() else []
    snapshots += sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return next((s / "config.json" for s in snapshots if (s / "config.json").is_file()), None)


def load_shape(model: str | Path | ModelShape) -> ModelShape:
    """A shape from a shipped name (any case), an HF-style id, a config.json path or a model folder.
    A Hub id whose checkpoint is in the local Hugging Face cache is read from its own config.json."""
    if isinstance(model, ModelShape):
        return model
    text = str(model).strip()
    if not text:
        raise BudgetError("model: empty name; give a name such as qwen3-4b or a path to a config.json")
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise BudgetError(f"model: folder {text} has no config.json")
    if path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BudgetError(f"model: cannot read {path} as JSON ({exc.__class__.__name__})") from None
        name = cfg.get("_name") or (path.parent.name if path.name == "config.json" else path.stem)
        return _from_config(cfg, str(name), str(path))
    cached = hub_cache_config(text)
    if cached is not None:
        cfg = json.loads(cached.read_text())
        match = _catalog_match(text)
        name = _display_name(match) if match else text.split("/")[-1]
        return _from_config(cfg, name, f"{cached} (the checkpoint's own config, from the Hugging Face cache)")
    match = _catalog_match(text)
    if match is None:
        known = ", ".join(_display_name(p) for p in catalog().values())
        raise BudgetError(f"model: unknown model {text!r}; known: {known}; or give a path to a config.json")
    return _from_config(json.loads(match.read_text()), _display_name(match), str(match))
