"""A single-box Apache Hadoop: ``MiniHadoopClusterManager`` (HDFS + YARN + JobHistory) in one JVM.

    with MiniCluster(find_runtime(), workdir).start() as mc:
        mc.conf_dir        # core-site.xml with the running cluster's full configuration
        mc.namenode_port, mc.rm_web

Start-up: the manager writes ``-writeDetails`` (JSON: namenode and RM ports) only once HDFS and YARN
are up, so that file appearing is the first readiness signal; then we wait until the expected number
of nodemanagers are RUNNING and the datanodes are live. The file ``-writeConfig`` writes is the
manager's own JobConf, which lacks what the YARN side set (framework, staging dir); the RM serves its
full configuration at ``/conf``, so that is what clients get as their ``core-site.xml``.

The manager never exits by itself; ``stop()`` kills it and every process below it (NodeManager
containers run in their own sessions, so a process-group kill is not enough: we walk /proc).

Services listen on loopback: the RM/JHS web and RPC ports the manager would otherwise fix at 8088,
8030, 19888, ... are set to free ports so two clusters, or another service, never collide.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from ...errors import ConfigError, HpcnetError
from ...sockets import free_port
from .budget import MINICLUSTER_START_S
from .runtime import HadoopRuntime, check_loopback_hostname

# Small containers so an AM and two tasks fit on a 2-core, few-GB CI box; C1-only JIT and serial GC
# because container JVMs live for seconds (measured: a 10k-row teragen went from 60 s to 29 s with
# these plus uber mode). Every key can be overridden per configuration.
SMALL_BOX = {
    "yarn.nodemanager.resource.memory-mb": "3072",
    "yarn.nodemanager.resource.cpu-vcores": "4",
    "yarn.scheduler.minimum-allocation-mb": "128",
    "yarn.scheduler.maximum-allocation-mb": "1024",
    "yarn.app.mapreduce.am.resource.mb": "384",
    "mapreduce.map.memory.mb": "256",
    "mapreduce.reduce.memory.mb": "256",
    "yarn.app.mapreduce.am.command-opts": "-Xmx300m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "mapreduce.map.java.opts": "-Xmx200m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "mapreduce.reduce.java.opts": "-Xmx200m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "mapreduce.task.io.sort.mb": "32",
    "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "99.5",
    "yarn.nodemanager.vmem-check-enabled": "false",
    "dfs.replication": "2",
    "mapreduce.job.ubertask.enable": "true",   # one-reduce-or-fewer small jobs run in the AM JVM
}

# Hadoop's polls are paced for long jobs on big clusters: the client asks whether its job is done every
# 5 s and for progress every 1 s, the AM and the nodemanagers heartbeat to the RM every 1 s. A test job
# lasts seconds, so each of these waits is a share of it (measured on a 2-core box, 8 small TeraGens on
# one MiniCluster: 21.7 s a job on average with them, 17.4 s with these, 13.6 s with uber mode as well).
SHORT_POLLS = {
    "mapreduce.client.completion.pollinterval": "200",
    "mapreduce.client.progressmonitor.pollinterval": "200",
    "yarn.app.mapreduce.am.scheduler.heartbeat.interval-ms": "200",
    "yarn.resourcemanager.nodemanagers.heartbeat-interval-ms": "200",
}

# Keys whose fixed defaults (8088, 8030, ...) the manager would use; each gets a free loopback port.
PORT_KEYS = ("yarn.resourcemanager.webapp.address", "yarn.resourcemanager.scheduler.address",
             "yarn.resourcemanager.resource-tracker.address", "yarn.resourcemanager.admin.address",
             "mapreduce.jobhistory.webapp.address", "mapreduce.jobhistory.admin.address")


class MiniClusterError(HpcnetError, RuntimeError):
    """The MiniCluster did not start or stopped serving; the message ends with its log's tail."""


