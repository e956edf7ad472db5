"""What every command shares: the console, its log, progress bars, and how a user error ends a
command."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers.utils import logging as transformers_logging

from seedflood.config import ConfigError, RunConfig, load_config
from seedflood.learning.models import ModelError
from seedflood.learning.tasks import DataError
from seedflood.protocol.ledger import LedgerError
from seedflood.protocol.message_log import MessageLogError
from seedflood.protocol.messages import CodecError
from seedflood.topology import TopologyError
from seedflood.zo import DirectionError

console = Console(stderr=True)
PACKAGE_LOG = logging.getLogger("seedflood")
USER_ERRORS = (
    ConfigError,
    DataError,
    TopologyError,
    ModelError,
    DirectionError,
    CodecError,
    MessageLogError,
    LedgerError,
)


def fail(error: Exception) -> typer.Exit:
    console.print(f"[bold red]error:[/] {error}")
    return typer.Exit(code=2)


SetOption = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config key: key=value")
]


def config_or_fail(config_file: Path | None, set_: list[str] | None) -> RunConfig:
    """The run config of ``config_file`` with the ``--set`` overrides, or the command ends with
    what was wrong."""
    try:
        return load_config(config_file, set_ or [])
    except ConfigError as error:
        raise fail(error) from None


def configure_logging(level: int) -> None:
    """Show the package's log records from ``level`` up on the console, through the one handler
    it keeps (each command replaces it), with times and sources when debugging. Other libraries
    keep their own handlers; their progress bars are turned off, as dozens of raw lines in a
    log file or beside our own bar say less than our status line."""
    debug = level <= logging.DEBUG
    handler = RichHandler(console=console, show_time=debug, show_path=debug)
    PACKAGE_LOG.handlers[:] = [handler]
    PACKAGE_LOG.setLevel(level)
    transformers_logging.disable_progress_bar()  # huggingface_hub's too
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # read as datasets loads


def progress(label: str) -> Progress:
    """A bar with a count, a status field and the elapsed time; none unless the log shows
    information (``--quiet``: warnings and errors only)."""
    columns = (
        TextColumn(label),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, disable=not PACKAGE_LOG.isEnabledFor(logging.INFO))
