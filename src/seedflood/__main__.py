"""`python -m seedflood`: the command line, for processes started without the script."""

from seedflood.cli import app

app()
