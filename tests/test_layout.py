"""The package's shape: few modules on the top floor, a test folder named after every package,
and the import contracts in pyproject.toml all kept (what `make lint` checks, here too so that a
plain `pytest` run catches a broken rule)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

import seedflood

PACKAGE = Path(seedflood.__file__).parent
TESTS = Path(__file__).parent
REPOSITORY = TESTS.parent


def test_the_top_floor_holds_at_most_twelve_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 12, modules


def test_every_package_has_a_test_folder() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.parent.name for p in TESTS.glob("*/__init__.py")}
    assert packages == folders


def test_the_import_contracts_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlinter.cli import lint_imports

    monkeypatch.chdir(REPOSITORY)
    # import-linter configures logging with disable_existing_loggers: every logger imported by
    # then would stay silent for the tests after this one
    loggers = [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    disabled = [logger.disabled for logger in loggers]
    try:
        assert lint_imports(no_cache=True, no_logo=True) == 0
    finally:
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was


TREE_BUDGET = 24 * 2**20
"""Bytes the tracked tree may take. A call to a lent GPU carries the tree and its ignored files
under 64 MiB in all, and the largest call of tools/lent-gpu.sh carries a third of SmolLM2's GGUF
(31 MiB) with the wheels and data (5 MiB): past this budget such a call could fail."""


def test_the_tracked_tree_leaves_room_for_a_call_to_a_lent_gpu() -> None:
    if not (REPOSITORY / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPOSITORY, capture_output=True, check=True
    ).stdout
    paths = [REPOSITORY / name for name in listed.decode().split("\0") if name]
    size = sum(path.stat().st_size for path in paths if path.is_file())
    assert size < TREE_BUDGET, f"the tracked tree takes {size / 2**20:.1f} MiB"
