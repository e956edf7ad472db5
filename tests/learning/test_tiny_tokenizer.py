"""The tiny model's tokenizer is SmolLM2's, read from the GGUF's metadata and cached, offline,
without converting the model's weights; the slow test checks it against the converted model's."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from seedflood.learning import models
from seedflood.learning.models import DEFAULT_MODEL, converted_model_dir, load_model

SAMPLES = [
    "a delight, wonderful acting",
    "  Leading spaces,\ttabs\nand new lines  ",
    "Ünïcödé, 中文, emoji 🎉 and digits 1234567890",
    "<|im_start|>user\nIs the review positive?<|im_end|>",
    "def f(x):\n    return x ** 2  # code",
]


def ids(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    return [tokenizer(text).input_ids for text in SAMPLES]


@pytest.mark.slow
def test_tiny_reads_its_tokenizer_from_the_gguf_without_converting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_conversion() -> None:
        raise AssertionError("the tiny model converted SmolLM2's weights")

    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    _, first = load_model("tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-tokenizer"]
    assert not converted_model_dir().exists()
    _, cached = load_model("tiny")  # from the cache this time
    assert len(first) == len(cached) == 49_152
    assert ids(cached) == ids(first)
    assert (first.bos_token, first.eos_token, first.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )


@pytest.mark.slow  # converts SmolLM2's GGUF (20 to 90 s)
def test_tiny_tokenizer_is_the_converted_models(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "tiny"))
    _, tiny = load_model("tiny")
    monkeypatch.setenv("SEEDFLOOD_CACHE", str(tmp_path / "converted"))
    capfd.readouterr()
    _, converted = load_model(DEFAULT_MODEL)
    assert "it/s" not in capfd.readouterr().err  # the conversion draws no tqdm bar
    assert ids(tiny) == ids(converted)
    assert tiny.get_vocab() == converted.get_vocab()
    assert tiny.special_tokens_map == converted.special_tokens_map
    _, reused = load_model("tiny")  # a converted model at hand: its tokenizer, no second copy
    assert ids(reused) == ids(converted)
    assert [p.name for p in (tmp_path / "converted").iterdir()] == ["smollm2-135m-instruct"]
