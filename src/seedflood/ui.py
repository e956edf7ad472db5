"""What every command shares: the console, progress bars, and how a user error ends a command."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from seedflood.config import ConfigError
from seedflood.learning.models import ModelError
from seedflood.learning.tasks import DataError
from seedflood.protocol.ledger import LedgerError
from seedflood.protocol.message_log import MessageLogError
from seedflood.protocol.messages import CodecError
from seedflood.topology import TopologyError
from seedflood.zo import DirectionError

console = Console(stderr=True)
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


def progress(label: str) -> Progress:
    """A bar with a count, a status field and the elapsed time."""
    columns = (
        TextColumn(label),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console)
