"""HDFS, YARN and Ozone as separate daemons on a cluster's nodes, started from the jars.

The seed's shape (002: storage on some nodes, YARN on others): the first half of the nodes are storage
nodes (the NameNode on the first, a DataNode on each), the rest run YARN (ResourceManager and the
JobHistoryServer on the first, a NodeManager on each); one node holds everything. Each Ozone layout is
a deployment of its own, started when a configuration first needs it (a layout is a datanode's setting,
and the seed deployed each afresh): SCM and Ozone Manager on one storage node, an Ozone datanode on
each. Jobs are submitted from the controller with a client configuration dir (``conf_dir``) as on a
real cluster, and YARN's records are read over its REST API (``rm_web``).

Every daemon listens on its node's address (a netns node's own, or loopback) on a port picked free on
the controller. ``close()`` stops every JVM this deployment started, containers included.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from ...sockets import free_port
from ..hadoop.jobs import run_program
from ..hadoop.minicluster import SHORT_POLLS, SMALL_BOX, kill_trees, write_client_conf
from ..hadoop.runtime import JAVA17_OPENS
from .daemons import Daemon, DaemonError

START_S = 600            # every daemon of one deployment up (a loaded 2-core box starts ~10 JVMs slowly)
VOLUME, BUCKET = "hpcnet", "jobs"
# Ozone's jars carry no log4j configuration: without one, what a daemon logs goes nowhere, and an SCM
# --init that exits 1 leaves only log4j's own warnings in its log. Warnings and errors go to stderr,
# which is the daemon's log file.
OZONE_LOG4J = """log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=%d{ISO8601} %-5p %c{1}: %m%n
"""
SITE_FILES = ("core-site.xml", "hdfs-site.xml", "mapred-site.xml", "yarn-site.xml", "ozone-site.xml")

MAIN = {
    "namenode": "org.apache.hadoop.hdfs.server.namenode.NameNode",
    "datanode": "org.apache.hadoop.hdfs.server.datanode.DataNode",
    "resourcemanager": "org.apache.hadoop.yarn.server.resourcemanager.ResourceManager",
    "nodemanager": "org.apache.hadoop.yarn.server.nodemanager.NodeManager",
    "historyserver": "org.apache.hadoop.mapreduce.v2.hs.JobHistoryServer",
    "scm": "org.apache.hadoop.hdds.scm.server.StorageContainerManagerStarter",
    "om": "org.apache.hadoop.ozone.om.OzoneManagerStarter",
    "ozone-datanode": "org.apache.hadoop.ozone.HddsDatanodeService",
}

# Ozone's defaults wait for a cluster of 3+ datanodes and minutes-long intervals; on a small cluster
# each of these would hold the first write back by minutes.
OZONE_SMALL = {
    "ozone.replication": "1", "ozone.server.default.replication": "1",
    "hdds.scm.safemode.min.datanode": "1", "hdds.scm.wait.time.after.safemode.exit": "5s",
    "ozone.scm.pipeline.creation.interval": "5s", "hdds.heartbeat.interval": "2s",
    "ozone.scm.stale.node.interval": "60s", "ozone.scm.dead.node.interval": "120s",
    "ozone.security.enabled": "false", "ozone.acl.enabled": "false",
    "hdds.datanode.dir.du.reserved.percent": "0",
}


def _opts(heap: str) -> str:
    return " ".join([heap, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *JAVA17_OPENS])


def placement(nodes) -> tuple[list, list]:
    """(storage nodes, YARN nodes): the first half and the rest; one node does both."""
    nodes = list(nodes)
    if len(nodes) == 1:
        return nodes, nodes
    half = (len(nodes) + 1) // 2
    return nodes[:half], nodes[half:]


class Deployment:
    def __init__(self, hadoop_rt, ozone_jars: Path, cluster, launchers, workdir: Path, *,
                 start_timeout: float = START_S):
        self.hadoop_rt, self.ozone_jars = hadoop_rt, Path(ozone_jars).resolve()
        self.cluster, self.launchers, self.workdir = cluster, launchers, Path(workdir)
        self.storage, self.yarn = placement(cluster.nodes)
        self.start_timeout = start_timeout
        self.daemons: list[Daemon] = []
        self.ozone: dict[str, dict] = {}        # layout -> {"om": (host, port)}
        self.conf: dict[str, str] = {}
        self.conf_dir = self.workdir / "client-conf"
        self.rm_web = ""
        self.started_s: dict[str, float] = {}
        self.retried: list[str] = []   # Ozone starts that failed once and were tried again

    # -- the configuration ---------------------------------------------------------------------------
    def classpath_for_jobs(self) -> str:
        """What MapReduce containers and clients load: the client configuration, Hadoop's jars and
        Ozone's file system (the shaded jar for Hadoop 3)."""
        fs_jar = sorted(self.ozone_jars.glob("ozone-filesystem-hadoop3-*.jar"))
        return ",".join([str(self.conf_dir), f"{self.hadoop_rt.jar_dir}/*", *map(str, fs_jar[-1:])])

    def _base_conf(self) -> dict[str, str]:
        nn, rm = self.storage[0].address(), self.yarn[0].address()
        cp = self.classpath_for_jobs()
        return {
            **SMALL_BOX, **SHORT_POLLS, **OZONE_SMALL,
            "mapreduce.job.ubertask.enable": "false",      # a real cluster's jobs run in containers
            "fs.defaultFS": f"hdfs://{nn}:{free_port()}",
            "fs.ofs.impl": "org.apache.hadoop.fs.ozone.RootedOzoneFileSystem",
            "fs.AbstractFileSystem.ofs.impl": "org.apache.hadoop.fs.ozone.RootedOzFs",
            "dfs.replication": "1", "dfs.permissions.enabled": "false",
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            "dfs.namenode.http-address": f"{nn}:{free_port()}",
            "yarn.resourcemanager.hostname": rm,
            **{f"yarn.resourcemanager.{k}": f"{rm}:{free_port()}" for k in (
                "address", "webapp.address", "scheduler.address", "resource-tracker.address", "admin.address")},
            "mapreduce.jobhistory.address": f"{rm}:{free_port()}",
            "mapreduce.jobhistory.webapp.address": f"{rm}:{free_port()}",
            "mapreduce.jobhistory.admin.address": f"{rm}:{free_port()}",
            "mapreduce.framework.name": "yarn",
            "yarn.app.mapreduce.am.staging-dir": "/tmp/hadoop-yarn/staging",
            "mapreduce.application.classpath": cp, "yarn.application.classpath": cp,
            "yarn.nodemanager.aux-services": "mapreduce_shuffle",
            "yarn.nodemanager.aux-services.mapreduce_shuffle.class": "org.apache.hadoop.mapred.ShuffleHandler",
            "yarn.nodemanager.env-whitelist": "JAVA_HOME,HADOOP_COMMON_HOME,HADOOP_HDFS_HOME,HADOOP_CONF_DIR,"
                                              "CLASSPATH_PREPEND_DISTCACHE,HADOOP_YARN_HOME,HADOOP_MAPRED_HOME",
            "yarn.app.mapreduce.am.command-opts": _opts("-Xmx300m"),
            "mapreduce.map.java.opts": _opts("-Xmx200m"), "mapreduce.reduce.java.opts": _opts("-Xmx200m"),
        }

    def _write_conf(self, where: Path, conf: dict) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        write_client_conf(where, conf, SITE_FILES)
        return where

    def _daemon(self, name: str, node, jars: Path, conf: dict, *, ready, args=(), heap="-Xmx256m",
                role: str | None = None) -> Daemon:
        """A daemon with its own configuration dir (the shared keys plus its node's) under its work dir."""
        home = Path(node.workdir) / "daemons" / name
        conf_dir = self._write_conf(home / "conf", {"hadoop.tmp.dir": str(home / "tmp"), **conf})
        if jars == self.ozone_jars:
            (conf_dir / "log4j.properties").write_text(OZONE_LOG4J)
        argv = [self.hadoop_rt.java, heap, "-Djava.net.preferIPv4Stack=true", *JAVA17_OPENS,
                "-Dhadoop.log.dir=" + str(home / "logs"), "-cp", ":".join([str(conf_dir), *self._daemon_jars(jars)]), MAIN[role or name.split("@")[0]],
                *args]
        env = {"JAVA_HOME": str(Path(self.hadoop_rt.java).resolve().parents[1]), "HADOOP_CONF_DIR": str(conf_dir)}
        return Daemon(name, node, argv, log=home / f"{name}.log", ready=ready, env=env)

    def _daemon_jars(self, jars: Path) -> list[str]:
        """A daemon's jars. Ozone's: its jar dir without Ozone's shaded client file system, whose bundled
        copies of Ratis and HDDS classes clash with the servers' own (NoSuchMethodError in SCM's --init).
        Hadoop's: its jar dir and the client jars (a NodeManager localizes a job's files from ofs://,
        TeraSort's partition list, in a JVM with its own classpath)."""
        if any(Path(jars).glob("ozone-filesystem-hadoop3-*.jar")):
            return sorted(str(j) for j in Path(jars).glob("*.jar") if not j.name.startswith("ozone-filesystem-"))
        return [f"{jars}/*", *self.hadoop_rt.extra_jars]

    def _run(self, daemon: Daemon) -> Daemon:
        self.daemons.append(daemon)
        return daemon.start(self.launchers)

    # -- HDFS and YARN ------------------------------------------------------------------------------
    def start(self) -> "Deployment":
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        self.conf = self._base_conf()
        self._write_conf(self.conf_dir, self.conf)
        jars = self.hadoop_rt.jar_dir
        nn_node = self.storage[0]
        nn_addr = self.conf["fs.defaultFS"].split("//", 1)[1]
        host, port = nn_addr.rsplit(":", 1)
        nn_conf = {**self.conf, "dfs.namenode.rpc-address": nn_addr,
                   "dfs.namenode.name.dir": str(Path(nn_node.workdir) / "daemons" / "namenode" / "name")}
        fmt = self._run(self._daemon("namenode", nn_node, jars, nn_conf, ready=None,
                                     args=["-format", "-force", "-nonInteractive"]))
        fmt.wait_exit(self.start_timeout)
        self.daemons.remove(fmt)
        started = [self._run(self._daemon("namenode", nn_node, jars, nn_conf, ready=(host, int(port)),
                                          heap="-Xmx384m"))]
        for i, node in enumerate(self.storage):
            h = node.address()
            dn_port = free_port()
            started.append(self._run(self._daemon(f"datanode@{i}", node, jars, {
                **self.conf, "dfs.datanode.hostname": h, "dfs.datanode.address": f"{h}:{dn_port}",
                "dfs.datanode.http.address": f"{h}:{free_port()}", "dfs.datanode.ipc.address": f"{h}:{free_port()}",
                "dfs.datanode.data.dir": str(Path(node.workdir) / "daemons" / f"datanode@{i}" / "data")},
                ready=(h, dn_port))))
        rm_node = self.yarn[0]
        rm_host, rm_port = self.conf["yarn.resourcemanager.address"].rsplit(":", 1)
        started.append(self._run(self._daemon("resourcemanager", rm_node, jars, self.conf,
                                              ready=(rm_host, int(rm_port)), heap="-Xmx384m")))
        for i, node in enumerate(self.yarn):
            h = node.address()
            nm_port = free_port()
            home = Path(node.workdir) / "daemons" / f"nodemanager@{i}"
            started.append(self._run(self._daemon(f"nodemanager@{i}", node, jars, {
                **self.conf, "yarn.nodemanager.hostname": h, "yarn.nodemanager.address": f"{h}:{nm_port}",
                "yarn.nodemanager.localizer.address": f"{h}:{free_port()}",
                "yarn.nodemanager.webapp.address": f"{h}:{free_port()}", "mapreduce.shuffle.port": str(free_port()),
                "yarn.nodemanager.local-dirs": str(home / "local"), "yarn.nodemanager.log-dirs": str(home / "userlogs")},
                ready=(h, nm_port))))
        for d in started:
            d.wait_ready(deadline)
        jhs_host, jhs_port = self.conf["mapreduce.jobhistory.address"].rsplit(":", 1)
        jhs = self._run(self._daemon("historyserver", rm_node, jars, self.conf, ready=(jhs_host, int(jhs_port))))
        jhs.wait_ready(deadline)
        self.rm_web = f"http://{self.conf['yarn.resourcemanager.webapp.address']}"
        self._wait_nodemanagers(deadline)
        self.started_s["hdfs+yarn"] = time.monotonic() - t0
        return self

    def _wait_nodemanagers(self, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(f"{self.rm_web}/ws/v1/cluster/metrics", timeout=5) as r:
                    if json.load(r)["clusterMetrics"]["activeNodes"] >= len(self.yarn):
                        return
            except (OSError, ValueError, KeyError):
                pass
            for d in self.daemons:
                d.check_alive()
            if time.monotonic() > deadline:
                raise DaemonError(f"resourcemanager on {self.yarn[0].name}: fewer than {len(self.yarn)} "
                                  f"NodeManagers registered in {self.start_timeout:.0f} s (logs under "
                                  f"{Path(self.yarn[0].workdir) / 'daemons'})")
            time.sleep(1)

    # -- Ozone, one deployment per layout -----------------------------------------------------------
    def ozone_root(self, layout: str) -> str:
        """``ofs://<om>/<volume>/<bucket>`` of the Ozone deployment with ``layout``, started on first use."""
        if layout not in self.ozone:
            self.ozone[layout] = self._start_ozone_twice(layout)
            host, port = self.ozone[layout]["om"]
            # the volume and its bucket, made through the ofs:// client as a user would
            run_program(self.hadoop_rt, "fs", ["-mkdir", "-p", f"ofs://{host}:{port}/{VOLUME}/{BUCKET}"],
                        conf_dir=self.conf_dir, timeout=self.start_timeout)
        host, port = self.ozone[layout]["om"]
        return f"ofs://{host}:{port}/{VOLUME}/{BUCKET}"

    def _start_ozone_twice(self, layout: str) -> dict:
        """``_start_ozone``, and once more on fresh ports if that fails: a fresh-clone CI run here saw
        SCM's --init exit 1 (Hadoop's JVMs beside it on two cores) and the same init pass on the next
        try. The first failure is kept in ``describe()``; a second one is raised."""
        first = len(self.daemons)
        try:
            return self._start_ozone(layout)
        except DaemonError as e:
            for d in reversed(self.daemons[first:]):
                d.stop()
            del self.daemons[first:]
            self.retried.append(f"ozone {layout}: {str(e).splitlines()[0]}")
            return self._start_ozone(layout)

    def _start_ozone(self, layout: str) -> dict:
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        tag = layout.lower().replace("_", "-")
        meta_node = self.storage[len(self.ozone) % len(self.storage)]
        h = meta_node.address()
        ports = {k: free_port() for k in ("scm.client", "scm.block", "scm.datanode", "scm.http", "scm.ratis",
                                         "scm.grpc", "scm.security", "om", "om.http", "om.ratis")}
        conf = {
            **self.conf, "ozone.scm.container.layout": layout,
            "ozone.scm.names": h, "ozone.scm.client.address": f"{h}:{ports['scm.client']}",
            "ozone.scm.block.client.address": f"{h}:{ports['scm.block']}",
            "ozone.scm.datanode.address": f"{h}:{ports['scm.datanode']}",
            "ozone.scm.datanode.port": str(ports["scm.datanode"]),
            "ozone.scm.http-address": f"{h}:{ports['scm.http']}", "ozone.scm.ratis.port": str(ports["scm.ratis"]),
            "ozone.scm.grpc.port": str(ports["scm.grpc"]),
            "ozone.scm.security.service.address": f"{h}:{ports['scm.security']}",
            "ozone.om.address": f"{h}:{ports['om']}", "ozone.om.http-address": f"{h}:{ports['om.http']}",
            "ozone.om.ratis.port": str(ports["om.ratis"]),
        }
        jars = self.ozone_jars

        def meta(name):
            home = Path(meta_node.workdir) / "daemons" / f"{name}-{tag}"
            return {**conf, "ozone.metadata.dirs": str(home / "meta"), "ozone.scm.datanode.id.dir": str(home / "id")}

        scm_conf, om_conf = meta("scm"), meta("om")
        init = self._run(self._daemon(f"scm-{tag}-init", meta_node, jars, scm_conf, ready=None, args=["--init"], role="scm"))
        init.wait_exit(self.start_timeout)
        scm = self._run(self._daemon(f"scm-{tag}", meta_node, jars, scm_conf, ready=(h, ports["scm.client"]), role="scm"))
        scm.wait_ready(deadline)
        init = self._run(self._daemon(f"om-{tag}-init", meta_node, jars, om_conf, ready=None, args=["--init"], role="om"))
        init.wait_exit(self.start_timeout)
        om = self._run(self._daemon(f"om-{tag}", meta_node, jars, om_conf, ready=(h, ports["om"]), role="om"))
        started = [scm, om]
        for i, node in enumerate(self.storage):
            dh = node.address()
            home = Path(node.workdir) / "daemons" / f"ozone-datanode-{tag}@{i}"
            dport = free_port()
            started.append(self._run(self._daemon(f"ozone-datanode-{tag}@{i}", node, jars, {
                **conf, "ozone.metadata.dirs": str(home / "meta"), "ozone.scm.datanode.id.dir": str(home / "id"),
                "hdds.datanode.dir": str(home / "data"), "hdds.datanode.hostname": dh,
                "hdds.container.ipc.port": str(dport), "hdds.container.ratis.ipc.port": str(free_port()),
                "hdds.container.ratis.admin.port": str(free_port()),
                "hdds.container.ratis.server.port": str(free_port()),
                "hdds.container.ratis.datastream.port": str(free_port()),
                "hdds.datanode.http-address": f"{dh}:{free_port()}",
                "hdds.datanode.client.address": f"{dh}:{free_port()}",
                "hdds.datanode.replication.port": str(free_port())}, ready=(dh, dport), role="ozone-datanode")))
        for d in started:
            d.wait_ready(deadline)
        self.started_s[f"ozone {layout}"] = time.monotonic() - t0
        return {"om": (h, ports["om"])}

    def close(self) -> None:
        # every daemon's JVM told to stop at once, then each daemon's launcher cleans up after it
        kill_trees([d.proc.pid for d in self.daemons if d.proc is not None and d.proc.poll() is None])
        for d in reversed(self.daemons):
            d.stop()
        self.daemons.clear()
        self.ozone.clear()

    def describe(self) -> dict:
        return {"daemons": [f"{d.name} on {d.node.name} ({d.node.address()})" for d in self.daemons],
                "start_s": {k: round(v, 1) for k, v in self.started_s.items()}, "rm_web": self.rm_web,
                "retried": list(self.retried)}
