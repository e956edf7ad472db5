"""The precision a run's forwards compute in: lower precision for the losses, never for the model.

A run's ``dtype`` (fp32, bf16 or fp16) runs the matrix products of its forwards under
``torch.autocast``. What decides the model stays in fp32: the master weights, the perturbation
added to them (or, in batched forwards, the corrections that stand for it), and every message's
application. A client's scalar is then the two-point estimate from lower-precision losses, and
what that scalar does to the model is the same fp32 arithmetic on every client, so committed
states stay bit-identical.

Autocast is entered around each forward, never around a whole run: it keeps the cast copies of
weights that require grad until the outermost autocast region ends, and a two-point estimate
changes the weights in place between its two forwards. The run-wide setting is therefore a
context variable that the runners set (`forward_precision`) and the scoring functions read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar

import torch
import torch.nn.functional as F

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

_current: ContextVar[str] = ContextVar("seedflood_forward_dtype", default="fp32")


@contextmanager
def forward_precision(name: str) -> Iterator[None]:
    """Forwards inside compute in ``name`` (a key of DTYPES) on whatever device they run."""
    if name not in DTYPES:
        raise ValueError(f"forward dtype {name!r}: use one of {', '.join(DTYPES)}")
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


def forward_dtype() -> str:
    """The precision forwards compute in here and now: what a cached score must be keyed by."""
    return _current.get()


def autocast(device_type: str) -> AbstractContextManager[object]:
    """The region one forward on ``device_type`` runs in: nothing at fp32, so fp32 runs compute
    exactly as they did before precision was a setting."""
    name = _current.get()
    if name == "fp32":
        return nullcontext()
    return torch.autocast(device_type, dtype=DTYPES[name])


def autocasts(name: str, device: torch.device) -> bool:
    """Whether this torch computes a linear layer in ``name`` on ``device`` under autocast. A
    pair autocast does not support only warns and computes in fp32, which would make a bf16 run
    silently an fp32 one, so runners ask before the first forward."""
    dtype = DTYPES[name]
    if dtype == torch.float32:
        return True
    probe = torch.ones(1, 1, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device.type, dtype=dtype):
                return F.linear(probe, probe).dtype == dtype
        except RuntimeError:
            return False
