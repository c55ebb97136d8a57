"""The engine's driver: starts one worker per node, hands out tasks, survives lost workers.

The driver runs in the calling process (the controller). ``Engine.start()`` opens a control socket on
the controller's address on the cluster's network (``cluster.controller``: loopback for ``local:N``,
the bridge's port for ``netns:N``, the inventory's or a derived address for real clusters), launches ``python -m ...engine.worker`` on every node through the cluster's launchers and waits for
each worker's hello. Jobs (``jobs.py``) then call ``run_map_only`` or ``run_mapreduce``.

Scheduling: one task at a time per worker, first come first served. A worker is *lost* when its
process exits, its control connection closes, or no heartbeat arrives for ``heartbeat_timeout``
seconds. A lost worker's running task goes back in the queue, and so do the completed maps whose
output lived in that node's local dir (Hadoop re-runs those too: nobody else can serve them); map
output in the shared dir stays valid and another worker's shuffle server serves it. Every task has
``max_attempts`` attempts (counted when dispatched; a reduce that failed only because the node it
fetched from died gets its attempt back). When a task runs out of attempts, or no worker is left, the
job raises ``JobFailed``; the output commit (``records.committed_output``) then removes the temporary
output, so a failed job leaves no ``_SUCCESS`` and no partial output.

Phase times of a map-reduce job: ``map`` = wall time of the map rounds, ``shuffle`` = the longest
time any reduce spent getting its segments, ``reduce`` = wall time of the reduce rounds minus
``shuffle`` (merge + write). A reduce starts after all maps are done (no slow start), so the three
add up to the job's time apart from sampling and commit.
"""

from __future__ import annotations

import collections
import hmac
import json
import secrets
import selectors
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ....errors import ConfigError, HpcnetError, LaunchError
from ... import auth
from .config import EngineConfig, check_runnable, parse_config
from .protocol import TOKEN_ENV, Channel, ProtocolError

WORKER_MODULE = "pytest_hpcnet.reference.mapreduce.engine.worker"
JOB_ROOT = "hpcnet-mr"
HELLO_TIMEOUT = auth.HANDSHAKE_TIMEOUT   # a connection must authenticate and say hello by then
MAX_PENDING_HELLOS = 256


class JobFailed(HpcnetError):
    """A job could not finish: a task ran out of attempts or every worker was lost."""


@dataclass
class Task:
    kind: str                   # "map", "reduce", "cleanup"
    index: int
    op: str
    args: dict
    pin: str | None = None      # run only on this node (cleanup)
    attempts: int = 0
    refunds: int = 0            # attempts given back because a source node died (bounded by #workers)
    last_error: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    dispatched: float = 0.0     # time.monotonic() of the current attempt's dispatch

    def label(self) -> str:
        return f"{self.kind} task {self.index}"


@dataclass
class WorkerHandle:
    node: object
    proc: object
    sock: socket.socket | None = None
    channel: Channel | None = None
    shuffle: dict = field(default_factory=dict)
    last_seen: float = 0.0
    task: Task | None = None
    alive: bool = False
    lost_reason: str = ""
    token: str = ""             # the launch's secret token; the worker's hello must carry it

    @property
    def name(self) -> str:
        return self.node.name


@dataclass
class JobResult:
    job: str
    config: str
    seconds: float
    phases: dict[str, float]
    records: int = 0
    output: Path | None = None
    details: dict = field(default_factory=dict)
    attempts: int = 0           # task attempts dispatched (maps + reduces)
    lost_workers: list[str] = field(default_factory=list)
    id: str = ""                # the engine's id of the job (a map-reduce job's dir is named after it)
    slot_seconds: float = 0.0   # see Engine.slot_seconds


@dataclass
class _Pending:
    """A control connection that has not said a valid hello yet."""
    sock: socket.socket
    channel: Channel
    hs: "auth.ServerHandshake"
    deadline: float


def controller_host(cluster, network: str = "eth") -> str:
    """Where the workers reach this process on ``network``; loopback only when every node is local."""
    address = getattr(cluster, "controller", {}).get(network)
    if address:
        return address
    if all(n.launcher == "local" for n in cluster.nodes):
        return "127.0.0.1"
    raise ConfigError(f"cluster {cluster.name!r} names no controller address on network {network!r}, and "
                      f"its nodes ({', '.join(n.name for n in cluster.nodes)}) are not all on this host: "
                      f"set [cluster] controller = {{ {network} = \"...\" }} in the inventory",
                      "engine driver")


