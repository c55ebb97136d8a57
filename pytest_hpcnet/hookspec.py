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


@hookspec
def pytest_hpcnet_targets():
    """Return target classes to add to the registry for this run (before the target is loaded).

    A target is a stack under test (see :mod:`pytest_hpcnet.targets`): a class with a ``name``,
    ``configurations()`` (the named configurations claims may refer to), ``describe()`` (for the run
    record) and ``workloads(cluster, launchers, workdir)``, which returns a ``targets.Workloads``
    subclass. Its methods (``teragen``, ``terasort``, ``teravalidate``, ``randomwriter``, ``sort``,
    ``sortvalidate``, ``dfsio``, ``rpc_server``, ``rpc_client``) run the suites' workloads on the stack;
    one it does not implement skips the tests that need it, naming the target and the workload. A
    ``job_record(result)`` (a ``targets.JobRecord`` per job) and ``"crosscheck"`` in ``offered`` make
    ``hpcnet crosscheck --target <name>`` work on it. ``--hpcnet-target <name>`` selects it, and the
    conformance suites (``suites/mapreduce``, ``suites/dfsio``, ``suites/rpc``, ``suites/crosscheck``)
    run on it unchanged. A name already taken by another class is refused with a
    one-line error. Example::

        # conftest.py
        import time
        from pathlib import Path

        from pytest_hpcnet.reference.mapreduce.teragen import teragen
        from pytest_hpcnet.targets import WorkloadResult, Workloads


        class TinyWorkloads(Workloads):
            \"\"\"TeraGen only, in this process: every other workload skips, naming itself.\"\"\"
            offered = frozenset({"teragen"})

            def teragen(self, rows, outdir, *, maps=1, start_row=0):
                t0 = time.perf_counter()
                r = teragen(rows, Path(outdir), maps=maps, start_row=start_row)
                return WorkloadResult("teragen", time.perf_counter() - t0, r.rows, {"checksum": r.checksum_hex})


        class TinyTarget:
            \"\"\"A stack whose one workload is TeraGen.\"\"\"
            name = "tiny"

            def configurations(self):
                return {"default": {}}

            def describe(self):
                return {"name": self.name, "version": "1.0"}

            def workloads(self, cluster, launchers, workdir):
                return TinyWorkloads(self, cluster, launchers, workdir)


        def pytest_hpcnet_targets():
            return [TinyTarget]

    A package that ships a target for everyone who installs it names the class under the entry point
    group ``pytest_hpcnet.targets`` instead (the entry point's name is the target's name); it is then
    known to pytest and the ``hpcnet`` command alike, without this hook (``tests/data/
    example_target_plugin`` is such a package)::

        # pyproject.toml of the vendor's package
        [project.entry-points."pytest_hpcnet.targets"]
        tiny = "vendor_hpcnet.target:TinyTarget"
    """
