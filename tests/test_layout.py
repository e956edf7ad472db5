"""The package's shape: few modules on the top floor, a test folder named after every package,
and the import contracts in pyproject.toml all kept (what `make lint` checks, here too so that a
plain `pytest` run catches a broken rule)."""

from __future__ import annotations

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
    assert lint_imports(no_cache=True, no_logo=True) == 0
