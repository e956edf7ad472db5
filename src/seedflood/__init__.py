"""seedflood: decentralized training of language models with no central server.

The Python API (seedflood.api) is imported on first use, so `import seedflood` stays light:

    from seedflood import RunConfig, train
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["RunConfig", "compare", "load_config", "replay", "train"]

_API = {
    "RunConfig": "seedflood.config",
    "load_config": "seedflood.config",
    "train": "seedflood.api",
    "compare": "seedflood.api",
    "replay": "seedflood.api",
}


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'seedflood' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