class Engine:
    """Workers on a cluster's nodes and the driver loop that feeds them (a context manager)."""

    def __init__(self, cluster, launchers, *, nodes=None, max_attempts: int = 4,
                 heartbeat_timeout: float = 10.0, start_timeout: float = 60.0,
                 driver_host: str | None = None, network: str = "eth", job_timeout: float = 900.0,
                 impl: str | None = None):
        if max_attempts < 1:
            raise HpcnetError(f"max_attempts must be >= 1, got {max_attempts}")
        self.cluster, self.launchers = cluster, launchers
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        if not self.nodes:
            raise HpcnetError(f"cluster {cluster.name!r} has no nodes to run workers on")
        self.max_attempts, self.heartbeat_timeout = max_attempts, heartbeat_timeout
        self.start_timeout = start_timeout
        self.driver_host = driver_host or controller_host(cluster, network)
        self.job_timeout = job_timeout
        self.impl = impl            # the workers' data path (native.IMPLS); None: each worker's default
        self._deadline = float("inf")
        self.workers: dict[str, WorkerHandle] = {}
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self.on_event: Callable[..., None] | None = None
        self._on_lost: Callable[[WorkerHandle], bool] | None = None
        self._lost_this_job: list[str] = []
        self.job_id = ""
        # Slot-seconds of the current job: each worker runs one task at a time, so an attempt holds one
        # slot from its dispatch to the worker's answer (done or failed). That is what YARN's
        # vcoreSeconds counts for a 1-vcore container: time allocated, not CPU time. It includes the
        # control round trip and leaves out the driver's own work (sampling, commit, TeraValidate's
        # reduce) and attempts lost with their worker (no answer came).
        self.slot_seconds = 0.0

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self) -> "Engine":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        auth.ensure_run_secret()      # the driver is the run's controller if nobody else is
        self._listener = socket.create_server((self.driver_host, 0), backlog=1024)
        host, port = self._listener.getsockname()[:2]
        for node in self.nodes:
            argv = [sys.executable, "-m", WORKER_MODULE, "--driver", f"{host}:{port}", "--node", node.name,
                    "--workdir", str(node.workdir), "--shared", str(node.shared or ""),
                    "--addresses", json.dumps(dict(node.addresses))]
            if self.impl is not None:
                argv += ["--impl", self.impl]
            token = secrets.token_hex(16)     # names this launch: a hello must carry it
            self.workers[node.name] = WorkerHandle(node, self.launchers.start(node, argv, env={TOKEN_ENV: token}))
            self.workers[node.name].token = token
        deadline = time.monotonic() + self.start_timeout
        self._listener.settimeout(0.1)
        pending: list[_Pending] = []
        while not all(w.alive for w in self.workers.values()):
            for w in self.workers.values():
                code = w.proc.poll()
                if code is not None and not w.alive:
                    raise LaunchError(f"engine worker on {w.name} exited with {code} before saying hello: "
                                      f"{w.proc.output()[1].strip()[-800:]}")
            if time.monotonic() > deadline:
                late = [w.name for w in self.workers.values() if not w.alive]
                raise LaunchError(f"engine worker(s) on {', '.join(late)} did not connect within "
                                  f"{self.start_timeout:.0f}s")
            try:
                sock, _ = self._listener.accept()
                sock.settimeout(0.1)
                if len(pending) >= MAX_PENDING_HELLOS:       # a flood: the oldest stranger makes room
                    self._refuse(pending.pop(0), "too many connections waiting to say hello")
                p = _Pending(sock, Channel(sock), auth.ServerHandshake(), time.monotonic() + HELLO_TIMEOUT)
                sock.sendall(p.hs.greeting())
                pending.append(p)
            except OSError:        # socket.timeout: no one came; any other: that peer is gone already
                pass
            for p in list(pending):
                try:
                    w = self._hello_from(p)
                except (OSError, ProtocolError, ValueError, KeyError, TypeError) as e:
                    pending.remove(p)
                    self._refuse(p, str(e) or type(e).__name__)
                    continue
                if w is not None:
                    pending.remove(p)
                    p.sock.settimeout(30)   # reads happen only when select says so; sends may wait for space
                    w.sock, w.channel = p.sock, p.channel
                    w.alive, w.last_seen = True, time.monotonic()
                    self._selector.register(p.sock, selectors.EVENT_READ, w)
        for p in pending:
            p.sock.close()

    def _hello_from(self, p: "_Pending") -> WorkerHandle | None:
        """Read what a pending connection sent; the worker it authenticated as, once its hello came.
        Anything wrong (no credentials, garbage, a hello for a node that is not ours or already
        connected, a wrong launch token, silence past HELLO_TIMEOUT) raises: that connection only."""
        if time.monotonic() > p.deadline:
            raise ProtocolError(f"no valid hello within {HELLO_TIMEOUT:.0f}s")
        try:
            data = p.sock.recv(1 << 16)
        except socket.timeout:
            return None
        if not data:
            raise ProtocolError("closed before saying hello")
        if not p.hs.done:
            p.hs.feed(data)
            if not p.hs.done:
                return None
            if not p.hs.ok:
                raise ProtocolError(p.hs.reason)
            p.sock.sendall(p.hs.reply)
            data = p.hs.rest
        for message in p.channel.feed(data):
            if message.get("type") != "hello":
                raise ProtocolError(f"expected a hello, got {str(message.get('type'))[:40]!r}")
            w = self.workers.get(message.get("node"))
            if w is None or w.alive or not hmac.compare_digest(str(message.get("token", "")), w.token):
                raise ProtocolError(f"forged or duplicate hello for node {str(message.get('node'))[:40]!r}")
            shuffle = message["shuffle"]
            if not isinstance(shuffle, dict):
                raise ProtocolError("hello without shuffle server addresses")
            w.shuffle = shuffle
            return w
        return None

    def _refuse(self, p: "_Pending", reason: str) -> None:
        if p.hs.done and not p.hs.ok:
            try:
                p.sock.send(p.hs.reply)
            except OSError:
                pass
        try:
            peer = p.sock.getpeername()
        except OSError:
            peer = "?"
        auth.count_refusal("engine driver", peer, reason)
        p.sock.close()

    def close(self) -> None:
        for w in self.workers.values():
            if w.alive and w.channel is not None:
                try:
                    w.sock.setblocking(True)
                    w.sock.settimeout(1.0)
                    w.channel.send({"type": "stop"})
                except OSError:
                    pass
        for w in self.workers.values():
            try:
                w.proc.wait(3)
            except Exception:
                pass
            w.proc.kill()
            if w.sock is not None:
                try:
                    self._selector.unregister(w.sock)
                except (KeyError, ValueError):
                    pass
                w.sock.close()
            w.alive = False
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._selector.close()

    def worker_process(self, node_name: str):
        """The worker's Process handle (tests kill it to simulate a node failure)."""
        return self.workers[node_name].proc

    def live_workers(self) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.alive]

    # -- events, losses -------------------------------------------------------------------------------
    def _event(self, event: str, **info) -> None:
        if self.on_event is not None:
            self.on_event(event, **info)

    def _lose(self, w: WorkerHandle, reason: str) -> bool:
        """Mark a worker lost; requeueing is the caller's. Returns whether the job asks to abort."""
        if not w.alive:
            return False
        w.alive, w.lost_reason = False, reason
        self._lost_this_job.append(w.name)
        try:
            self._selector.unregister(w.sock)
        except (KeyError, ValueError):
            pass
        w.sock.close()
        w.proc.kill()
        self._event("worker_lost", node=w.name, reason=reason)
        return self._on_lost(w) if self._on_lost else False

    def _confirm_lost(self, name: str, grace: float = 2.0) -> bool:
        """After a fetch from ``name`` failed: is that worker dead (waiting briefly for the evidence)?"""
        w = self.workers.get(name)
        if w is None:
            return False
        deadline = time.monotonic() + grace
        while w.alive and time.monotonic() < deadline:
            if w.proc.poll() is not None:
                return True
            time.sleep(0.02)
        return not w.alive

    # -- the task loop --------------------------------------------------------------------------------
    def _run(self, tasks: list[Task], on_done: Callable[[Task, WorkerHandle, dict], None],
             on_lost: Callable[[WorkerHandle], bool] | None = None) -> bool:
        """Run tasks until all are done. If ``on_lost`` returns True (the job must re-run maps first),
        stop dispatching, let running tasks finish, and return False; True when everything ran."""
        queue = collections.deque(tasks)
        aborted = False
        self._on_lost = on_lost
        requeue: list[Task] = []

        def put_back(task: Task):
            requeue.append(task)

        while True:
            queue.extend(requeue)
            requeue.clear()
            busy = [w for w in self.workers.values() if w.alive and w.task is not None]
            if (aborted or not queue) and not busy:
                return not aborted and not queue
            if time.monotonic() > self._deadline:
                raise JobFailed(f"the job did not finish within {self.job_timeout:g}s "
                                f"({len(queue)} task(s) queued, {len(busy)} running)")
            alive = self.live_workers()
            if not alive:
                last = queue[-1] if queue else None
                raise JobFailed("every engine worker was lost ("
                                + "; ".join(f"{w.name}: {w.lost_reason}" for w in self.workers.values())
                                + ")" + (f"; last error: {last.last_error}" if last and last.last_error else ""))
            if not aborted:
                for w in alive:
                    if w.task is not None or not queue:
                        continue
                    task = next((t for t in queue if t.pin in (None, w.name)), None)
                    if task is None:
                        continue
                    queue.remove(task)
                    if task.attempts >= self.max_attempts:
                        raise JobFailed(f"{task.label()} failed {task.attempts} time(s), the limit; "
                                        f"last error: {task.last_error}")
                    task.attempts += 1
                    task.dispatched = time.monotonic()
                    w.task = task
                    try:
                        w.channel.send({"type": "task", "task": task.id, "op": task.op, "args": task.args})
                    except OSError as e:
                        w.task = None
                        task.last_error = f"its worker {w.name} was lost ({e})"
                        put_back(task)
                        aborted |= self._lose(w, f"control connection failed: {e}")
                        continue
                    self._event("dispatch", kind=task.kind, index=task.index, node=w.name)
                # pinned tasks whose node is gone are dropped (cleanup of a dead node)
                for t in [t for t in queue if t.pin and not self.workers[t.pin].alive]:
                    queue.remove(t)
            for key, _ in self._selector.select(timeout=0.05):
                w = key.data
                try:
                    data = w.sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except OSError as e:
                    data, err = b"", e
                if not data:
                    aborted |= self._lose_running(w, "control connection closed", put_back)
                    continue
                try:
                    messages = w.channel.feed(data)
                except ProtocolError as e:
                    aborted |= self._lose_running(w, f"sent garbage: {e}", put_back)
                    continue
                w.last_seen = time.monotonic()
                for m in messages:
                    task = w.task
                    if m.get("type") not in ("done", "failed") or task is None or m.get("task") != task.id:
                        continue
                    w.task = None
                    self.slot_seconds += time.monotonic() - task.dispatched
                    if m["type"] == "done":
                        on_done(task, w, m["result"])
                        self._event(f"{task.kind}_done", index=task.index, node=w.name)
                        continue
                    task.last_error = f"on {w.name}: {m.get('error')}"
                    source = m.get("fetch_node")
                    if source and task.refunds < len(self.workers) and self._confirm_lost(source):
                        task.attempts -= 1        # not the reduce's fault: its source node died
                        task.refunds += 1
                        sw = self.workers[source]
                        if sw.alive:
                            aborted |= self._lose_running(sw, f"process exited with {sw.proc.poll()}", put_back)
                    put_back(task)
            now = time.monotonic()
            for w in self.live_workers():
                code = w.proc.poll()
                if code is not None:
                    aborted |= self._lose_running(w, f"process exited with {code}", put_back)
                elif now - w.last_seen > self.heartbeat_timeout:
                    aborted |= self._lose_running(w, f"no heartbeat for {self.heartbeat_timeout:g}s", put_back)

    def _lose_running(self, w: WorkerHandle, reason: str, put_back) -> bool:
        task, w.task = w.task, None
        if task is not None:
            task.last_error = f"its worker {w.name} was lost: {reason}"
            put_back(task)
        return self._lose(w, reason)

    def _begin_job(self, name: str) -> None:
        self._on_lost = None
        for w in self.live_workers():
            if w.task is not None:    # still busy with a task of a job that failed: its reply would confuse us
                w.task = None
                self._lose(w, "was still running a task of an earlier, failed job")
        self._lost_this_job = []
        self.job_id, self.slot_seconds = f"{name}-{uuid.uuid4().hex[:8]}", 0.0
        self._deadline = time.monotonic() + self.job_timeout

    # -- job shapes -----------------------------------------------------------------------------------
    def run_map_only(self, op: str, task_args: list[dict]) -> list[dict]:
        """Run one task per args dict; results in task order."""
        self._begin_job(op)
        results: list[dict | None] = [None] * len(task_args)
        tasks = [Task("map", i, op, a) for i, a in enumerate(task_args)]

        def done(task, w, result):
            results[task.index] = result
        self._run(tasks, done)
        return results

    def run_mapreduce(self, name: str, config: EngineConfig | str, map_op: str, map_args: list[dict],
                      reduces: int, reduce_op: str, outdir: Path) -> JobResult:
        """Maps (each args dict gets ``root``/``out`` for its spill), then ``reduces`` reduces writing
        ``part-r-NNNNN`` into ``outdir`` (the job's temporary output dir)."""
        config = parse_config(config)
        check_runnable(config, self.cluster)
        self._check_workers_serve(config)
        self._begin_job(name)
        job_id = self.job_id
        root = "shared" if config.intermediate == "shared" else "local"
        job_dir = f"{JOB_ROOT}/{job_id}"
        maps = [Task("map", i, map_op, dict(a, root=root)) for i, a in enumerate(map_args)]
        outputs: dict[int, dict] = {}
        reduce_results: dict[int, dict] = {}
        phases = {"map": 0.0, "shuffle": 0.0, "reduce": 0.0}
        t_job = time.perf_counter()

        def map_done(task, w, result):
            outputs[task.index] = {"node": w.name, "path": task.args["out"], "sizes": result["sizes"],
                                   "records": result["records"]}

        def reduce_done(task, w, result):
            reduce_results[task.index] = result

        def lost(w) -> bool:
            # Always start a new round: local output of the node must be re-made, and shared output
            # it served needs a new server in the reduces' source lists.
            if root == "local":
                for i in [i for i, o in outputs.items() if o["node"] == w.name]:
                    del outputs[i]
                    maps[i].last_error = f"its output was on {w.name}, which was lost ({w.lost_reason})"
            return True

        reduce_tasks = {r: Task("reduce", r, reduce_op, {}) for r in range(reduces)}
        try:
            while True:
                missing = [maps[i] for i in range(len(maps)) if i not in outputs]
                if missing:
                    for t in missing:
                        t.args["out"] = f"{job_dir}/map-{t.index:05d}.a{t.attempts + 1}"
                    t0 = time.perf_counter()
                    self._run(missing, map_done, lost)
                    phases["map"] += time.perf_counter() - t0
                    continue
                pending = [reduce_tasks[r] for r in range(reduces) if r not in reduce_results]
                if not pending:
                    break
                sources = [self._source(outputs[i], root, config) for i in range(len(maps))]
                for t in pending:
                    t.args = {"reduce": t.index, "sources": sources, "transport": config.transport,
                              "direct": config.shuffle == "direct", "outdir": str(outdir)}
                t0 = time.perf_counter()
                self._run(pending, reduce_done, lost)
                phases["reduce"] += time.perf_counter() - t0
        finally:
            self._cleanup(root, job_dir)
        for leftover in Path(outdir).glob(".part-*"):   # a dead reducer's half-written file
            leftover.unlink(missing_ok=True)
        shuffle = max((r["seconds"]["fetch"] for r in reduce_results.values()), default=0.0)
        phases["shuffle"] = shuffle
        phases["reduce"] = max(0.0, phases["reduce"] - shuffle)
        return JobResult(job=name, config=config.name, seconds=time.perf_counter() - t_job, phases=phases,
                         records=sum(r["records"] for r in reduce_results.values()), output=Path(outdir),
                         details={"map_records": sum(o["records"] for o in outputs.values()),
                                  "partition_records": [reduce_results[r]["records"] for r in range(reduces)],
                                  "shuffle_bytes": sum(r["bytes"] for r in reduce_results.values())},
                         attempts=sum(t.attempts for t in maps) + sum(t.attempts for t in reduce_tasks.values()),
                         lost_workers=list(self._lost_this_job), id=job_id, slot_seconds=self.slot_seconds)

    def _check_workers_serve(self, config: EngineConfig) -> None:
        """Refuse a transport some worker has no shuffle server for (verbs without an RDMA device)."""
        lacking = [w.shuffle.get(f"{config.transport}_unavailable", f"{w.name}: no {config.transport} server")
                   for w in self.live_workers() if config.transport not in w.shuffle]
        if lacking:
            raise ConfigError(f"transport={config.transport} needs a shuffle server on every node: "
                              + "; ".join(lacking), f"engine configuration {config.name!r}")

    def _source(self, output: dict, root: str, config: EngineConfig) -> dict:
        """Where a reduce gets one map's segment: the map's node, or (shared dir, node lost) any live one."""
        w = self.workers[output["node"]]
        if not w.alive:
            w = self.live_workers()[0]      # only reachable for shared output: lost() dropped local ones
        server = w.shuffle["tcp"][config.net] if config.transport == "tcp" else w.shuffle[config.transport]
        # the map's segment sizes: the reduce fetches into one buffer of their total, and knows a
        # truncated or corrupt reply when it sees one
        return {"node": w.name, "root": root, "path": output["path"], "server": server,
                "sizes": output["sizes"]}

    def _cleanup(self, root: str, job_dir: str) -> None:
        """Remove the job's intermediate files on every live node (best effort; never fails a job)."""
        tasks = [Task("cleanup", i, "cleanup", {"root": root, "path": job_dir}, pin=w.name)
                 for i, w in enumerate(self.live_workers()) if not (root == "shared" and i > 0)]
        try:
            self._run(tasks, lambda *a: None)
        except JobFailed:
            pass
