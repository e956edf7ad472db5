"""Config errors name the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedflood.cli import app
from seedflood.config import ConfigError, RunConfig, load_config, parse_override
from seedflood.learning.models import load_model
from seedflood.zo import DirectionError, make_direction


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
        (["task=imdb"], r"key 'task': unknown task 'imdb'; allowed: sst2, boolq.*own data"),
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
    assert RunConfig(method="dzsgd", lora=True).batched_forward
    assert not RunConfig(method="dzsgd").batched_forward
    assert not RunConfig(method="dsgd", lora=True).batched_forward
    assert not load_config(None, ["batched_forward=false"]).batched_forward
    assert load_config(None, ["batched_forward=null"]).batched_forward
    with pytest.raises(ConfigError, match="batched_forward needs method seedflood"):
        load_config(None, ["method=choco", "batched_forward=true"])
    with pytest.raises(ConfigError, match="or method dzsgd with lora: true"):
        load_config(None, ["method=dzsgd", "batched_forward=true"])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["link_loss=1"], r"key 'link_loss'.*less than 1"),
        (["link_duplicate=1.5"], r"key 'link_duplicate'.*less than or equal to 1"),
        (["link_reorder=-0.1"], r"key 'link_reorder'.*greater than or equal to 0"),
        (["link_delay=2"], r"key 'link_delay'.*less than or equal to 1"),
        (["link_delay_hops=0"], r"key 'link_delay_hops'.*greater than or equal to 1"),
        (["link_seed=-1"], r"key 'link_seed'.*greater than or equal to 0"),
        (["repair_exchanges=-1"], r"key 'repair_exchanges'.*greater than or equal to 0"),
        (["clip_multiple=0"], r"key 'clip_multiple'.*greater than 0"),
        (["clip_window=0"], r"key 'clip_window'.*greater than or equal to 1"),
        (["cut_rounds=[5, 2]"], r"key 'cut_rounds' is \[start, end\].*0 <= start < end.*\[5, 2\]"),
        (["cut_rounds=[3, 3]"], r"key 'cut_rounds'.*got \[3, 3\]"),
        (["cut_rounds=[-1, 3]"], r"key 'cut_rounds'.*got \[-1, 3\]"),
        (["cut_rounds=[1, 2, 3]"], r"key 'cut_rounds'.*at most 2 items"),
        (["cut_edges=[[1, 1]]"], r"key 'cut_edges'.*two different clients.*got \[1, 1\]"),
        (["cut_edges=[[0, 1], [3, 16]]"], r"0 <= a, b < clients \(16\) \(got \[3, 16\]\)"),
        (["cut_edges=[[-1, 2]]"], r"key 'cut_edges'.*got \[-1, 2\]"),
        (["cut_edges=[[0, 1, 2]]"], r"key 'cut_edges.0'.*at most 2 items"),
        (["clients=true"], r"key 'clients' is not a boolean \(got True\)"),
        (["rounds=no"], r"key 'rounds' is not a boolean \(got False\)"),
        (["lr=.inf"], r"key 'lr'.*finite number"),
        (["eps=.nan"], r"key 'eps'"),
        (["rounds=2.5"], r"key 'rounds'.*integer.*fractional"),
        (["lora_targets=[]"], r"key 'lora_targets'.*at least 1 item"),
        (["n_train=8"], r"keys 'n_train' \(8\) and 'clients' \(16\).*raise n_train or lower"),
        (
            ["topology=random_regular", "clients=5"],
            r"'random_regular' needs n\*degree even, got degree=3, n=5: make topology_degree or "
            "clients even",
        ),
        (
            ["topology=random_regular", "topology_degree=16"],
            r"needs 1 <= degree < n, got degree=16, n=16: set topology_degree below clients",
        ),
        (
            ["topology=random_regular", "topology_degree=1"],
            r"degree 1 is disjoint pairs, never connected.*set topology_degree to 2 or more",
        ),
        (["topology_p=1.5"], r"key 'topology_p'.*less than or equal to 1"),
    ],
)
def test_new_and_cross_key_values_name_the_keys(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(None, overrides)
    # A check across keys names them; it never dumps the whole config as "got {...}".
    assert "got {" not in str(info.value)


def test_fault_keys_parse_into_their_types() -> None:
    config = load_config(
        None, ["cut_rounds=[0, 200]", "cut_edges=[[0, 1], [9, 8]]", "clip_multiple=5"]
    )
    assert config.cut_rounds == (0, 200)
    assert config.cut_edges == ((0, 1), (9, 8))
    assert (config.clip_multiple, config.clip_window, config.repair_exchanges) == (5.0, 8, 64)
    assert (config.link_loss, config.link_delay_hops) == (0.0, 1)


def test_eval_clients_above_clients_is_accepted_for_clamping() -> None:
    """The default eval_clients (4) must fit a 2-client run: the simulator evaluates
    min(eval_clients, clients) clients instead of refusing."""
    config = load_config(None, ["clients=2", "n_train=2"])
    assert (config.clients, config.eval_clients) == (2, 4)


def test_rank_above_a_matrix_dimension_names_the_matrix_and_its_shape() -> None:
    model, _ = load_model("tiny", seed=0)
    with pytest.raises(
        DirectionError,
        match=r"key 'rank'.*between 1 and the smallest matrix input dimension \(64\); got 65\. "
        r"Matrix model\.layers\.0\.self_attn\.q_proj\.weight has shape 64x64.*set rank <= 64",
    ):
        make_direction("subcge", model, rank=65, refresh=10, run_seed=0)
    assert make_direction("subcge", model, rank=64, refresh=10, run_seed=0).rank == 64


def run_cli(*overrides: str, config: str = "configs/quickstart.yaml") -> tuple[int, str]:
    args = ["run", config]
    for override in ("model=tiny", "rounds=1", "n_train=16", *overrides):
        args += ["--set", override]
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


def test_run_with_bad_input_exits_2_naming_the_problem(data_dir: Path, tmp_path: Path) -> None:
    code, output = run_cli(config=str(tmp_path / "missing.yaml"))
    assert code == 2 and "config file not found" in output
    code, output = run_cli(f"data_dir={tmp_path / 'nowhere'}")
    assert code == 2 and "nowhere does not exist; expected layout" in output
    edges = tmp_path / "split.txt"
    edges.write_text("0 1\n2 3\n")
    code, output = run_cli("topology=edgelist", f"edgelist={edges}", "clients=4")
    assert code == 2 and "not connected: 2 components of sizes [2, 2]" in output
    assert "add edges joining the components (their first nodes: 0, 2)" in output
    code, output = run_cli(f"data_dir={data_dir}", "rank=100")
    assert code == 2 and "key 'rank'" in output and "set rank <= 64" in output
