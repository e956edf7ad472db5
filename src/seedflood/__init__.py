"""seedflood: decentralized training of language models with no central server."""

__version__ = "0.2.0"
