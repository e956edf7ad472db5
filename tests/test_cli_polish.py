"""The command line's manners: a version, a clean top-level help, --quiet that leaves warnings
and errors alone, and a resume note only where a resume was asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedflood import __version__
from seedflood.cli import app

TINY = ["model=tiny", "clients=4", "rounds=2", "eval_every=1", "n_train=64", "n_val=8"]


def run_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    args = ["run", "configs/quickstart.yaml", "--out", str(out)]
    for override in [*TINY, f"data_dir={data_dir}", "n_test=8", *extra]:
        args += ["--set", override]
    return args


pytestmark = pytest.mark.usefixtures("one_thread")


def test_version_prints_the_packages_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"seedflood {__version__}\n"


def test_top_level_help_is_one_plain_paragraph() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "`" not in result.output
    assert "Decentralized training of language models with no central server." in text
    for option in ("--quiet", "--verbose", "--version"):
        assert option in text


def test_quiet_shows_warnings_but_no_progress(data_dir: Path, tmp_path: Path) -> None:
    """Asking for more test examples than the data holds is a warning: it is all --quiet says."""
    result = CliRunner().invoke(app, ["--quiet", *run_args(data_dir, tmp_path, "n_test=500")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "results.json").is_file()
    assert "WARN" in result.output and "500" in result.output  # rich may shorten the level
    for chatter in ("round", "━", "INFO", "zero-shot", "results in"):
        assert chatter not in result.output


def test_default_shows_progress_and_the_summary(data_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, run_args(data_dir, tmp_path))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "round 2/2" in text and "round 1: train loss" in text
    assert "no checkpoint" not in text  # a fresh run says nothing about resuming
    # Rich folds a long path across lines: compared without any white space.
    assert f"resultsin{tmp_path}/results.json" in "".join(text.split())


def test_resume_with_nothing_to_resume_warns(data_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*run_args(data_dir, tmp_path), "--resume"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "WARN" in text and "starting from scratch" in text


def test_quiet_and_verbose_together_are_refused() -> None:
    result = CliRunner().invoke(app, ["--quiet", "--verbose", "report", "x"])
    assert result.exit_code == 2
    assert "error: --quiet and --verbose cannot be given together" in result.output


def test_errors_keep_their_red_line_under_quiet() -> None:
    result = CliRunner().invoke(app, ["--quiet", "report", "no/such/directory"])
    assert result.exit_code == 2
    assert "error: no such results directory: no/such/directory" in result.output
