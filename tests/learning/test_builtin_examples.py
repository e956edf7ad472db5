"""The built-in tasks became presets of the template mechanism without changing an example: the
digests of every task's train, validation and test examples (prompts, candidates, labels, order)
for two seeds were recorded from the real data by the code before the change. RTE's and BoolQ's
were recorded again when their validation examples came to be drawn from what training leaves of
their full-size training files (their training and test examples did not change)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from seedflood.learning.tasks import TASKS, TaskData, data_dir_from_env, load_task

RECORDED = json.loads((Path(__file__).parent / "builtin_examples.json").read_text())


def digest(data: TaskData) -> str:
    h = hashlib.sha256()
    for split in (data.train, data.val, data.test):
        for example in split:
            h.update(json.dumps([example.prompt, list(example.candidates), example.label]).encode())
        h.update(b"|")
    return h.hexdigest()


@pytest.mark.skipif(data_dir_from_env() is None, reason="SEEDFLOOD_DATA_DIR not set")
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_builtin_example_is_what_it_was(task: str, seed: int) -> None:
    data = load_task(task, seed=seed)
    recorded = RECORDED[f"{task}/{seed}"]
    assert [len(data.train), len(data.val), len(data.test)] == recorded["sizes"]
    assert digest(data) == recorded["sha256"]
