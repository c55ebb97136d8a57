"""Where Hadoop comes from and how its programs are started.

Two ways to have Hadoop:

- a *jar dir* (``HPCNET_HADOOP_JARS``, default ``<repo>/.cache/hadoop``) filled by the Maven pom in
  ``targets/hadoop/``: every program runs as ``java -cp '<dir>/*' <main class>``;
- a real installation (``HADOOP_HOME``): programs run through ``$HADOOP_HOME/bin/hadoop jar ...`` with
  the examples and test jars from ``share/hadoop/``, so whatever the site configured (an RDMA build,
  its IB switch) applies.

``HadoopUnavailable`` says why neither can be used (no java, no jars): tests skip with that reason.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import HpcnetError

REPO = Path(__file__).resolve().parents[3]
DEFAULT_JAR_DIR = REPO / ".cache" / "hadoop"
HADOOP_VERSION = "3.4.2"   # what targets/hadoop/pom.xml fetches

# Hadoop 3.4 reflects into JDK internals (UGI, the NativeIO/cleaner paths, Kerberos helpers). On Java
# 17 those packages are closed unless opened; without them the MiniCluster and the tasks fail with
# InaccessibleObjectException. The same flags go to the MR containers (AM, maps, reduces).
JAVA17_OPENS = tuple(f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in (
    "java.lang", "java.lang.reflect", "java.io", "java.net", "java.nio", "java.util",
    "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
    "sun.security.action", "sun.util.calendar")) + (
    "--add-opens=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.dns=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED")


class HadoopUnavailable(HpcnetError):
    """Hadoop cannot run here (no Java, no jars, no HADOOP_HOME); the message says what is missing."""


@dataclass(frozen=True)
class Program:
    """A Hadoop program: its main class (jar-dir mode) and how ``hadoop jar`` names it."""
    main_class: str
    jar: str | None = None        # glob under $HADOOP_HOME/share/hadoop, None = on hadoop's classpath
    driver_name: str | None = None


PROGRAMS = {
    "teragen": Program("org.apache.hadoop.examples.terasort.TeraGen",
                       "mapreduce/hadoop-mapreduce-examples-*.jar", "teragen"),
    "terasort": Program("org.apache.hadoop.examples.terasort.TeraSort",
                        "mapreduce/hadoop-mapreduce-examples-*.jar", "terasort"),
    "teravalidate": Program("org.apache.hadoop.examples.terasort.TeraValidate",
                            "mapreduce/hadoop-mapreduce-examples-*.jar", "teravalidate"),
    "randomwriter": Program("org.apache.hadoop.examples.RandomWriter",
                            "mapreduce/hadoop-mapreduce-examples-*.jar", "randomwriter"),
    "sort": Program("org.apache.hadoop.examples.Sort", "mapreduce/hadoop-mapreduce-examples-*.jar", "sort"),
    "sortvalidate": Program("org.apache.hadoop.mapred.SortValidator",
                            "mapreduce/hadoop-mapreduce-client-jobclient-*-tests.jar", "testmapredsort"),
    "TestDFSIO": Program("org.apache.hadoop.fs.TestDFSIO",
                         "mapreduce/hadoop-mapreduce-client-jobclient-*-tests.jar", "TestDFSIO"),
    "minicluster": Program("org.apache.hadoop.mapreduce.MiniHadoopClusterManager",
                           "mapreduce/hadoop-mapreduce-client-jobclient-*-tests.jar", "minicluster"),
    "RPCCallBenchmark": Program("org.apache.hadoop.ipc.RPCCallBenchmark",
                                "common/hadoop-common-*-tests.jar"),
    "fs": Program("org.apache.hadoop.fs.FsShell"),
    "application": Program("org.apache.hadoop.yarn.client.cli.ApplicationCLI"),   # `yarn application`
}

# A jar dir must hold these (globs) for the programs above to load.
REQUIRED_JARS = ("hadoop-mapreduce-examples-*.jar", "hadoop-mapreduce-client-jobclient-*-tests.jar",
                 "hadoop-common-*-tests.jar", "hadoop-minicluster-*.jar", "hadoop-yarn-server-tests-*-tests.jar",
                 "hadoop-hdfs-*-tests.jar")


@dataclass
class HadoopRuntime:
    java: str
    jar_dir: Path | None = None
    hadoop_home: Path | None = None
    heap: str = "-Xmx512m"
    env: dict = field(default_factory=dict)
    # jars a client needs beside Hadoop's own (Ozone's ofs:// file system): last on the classpath, and
    # in HADOOP_CLASSPATH on a real installation
    extra_jars: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        return "jars" if self.jar_dir is not None else "hadoop_home"

    def classpath(self, conf_dir=None) -> str:
        """Jar-dir mode: the configuration dir (its core-site.xml) first, then every jar."""
        return ":".join(filter(None, [str(conf_dir) if conf_dir else "", f"{self.jar_dir}/*", *self.extra_jars]))

    def java_opts(self) -> list[str]:
        return [self.heap, "-Djava.net.preferIPv4Stack=true", *JAVA17_OPENS]

    def argv(self, program: str, args: list[str], *, conf_dir: str | os.PathLike | None = None,
             defines: dict | None = None, jvm_opts: list[str] | None = None) -> list[str]:
        """The command that runs ``program`` with the generic ``-D`` options first. The cluster's
        configuration comes from ``conf_dir`` (on the classpath; HADOOP_CONF_DIR in ``program_env``)."""
        if program not in PROGRAMS:
            raise HadoopUnavailable(f"unknown Hadoop program {program!r} (known: {', '.join(PROGRAMS)})")
        p = PROGRAMS[program]
        args = [str(a) for a in args]
        generic = [a for k, v in (defines or {}).items() for a in ("-D", f"{k}={v}")]
        if self.jar_dir is not None:
            return [self.java, *self.java_opts(), *(jvm_opts or []), "-cp", self.classpath(conf_dir),
                    p.main_class, *generic, *args]
        hadoop = str(self.hadoop_home / "bin" / "hadoop")
        if program == "fs":
            return [hadoop, "fs", *generic, *args]
        if program == "application":
            return [str(self.hadoop_home / "bin" / "yarn"), *args]   # args start with "application"
        if p.driver_name is None:         # a class on the classpath (HADOOP_CLASSPATH holds its jar)
            return [hadoop, p.main_class, *generic, *args]
        return [hadoop, "jar", self.share_jar(p.jar), p.driver_name, *generic, *args]

    def program_env(self, program: str, conf_dir: str | os.PathLike | None = None) -> dict:
        env = dict(os.environ, **self.env)
        if self.hadoop_home is not None and conf_dir:
            env["HADOOP_CONF_DIR"] = str(conf_dir)
        if self.hadoop_home is not None:
            own = [self.share_jar(PROGRAMS[program].jar)] \
                if PROGRAMS[program].driver_name is None and PROGRAMS[program].jar else []
            if own or self.extra_jars:
                env["HADOOP_CLASSPATH"] = ":".join(filter(None, [env.get("HADOOP_CLASSPATH"), *own, *self.extra_jars]))
        return env

    def share_jar(self, pattern: str) -> str:
        found = sorted(glob.glob(str(self.hadoop_home / "share" / "hadoop" / pattern)))
        if not found:
            raise HadoopUnavailable(f"HADOOP_HOME={self.hadoop_home}: no share/hadoop/{pattern}")
        return found[-1]

    def describe(self) -> dict:
        return {"mode": self.mode, "java": self.java, "java_version": java_version(self.java),
                "jar_dir": str(self.jar_dir) if self.jar_dir else None,
                "hadoop_home": str(self.hadoop_home) if self.hadoop_home else None,
                "hadoop_version": hadoop_version(self.jar_dir) if self.jar_dir else None}


def java_version(java: str) -> str:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError as e:
        return f"unknown ({e})"
    return out.splitlines()[0] if out else "unknown"


def hadoop_version(jar_dir: Path) -> str | None:
    found = sorted(Path(jar_dir).glob("hadoop-common-*.jar"))
    for jar in found:
        name = jar.name[len("hadoop-common-"):-len(".jar")]
        if not name.endswith("-tests"):
            return name
    return None


def find_java(env=os.environ) -> str:
    home = env.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH", os.defpath))
    if not java or not os.access(java, os.X_OK):
        raise HadoopUnavailable("no java: set JAVA_HOME or put java on PATH (Hadoop 3.4 needs Java 8-17)")
    return java


def check_loopback_hostname() -> None:
    """The MiniCluster advertises its services under this host's name; they must stay on loopback."""
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
    except OSError as e:
        raise HadoopUnavailable(f"host name {name!r} does not resolve ({e}); the MiniCluster needs it") from None
    if not addr.startswith("127."):
        raise HadoopUnavailable(f"host name {name!r} resolves to {addr}, not loopback; the MiniCluster "
                                "would serve on it (map the name to 127.0.0.1 in /etc/hosts)")


def find_runtime(env=os.environ, jar_dir: str | os.PathLike | None = None) -> HadoopRuntime:
    """HADOOP_HOME when set (a real installation), else the jar dir; HadoopUnavailable otherwise."""
    if jar_dir is None and env.get("HADOOP_HOME"):
        home = Path(env["HADOOP_HOME"])
        if not (home / "bin" / "hadoop").exists():
            raise HadoopUnavailable(f"HADOOP_HOME={home}: no bin/hadoop there")
        return HadoopRuntime(java=find_java(env), hadoop_home=home)
    where = Path(jar_dir or env.get("HPCNET_HADOOP_JARS") or DEFAULT_JAR_DIR)
    missing = [p for p in REQUIRED_JARS if not any(where.glob(p))]
    if missing:
        raise HadoopUnavailable(f"Hadoop jars missing in {where} ({', '.join(missing)}); fetch them with "
                                f"`make hadoop-jars` (mvn -f targets/hadoop/pom.xml dependency:copy-dependencies "
                                f"-DoutputDirectory={where})")
    return HadoopRuntime(java=find_java(env), jar_dir=where.resolve())
