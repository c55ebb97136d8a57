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



@hookspec
def pytest_hpcnet_launchers():
    """Return launcher classes to add to the registry for this run (before the cluster is loaded).

    A launcher starts a command on a node and hands back a process handle (see
    :mod:`pytest_hpcnet.cluster.launcher`: ``start(node, argv, *, env=None, cwd=None)`` returns an
    object with ``poll()``, ``wait(timeout)``, ``kill()`` and ``output()``; ``close()`` kills everything
    the launcher started). An inventory selects it by ``name`` (``launcher = "..."`` on a node); a
    ``settings`` dict, if present, declares the keys of its ``[name]`` table in the inventory.
    A name already taken by another class is refused with a one-line error. Example::

        # conftest.py
        from pytest_hpcnet.cluster.launcher import LocalLauncher, node_argv

        class NiceLauncher(LocalLauncher):
            \"\"\"Local processes at a lower CPU priority.\"\"\"
            name = "nice"

            def start(self, node, argv, *, env=None, cwd=None):
                return super().start(node, ["nice", "-n", "10", *node_argv(node, argv)], env=env, cwd=cwd)

        def pytest_hpcnet_launchers():
            return [NiceLauncher]

    A package that ships a launcher for everyone who installs it names the class under the entry
    point group ``pytest_hpcnet.launchers`` instead (the entry point's name is the launcher's name);
    it is then known to pytest, the ``hpcnet`` command and asv alike, without this hook::

        # pyproject.toml of the vendor's package
        [project.entry-points."pytest_hpcnet.launchers"]
        nice = "vendor_hpcnet.launch:NiceLauncher"
    """
