"""YARN application records: id, state, finalStatus, elapsedTime (ms), vcoreSeconds, memorySeconds.

Two sources giving the same record:

- the RM REST API ``GET /ws/v1/cluster/apps`` (``{"apps": {"app": [...]}}``), what a real cluster serves;
- ``yarn application -status <id>`` (the RM's client RPC), used when REST is not there. In a one-JVM
  MiniCluster the RM's ``/ws/`` pages answer 404: Jersey's Guice filter is process-wide and the last
  web app started (a NodeManager's) takes it over, so the RM's REST resources never see a request.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, replace

from ...errors import HpcnetError
from .. import JobRecord
from .budget import CLIENT_S
from .jobs import run_program

FIELDS = ("id", "state", "finalStatus", "elapsedTime", "vcoreSeconds", "memorySeconds")


class YarnError(HpcnetError, RuntimeError):
    """The ResourceManager could not be asked, or answered something we cannot read."""


@dataclass(frozen=True)
class AppRecord(JobRecord):
    """YARN's own record: the targets' ``JobRecord`` fields (elapsedTime in ms, whole vcore-seconds and
    MB-seconds as the RM aggregates them), the application's name and where the record was read
    (``source``: "rest" or "cli")."""
    name: str = ""
    source: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def parse_rest_apps(body: str | bytes) -> list[AppRecord]:
    """Records from ``/ws/v1/cluster/apps`` JSON (``"apps": null`` when there are none)."""
    try:
        doc = json.loads(body)
        apps = (doc.get("apps") or {}).get("app") or []
        return [AppRecord(a["id"], a["state"], a["finalStatus"], int(a["elapsedTime"]),
                          int(a.get("vcoreSeconds", 0)), int(a.get("memorySeconds", 0)), a.get("name", ""))
                for a in apps]
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise YarnError(f"not a /ws/v1/cluster/apps answer ({type(e).__name__}: {e})") from None


def rest_apps(rm_web: str, timeout: float = 10) -> list[AppRecord]:
    url = f"{rm_web.rstrip('/')}/ws/v1/cluster/apps"
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return parse_rest_apps(r.read())
    except (urllib.error.URLError, OSError) as e:
        raise YarnError(f"{url}: {e}") from None


_STATUS_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z -]*?)\s*:\s?(.*)$")
_AGGREGATE = re.compile(r"(\d+)\s+MB-seconds,\s*(\d+)\s+vcore-seconds")


def parse_app_status(text: str) -> AppRecord:
    """A record from ``yarn application -status`` output (Start/Finish-Time in ms since the epoch)."""
    fields = {}
    for line in text.splitlines():
        m = _STATUS_LINE.match(line)
        if m and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2).strip()
    try:
        agg = _AGGREGATE.search(fields["Aggregate Resource Allocation"])
        start, finish = int(fields["Start-Time"]), int(fields["Finish-Time"])
        return AppRecord(fields["Application-Id"], fields["State"], fields["Final-State"],
                         max(finish - start, 0) if finish else 0,
                         int(agg.group(2)) if agg else 0, int(agg.group(1)) if agg else 0,
                         fields.get("Application-Name", ""))
    except (KeyError, ValueError) as e:
        raise YarnError(f"not a `yarn application -status` report (missing/bad {e}):\n{text[-1500:]}") from None


def cli_app(rt, app_id: str, conf_dir=None) -> AppRecord:
    r = run_program(rt, "application", ["application", "-status", app_id], conf_dir=conf_dir, timeout=CLIENT_S)
    return parse_app_status(r.output)


def app_records(rt, app_ids: list[str], *, rm_web: str | None = None, conf_dir=None) -> list[AppRecord]:
    """Records of ``app_ids`` in that order: REST when it answers, else the CLI per application."""
    if rm_web:
        try:
            by_id = {a.id: a for a in rest_apps(rm_web)}
            if all(i in by_id for i in app_ids):
                return [replace(by_id[i], source="rest") for i in app_ids]
        except YarnError:
            pass
    return [replace(cli_app(rt, i, conf_dir), source="cli") for i in app_ids]