def read_hadoop_xml(path: str | os.PathLike) -> dict[str, str]:
    """A Hadoop configuration file as {name: value}."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise ConfigError(f"cannot read Hadoop configuration: {e}", str(path)) from None
    return {p.findtext("name"): p.findtext("value") or "" for p in root.iter("property") if p.findtext("name")}


def write_hadoop_xml(path: str | os.PathLike, conf: dict[str, str]) -> None:
    root = ET.Element("configuration")
    for k, v in sorted(conf.items()):
        prop = ET.SubElement(root, "property")
        ET.SubElement(prop, "name").text = k
        ET.SubElement(prop, "value").text = v
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# Configuration loads core-default, core-site, hdfs-default, hdfs-site, mapred-default, mapred-site,
# yarn-default, yarn-site in that order, later files winning: a full configuration in core-site.xml
# alone would lose e.g. mapreduce.framework.name to mapred-default ("local"). The same full file as
# every *-site.xml wins over each default file loaded before it.
SITE_FILES = ("core-site.xml", "hdfs-site.xml", "mapred-site.xml", "yarn-site.xml")


def write_client_conf(conf_dir: str | os.PathLike, conf: dict[str, str], files=SITE_FILES) -> None:
    """A client configuration dir (for the classpath or HADOOP_CONF_DIR) holding ``conf`` in each of
    ``files`` (Ozone's daemons and clients read ``ozone-site.xml`` as well)."""
    for name in files:
        write_hadoop_xml(Path(conf_dir) / name, conf)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (by parent links in /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int, grace: float = 5.0) -> None:
    """SIGTERM ``pid`` and all its descendants (and their process groups), then SIGKILL survivors."""
    kill_trees([pid], grace)


def kill_trees(pids: list[int], grace: float = 5.0) -> None:
    """``kill_tree`` of several processes at once: one grace period for all (a JVM's shutdown hooks take
    seconds, so stopping a deployment's daemons one after another took 40 s)."""
    procs = [q for pid in pids for q in (pid, *descendants(pid))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            for kill in (os.kill, os.killpg):
                try:
                    kill(p, sig)
                except (ProcessLookupError, PermissionError, OSError):
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in procs):
            time.sleep(0.1)
        procs = [p for p in procs if _alive(p)]
        if not procs:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class MiniCluster:
    def __init__(self, runtime: HadoopRuntime, workdir: str | os.PathLike, *, nodemanagers: int = 2,
                 datanodes: int = 2, overrides: dict | None = None, start_timeout: float = MINICLUSTER_START_S,
                 heap: str = "-Xmx1200m"):
        if runtime.jar_dir is None:
            raise ConfigError("the MiniCluster runs from the jar dir, not HADOOP_HOME (a real cluster is "
                              "already running: use its configuration)", "HADOOP_HOME")
        for name, n in (("nodemanagers", nodemanagers), ("datanodes", datanodes)):
            if n < 1:
                raise ConfigError(f"need at least 1, got {n}", name)
        self.runtime, self.workdir = runtime, Path(workdir)
        self.nodemanagers, self.datanodes = nodemanagers, datanodes
        self.settings = {**SMALL_BOX, **SHORT_POLLS, **{k: f"127.0.0.1:{free_port()}" for k in PORT_KEYS},
                         **{k: str(v) for k, v in (overrides or {}).items()}}
        self.start_timeout, self.heap = start_timeout, heap
        self.proc: subprocess.Popen | None = None
        self.details: dict = {}
        self.conf: dict[str, str] = {}
        self.conf_dir = self.workdir / "conf"
        self.log_path = self.workdir / "minicluster.log"
        self._log_seen = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "MiniCluster":
        check_loopback_hostname()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf_dir.mkdir(exist_ok=True)
        written, details = self.workdir / "manager-conf.xml", self.workdir / "details.json"
        for f in (written, details):
            f.unlink(missing_ok=True)
        argv = self.runtime.argv("minicluster", [
            "-format", "-nodemanagers", str(self.nodemanagers), "-datanodes", str(self.datanodes),
            "-writeConfig", str(written), "-writeDetails", str(details)],
            defines=self.settings, jvm_opts=[self.heap])
        # Last line of defence if the caller is interrupted twice (a second Ctrl-C inside stop()).
        atexit.register(self.stop)
        log = open(self.log_path, "wb")
        try:
            # Own session: a Ctrl-C at the terminal does not reach it half-way; stop() kills the tree.
            self.proc = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=self.runtime.program_env("minicluster"))
        finally:
            log.close()
        try:
            self._wait_ready(details, written)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, details: Path, written: Path) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                self.details = json.loads(details.read_text())
                break
            except (OSError, ValueError) as e:    # not there yet, or half written: a loaded box is slow
                self._check_alive("while starting")
                if time.monotonic() > deadline:
                    raise MiniClusterError(f"not up after {self.start_timeout:.0f}s ({details}: {e})"
                                           f"{self._log_tail()}") from None
            time.sleep(1)
        self.conf = read_hadoop_xml(written)
        rm_conf = self.workdir / "rm-conf.xml"
        rm_conf.write_bytes(self._get("/conf", deadline))
        self.conf.update(read_hadoop_xml(rm_conf))
        # The RM's /conf has its own value of a job-side key where YARN's MiniCluster sets one (it turns
        # uber mode off), and jobs take the client's: what we asked for is what the client gets.
        self.conf.update(self.settings)
        write_client_conf(self.conf_dir, self.conf)
        while True:
            running = self.running_nodemanagers()
            if running >= self.nodemanagers:
                return
            self._check_alive("waiting for nodemanagers")
            if time.monotonic() > deadline:
                raise MiniClusterError(f"{running}/{self.nodemanagers} nodemanagers running after "
                                       f"{self.start_timeout:.0f}s{self._log_tail()}")
            time.sleep(1)

    def running_nodemanagers(self) -> int:
        """From the RM's ``RMNMInfo`` JMX bean (its REST pages are shadowed in a one-JVM MiniCluster:
        see yarn.py); ``LiveNodeManagers`` is a JSON list held in a string."""
        try:
            body = json.loads(self._get("/jmx?qry=Hadoop:service=ResourceManager,name=RMNMInfo",
                                        time.monotonic() + 30))
            beans = body.get("beans") or [{}]
            nodes = json.loads(beans[0].get("LiveNodeManagers") or "[]")
            return sum(1 for n in nodes if n.get("State") == "RUNNING")
        except (ValueError, AttributeError, TypeError) as e:
            raise MiniClusterError(f"RM JMX RMNMInfo unreadable: {e}") from None

    def _get(self, path: str, deadline: float) -> bytes:
        url = f"http://{self.settings['yarn.resourcemanager.webapp.address']}{path}"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    return r.read()
            except OSError as e:
                self._check_alive(f"reading {url}")
                if time.monotonic() > deadline:
                    raise MiniClusterError(f"{url}: {e}{self._log_tail()}") from None
                time.sleep(1)

    def _check_alive(self, when: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise MiniClusterError(f"MiniCluster JVM exited (status {code}) {when}{self._log_tail()}")
        if self._main_thread_died():
            raise MiniClusterError(f"MiniCluster's main thread died {when}; its JVM lives on in service "
                                   f"threads but will never be ready{self._log_tail()}")

    def _main_thread_died(self) -> bool:
        """The manager starts everything from its main thread. When that throws (seen: a port another
        process took first) HDFS's threads keep the JVM alive, and waiting would use up the whole
        start-up budget; the log says ``Exception in thread "main"``. Reads only what is new."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, self._log_seen - 64))       # a little overlap: the phrase may straddle reads
                chunk = f.read()
                self._log_seen = f.tell()
        except OSError:
            return False
        return b'Exception in thread "main"' in chunk

    def _log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        interesting = [ln for ln in text if "Exception" in ln or "ERROR" in ln][-5:]
        return f"\n--- {self.log_path} (errors, then last lines) ---\n" + "\n".join(interesting + text[-lines:])

    def stop(self) -> None:
        # The atexit hook stays registered until the tree is gone: a second Ctrl-C arriving inside
        # kill_tree() must not leave the JVM behind (seen: pkill -INT reaching pytest twice).
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc.pid)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        atexit.unregister(self.stop)

    def __enter__(self) -> "MiniCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what clients need -----------------------------------------------------------------------
    @property
    def namenode_port(self) -> int:
        return int(self.details["namenode_port"])

    @property
    def rm_web(self) -> str:
        return f"http://{self.settings['yarn.resourcemanager.webapp.address']}"

    @property
    def default_fs(self) -> str:
        return self.conf.get("fs.defaultFS", f"hdfs://localhost:{self.namenode_port}")

    def describe(self) -> dict:
        return {"nodemanagers": self.nodemanagers, "datanodes": self.datanodes,
                "namenode_port": self.details.get("namenode_port"),
                "resourcemanager_port": self.details.get("resourcemanager_port"), "rm_web": self.rm_web}
