"""Atomic writes: a reader sees the old file or the new one; durable ones survive a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from seedflood.files import atomic_write, atomic_write_json


@pytest.mark.parametrize(("durable", "fsyncs"), [(True, 2), (False, 0)])
def test_a_durable_write_syncs_the_file_and_its_directory_and_a_status_write_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool, fsyncs: int
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    path = tmp_path / "status.json"
    atomic_write_json(path, {"round": 1})
    synced.clear()
    atomic_write_json(path, {"round": 2}, durable=durable)
    assert len(synced) == fsyncs
    assert json.loads(path.read_text()) == {"round": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary left


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, durable: bool
) -> None:
    path = tmp_path / "status.json"
    atomic_write_json(path, {"round": 1})

    def half_then_fail(file) -> None:
        file.write(b'{"round": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, half_then_fail, durable=durable)
    assert json.loads(path.read_text()) == {"round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
