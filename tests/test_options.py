"""Which of CLI, env, ini and default wins, and how a bad value names where it came from."""

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.options import BY_NAME, resolve

ROUNDS = BY_NAME["rounds"]
ASSUME = BY_NAME["assume"]


@pytest.mark.parametrize("cli, env, ini, expected, where", [
    ("7", {"HPCNET_ROUNDS": "8"}, "9", 7, "--hpcnet-rounds"),
    (None, {"HPCNET_ROUNDS": "8"}, "9", 8, "$HPCNET_ROUNDS"),
    (None, {}, "9", 9, "hpcnet_rounds in pytest.ini"),
    (None, {}, None, None, "default"),
])
def test_precedence_cli_env_ini_default(cli, env, ini, expected, where):
    assert resolve(ROUNDS, cli, env, ini, "pytest.ini") == (expected, where)


@pytest.mark.parametrize("cli, env, ini, origin", [
    ("x", {}, None, "--hpcnet-rounds"),
    (None, {"HPCNET_ROUNDS": "1"}, None, "$HPCNET_ROUNDS"),
    (None, {}, "two", "hpcnet_rounds in tox.ini"),
])
def test_bad_value_names_its_origin(cli, env, ini, origin):
    with pytest.raises(ConfigError) as e:
        resolve(ROUNDS, cli, env, ini, "tox.ini")
    assert str(e.value).startswith(origin + ":")


def test_list_settings_accept_repeats_and_commas():
    assert resolve(ASSUME, ["ib_qdr", "rdma,lustre"], {})[0] == ["ib_qdr", "rdma", "lustre"]
    assert resolve(ASSUME, [], {"HPCNET_ASSUME": "edr power8"})[0] == ["edr", "power8"]
    assert resolve(ASSUME, [], {})[0] == []


def test_env_int_names_the_variable_of_a_bad_value():
    from pytest_hpcnet.options import env_int
    assert env_int("HPCNET_X", 7, environ={}) == 7
    assert env_int("HPCNET_X", 7, environ={"HPCNET_X": "12"}) == 12
    with pytest.raises(ConfigError, match=r"^\$HPCNET_X: expected a whole number, got '1e3'"):
        env_int("HPCNET_X", 7, environ={"HPCNET_X": "1e3"})
    for bad in ("0", "-5"):     # a count or size of none would make an empty run, or a crash later
        with pytest.raises(ConfigError, match=rf"^\$HPCNET_X: expected a positive whole number, got '{bad}'"):
            env_int("HPCNET_X", 7, environ={"HPCNET_X": bad})
