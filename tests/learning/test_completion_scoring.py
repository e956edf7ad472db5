"""Language-modelling examples (one candidate, the completion): the loss is the completion's mean
negative log-likelihood, perplexity its token-weighted exponent, and an example is correct exactly
when greedy decoding (transformers' generate) writes the completion."""

from __future__ import annotations

import math

import pytest
import torch

from seedflood.learning.models import load_model
from seedflood.learning.scoring import TokenizedExample, evaluation, loss_and_correct


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def greedy(model, prompt: tuple[int, ...], tokens: int, pad_id: int) -> tuple[int, ...]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, pad_token_id=pad_id
    )
    return tuple(out[0, len(prompt) :].tolist())


def test_exact_match_is_greedy_decoding_and_loss_the_completion_nll(tiny) -> None:
    model, tokenizer = tiny
    pad_id = tokenizer.pad_token_id
    prompts = [tuple(tokenizer(text)["input_ids"]) for text in ("the film was", "hello, my friend")]
    written = [
        TokenizedExample(p, (greedy(model, p, n, pad_id),), 0)
        for p, n in zip(prompts, (3, 1), strict=True)
    ]
    first = written[0].candidates[0]
    vocabulary = model.get_output_embeddings().weight.shape[0]
    changed = (*first[:-1], (first[-1] + 1) % vocabulary)
    wrong = TokenizedExample(prompts[0], (changed,), 0)
    examples = [*written, wrong]

    scored = evaluation(model, examples, pad_id, batch_size=2)
    assert scored.accuracy == pytest.approx(2 / 3)
    assert loss_and_correct(model, written, pad_id)[1] == 2

    nll = []
    with torch.no_grad():
        for example in examples:
            completion = example.candidates[0]
            logits = model(torch.tensor([example.prompt + completion])).logits[0].double()
            start = len(example.prompt)
            log_probs = torch.log_softmax(logits[start - 1 : start - 1 + len(completion)], -1)
            nll.append(-log_probs.gather(1, torch.tensor(completion)[:, None]).squeeze(1))
    assert scored.loss == pytest.approx(sum(float(n.mean()) for n in nll) / 3, rel=1e-5)
    tokens = sum(len(n) for n in nll)
    assert scored.perplexity == pytest.approx(
        math.exp(sum(float(n.sum()) for n in nll) / tokens), rel=1e-5
    )


def test_classification_keeps_its_accuracy_and_has_no_perplexity(tiny) -> None:
    model, tokenizer = tiny
    ids = tuple(tokenizer("it was")["input_ids"])
    great, terrible = (
        tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in (" great", " terrible")
    )
    examples = [TokenizedExample(ids, ((terrible,), (great,)), label) for label in (0, 1)]
    scored = evaluation(model, examples, tokenizer.pad_token_id)
    assert scored.accuracy == 0.5 and scored.perplexity is None
