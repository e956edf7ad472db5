"""The tiny task data directory most data-loading tests start from."""

from __future__ import annotations

import pathlib

import pytest

from tests.learning.task_files import write_task_tree


@pytest.fixture
def data_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_task_tree(tmp_path)
