"""The 16-bit merge as a GGUF file, the format llama.cpp (and Ollama, LM Studio) runs.

llama.cpp's own converter (`convert_hf_to_gguf.py`) is used when one is found: a llama.cpp checkout
named by `--llama-cpp DIR` or the LLAMA_CPP environment variable. PyPI ships it only inside
llama-cpp-python's source, which compiles llama.cpp on install (minutes, and a compiler), so the
locked environment does not have it. Without it, the file is written with `gguf`, the Python package
the converter itself writes with: the same tensor names (llama.cpp's map for the architecture), the
same layout (16-bit matrices, 32-bit norms, no output matrix when the embeddings are tied) and the
same metadata keys. The converter also refuses a tokenizer it does not know by hash (the CPU
stand-in's character-level one), which the stage says in one line before writing the file itself.

The file is then checked two ways: every tensor read back with `gguf`'s reader and compared with the
merge, bit for bit, and the model loaded from the file alone by transformers' GGUF loader (an
independent reader of llama.cpp's names), then scored. Where llama-cpp-python is installed, llama.cpp
itself scores it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CONVERTER = "convert_hf_to_gguf.py"


@dataclass(frozen=True)
class Written:
    path: Path
    writer: str  # "llama.cpp's converter" or "gguf's writer"
    note: str  # why the converter was not used, when it was not ("" when it was)


def find_converter(llama_cpp: Path | None = None) -> Path | None:
    """llama.cpp's converter: in `llama_cpp` (a checkout), or under $LLAMA_CPP."""
    for root in (llama_cpp, os.environ.get("LLAMA_CPP")):
        if root and (Path(root) / CONVERTER).is_file():
            return Path(root) / CONVERTER
    return None


def write(merged: Path, out: Path, llama_cpp: Path | None = None) -> Written:
    """`merged` (a plain 16-bit transformers folder) as `out`, a GGUF file; written whole or not at all."""
    converter = find_converter(llama_cpp)
    partial = out.with_name(out.name + ".partial")
    note = (
        f"llama.cpp's converter is not installed (no {CONVERTER} under --llama-cpp or $LLAMA_CPP): "
        "written with gguf's writer, as the converter writes"
    )
    if converter is not None:
        done = subprocess.run(
            [sys.executable, str(converter), str(merged), "--outfile", str(partial), "--outtype", "f16"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            partial.replace(out)
            return Written(out, "llama.cpp's converter", "")
        partial.unlink(missing_ok=True)
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no output")
        note = f"llama.cpp's converter refused it ({last.strip()}): written with gguf's writer instead"
    try:
        _write_with_gguf(merged, partial)
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return Written(out, "gguf's writer", note)


def _write_with_gguf(merged: Path, out: Path) -> None:
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(merged)
    if config.model_type != "qwen3":
        raise NotImplementedError(
            f"gguf's writer here knows Qwen3 only, not {config.model_type}: use llama.cpp's converter"
        )
    arch = gguf.MODEL_ARCH.QWEN3
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(merged.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])  # transformers 5 keeps it there
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _add_tokenizer(writer, AutoTokenizer.from_pretrained(merged), config.vocab_size)
    for gguf_name, array in llama_cpp_tensors(merged, config).items():
        # The converter's layout: matrices in 16 bit, vectors (the norms) in 32.
        writer.add_tensor(gguf_name, array.astype(np.float16 if array.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tokenizer(writer, tokenizer, vocab_size: int) -> None:
    import gguf

    vocab = tokenizer.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    special = set(tokenizer.all_special_ids)
    tokens, types = [], []
    for i in range(vocab_size):  # the embedding's rows, padded as the converter pads them
        token = by_id.get(i)
        tokens.append(token if token is not None else f"[PAD{i}]")
        types.append(
            gguf.TokenType.UNUSED
            if token is None
            else gguf.TokenType.CONTROL
            if i in special
            else gguf.TokenType.USER_DEFINED
            if token in tokenizer.get_added_vocab()
            else gguf.TokenType.NORMAL
        )
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([])  # one character a token: nothing to merge
    if tokenizer.eos_token_id is not None:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def llama_cpp_tensors(merged: Path, config) -> dict[str, np.ndarray]:
    """The merge's tensors under llama.cpp's names for Qwen3, as the converter writes them: no output
    matrix when the embeddings are tied (llama.cpp reads the embeddings for it)."""
    import gguf
    from safetensors.numpy import load_file

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, config.num_hidden_layers)
    found = {}
    for shard in sorted(merged.glob("*.safetensors")):
        for name, array in load_file(str(shard)).items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ValueError(f"llama.cpp has no name for {name} in Qwen3")
            found[gguf_name] = array
    return found


def compare(path: Path, merged: Path) -> tuple[int, float]:
    """Every tensor of the GGUF file against the merge's, by llama.cpp's names: (tensors compared,
    the largest absolute difference). A tensor missing on either side raises."""
    import gguf
    from transformers import AutoConfig

    expected = llama_cpp_tensors(merged, AutoConfig.from_pretrained(merged))
    reader = gguf.GGUFReader(str(path))
    found = {t.name: t for t in reader.tensors}
    if set(found) != set(expected):
        raise ValueError(
            f"{path.name}: tensors differ from the merge's: only in the file {sorted(set(found) - set(expected))[:3]}, "
            f"only in the merge {sorted(set(expected) - set(found))[:3]}"
        )
    worst = 0.0
    for name, tensor in found.items():
        # The reader gives GGUF's shape order (reversed); the data is row-major as in the merge.
        got = np.asarray(tensor.data).astype(np.float32).reshape(expected[name].shape)
        worst = max(worst, float(np.abs(got - expected[name].astype(np.float32)).max()))
    return len(found), worst


def load_with_transformers(path: Path, merged: Path):
    """The model as the GGUF file alone holds it, read by transformers' GGUF loader (its own map of
    llama.cpp's names), in float32; the architecture's sizes from the merge's config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(merged)
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, config=config, dtype=torch.float32
    ).eval()
