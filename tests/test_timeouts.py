"""``HPCNET_TIMEOUT_SCALE``: the one knob that stretches budgets on slow (emulated) machines."""

import pytest

from pytest_hpcnet import timeouts
from pytest_hpcnet.errors import ConfigError


def test_unset_is_one_and_a_value_multiplies(monkeypatch):
    monkeypatch.delenv(timeouts.ENV, raising=False)
    assert timeouts.scale() == 1 and timeouts.scaled(10) == 10
    monkeypatch.setenv(timeouts.ENV, "4")
    assert timeouts.scaled(10) == 40
    assert timeouts.scale({timeouts.ENV: "2.5"}) == 2.5


@pytest.mark.parametrize("bad", ["fast", "0.5", "nan", "-2"])
def test_a_bad_scale_names_the_variable(bad):
    with pytest.raises(ConfigError, match=r"\$HPCNET_TIMEOUT_SCALE"):
        timeouts.scale({timeouts.ENV: bad})
