"""Hooks other plugins and conftest.py files can implement to extend pytest-hpcnet."""

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_hpcnet_record(config, record):
    """Called once per run, on the controller, just before the run record is written.

    ``record`` is a :class:`pytest_hpcnet.results.RunRecord`; add to ``record.provenance`` whatever a
    later reader needs to know about this run (firmware versions, switch settings, ...). Example::

        # conftest.py
        def pytest_hpcnet_record(config, record):
            record.provenance["fabric"] = {"switch": "SX6036", "mtu": 4096}
    """

