"""Files of tensors and plain data that are safe to load and whose damage is caught.

Checkpoints and peer snapshots are read back by ``torch.load``, whose default unpickling runs
whatever code a file names: a checkpoint copied from elsewhere, or a state dir someone could
write to, would run commands. A sealed file is read with ``weights_only=True``, so it can hold
only tensors and plain data (dicts with string keys, lists, str, int, float, bool, None), and it
carries a SHA-256 over that content, so a flipped bit in a tensor is refused instead of resuming
silently on another model.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
import zipfile
from typing import Any

import torch

from seedflood.files import atomic_write

SEAL = "seedflood-sealed-1"


class SealedFileError(ValueError):
    """A sealed file that cannot be trusted: unreadable, damaged, or not sealed."""


class DamagedFileError(SealedFileError):
    """A sealed file whose content no longer matches its checksum, or that is cut short."""


class UnsafeFileError(SealedFileError):
    """A file that is not plain data: an older format, or not written by seedflood at all."""


def _tensor_bytes(tensor: torch.Tensor) -> list[memoryview]:
    if tensor.layout == torch.sparse_coo:
        return [*_tensor_bytes(tensor._indices()), *_tensor_bytes(tensor._values())]
    if tensor.layout != torch.strided:
        raise TypeError(f"cannot seal a tensor of layout {tensor.layout}")
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return [memoryview(flat.view(torch.uint8).numpy())]


def digest(content: Any) -> str:
    """SHA-256 of the canonical JSON of ``content`` with every tensor replaced by its dtype,
    shape and layout, followed by the tensors' bytes in that order: a change to any value, in
    the plain data or in a tensor, changes it."""
    tensors: list[torch.Tensor] = []

    def skeleton(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return {"tensor": [str(value.dtype), list(value.shape), str(value.layout)]}
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise TypeError("a sealed dict has string keys only")
            return {key: skeleton(value[key]) for key in sorted(value)}
        if isinstance(value, list | tuple):
            return [skeleton(item) for item in value]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"cannot seal a {type(value).__name__}: only tensors and plain data")

    hasher = hashlib.sha256(json.dumps(skeleton(content), sort_keys=True).encode())
    for tensor in tensors:
        for chunk in _tensor_bytes(tensor):
            hasher.update(chunk)
    return hasher.hexdigest()


def save_sealed(path: str | os.PathLike, content: dict[str, Any]) -> None:
    """Write ``content`` with its checksum, atomically (streamed: no second copy in memory)."""
    sealed = {"seal": SEAL, "sha256": digest(content), "content": content}
    atomic_write(path, lambda file: torch.save(sealed, file))


def peek_sealed(path: str | os.PathLike) -> dict[str, Any] | None:
    """The content of a sealed file through a memory map, its checksum not checked (that reads
    every byte, 9 GB for a 16-client gossip run), or None where it cannot be read: to choose
    between files by what they say, never to use what they hold."""
    try:
        sealed = torch.load(path, weights_only=True, mmap=True)
    except (
        OSError,
        EOFError,
        RuntimeError,
        ValueError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ):
        return None
    content = sealed.get("content") if isinstance(sealed, dict) else None
    return content if isinstance(content, dict) else None


def load_sealed(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """The content of a sealed file, checked against its checksum before anyone uses it. A file
    that is not a zip archive (a bare pickle, a cut zip) cannot be memory-mapped: it is read
    without the map, still as plain data, for the error to say what it is."""
    try:
        with warnings.catch_warnings():  # a bare pickle's protocol: the refusal below says more
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            sealed = torch.load(path, weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as error:
        if "weights only" in str(error).lower():
            raise UnsafeFileError(
                f"{path} holds pickled objects, which are not loaded (an older format, or a file "
                "not written by seedflood)"
            ) from None
        raise DamagedFileError(f"{path} is damaged: {error}") from None
    except (EOFError, RuntimeError, ValueError, zipfile.BadZipFile) as error:
        raise DamagedFileError(f"{path} is damaged or cut short: {error}") from None
    if not (isinstance(sealed, dict) and sealed.get("seal") == SEAL):
        raise UnsafeFileError(f"{path} is not a sealed seedflood file ({SEAL})")
    content = sealed.get("content")
    try:
        actual = digest(content)
    except TypeError as error:
        raise DamagedFileError(f"{path} is damaged: {error}") from None
    if actual != sealed.get("sha256"):
        raise DamagedFileError(
            f"{path} is damaged: checksum {actual[:16]}… does not match the stored "
            f"{str(sealed.get('sha256'))[:16]}…"
        )
    return content
