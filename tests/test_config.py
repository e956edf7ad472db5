"""Config errors name the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedflood.config import ConfigError, RunConfig, load_config, parse_override


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_are_typed(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "clients: 8\nlr: 1e-3\n"), ["rounds=7", "hops=null"])
    assert (config.clients, config.lr, config.rounds, config.hops) == (8, 1e-3, 7, None)
    assert parse_override("topology=meshgrid") == ("topology", "meshgrid")
    assert load_config(None, ["eps=0.01"]).eps == 0.01


def test_defaults_follow_the_paper() -> None:
    config = RunConfig()
    assert (config.rank, config.refresh, config.n_train, config.n_val, config.n_test) == (
        32,
        1000,
        1024,
        500,
        1000,
    )
    assert config.direction == "subcge" and config.hops is None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["topology=rin"], r"key 'topology'.*'ring'.*'meshgrid'.*got 'rin'"),
        (["direction=sparse"], r"key 'direction'.*'subcge'.*'dense'"),
        (["lr=-1"], r"key 'lr'.*greater than 0"),
        (["clients=1"], r"key 'clients'.*greater than or equal to 2"),
        (["rouns=3"], r"unknown key 'rouns'. Allowed keys: model, task"),
        (["method=fedavg"], r"key 'method'.*'seedflood'"),
        (["scalar_format=int4"], r"key 'scalar_format'.*'fp32'"),
        (["topology=edgelist"], r"needs the key 'edgelist'"),
        (["task=imdb"], r"key 'task'.*'sst2'"),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(
    overrides: list[str], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, overrides)


def test_bad_files_and_overrides_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "clients: [8\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="--set expects key=value, got 'rounds'"):
        load_config(None, ["rounds"])


def test_batched_forwards_are_on_exactly_where_they_apply() -> None:
    assert RunConfig().batched_forward
    assert not RunConfig(method="dsgd").batched_forward
    assert not RunConfig(direction="dense").batched_forward
    assert not load_config(None, ["batched_forward=false"]).batched_forward
    assert load_config(None, ["batched_forward=null"]).batched_forward
    with pytest.raises(ConfigError, match="batched_forward needs method seedflood"):
        load_config(None, ["method=choco", "batched_forward=true"])
