"""``hpcnet export RUN.json... --format csv|jsonl|influx``: a run's figures for dashboards that exist.

One row per measurement (its headline figure and summary statistics) and one per judged claim (its
quantity, confidence interval, verdict and bound), each with the run's provenance: run id, time,
cluster (named as ``hpcnet asv-import`` names the machine), target and its version, project commit.

- ``csv``: one header line, then the rows; the columns are ``COLUMNS`` (empty where a column does not
  apply, e.g. a claim's ``metric`` stays empty unless recorded).
- ``jsonl``: one JSON object per row with the same keys (null where a column does not apply).
- ``influx``: InfluxDB line protocol, so Telegraf, ``influx write`` or Grafana's InfluxDB source take
  it as is. Measurements go to ``hpcnet_measurement``, claims to ``hpcnet_claim``. Tags (indexed, what
  a dashboard groups by) are the provenance and what names the series: cluster, target,
  target_version, commit, host, then metric, config, unit and params (``p_<name>``) or claim_id and
  claim_kind. Fields are the figures (value, n, min, mean, stdev, p99, p99_9, max; quantity, ci_lo,
  ci_hi, outcome, bound, enforced) and the run id (a field, not a tag: a tag per run would make every
  night a new series in InfluxDB). The timestamp is the
  run's time in nanoseconds. Escaping follows the protocol: in measurement names commas and spaces, in
  tag keys, tag values and field keys commas, equals signs and spaces get a backslash (a backslash
  before any other character is literal, so it stays as it is); string field values are double-quoted
  with ``"`` and ``\\`` escaped. Empty tags, non-finite numbers, a backslash ending a tag and newlines
  (which the protocol cannot carry) are left out or turned into spaces.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from datetime import datetime
from pathlib import Path

from .asv_import import machine_name, run_time
from .errors import ConfigError
from .results import RunRecord, load

FORMATS = ("csv", "jsonl", "influx")
PROVENANCE = ["run_id", "time", "cluster", "target", "target_version", "commit", "host"]
MEASUREMENT = ["metric", "config", "params", "unit", "direction", "value", "n", "min", "mean", "stdev",
               "p99", "p99_9", "max"]
CLAIM = ["claim_id", "outcome", "claim_kind", "quantity", "ci_lo", "ci_hi", "bound", "enforced"]
COLUMNS = ["row"] + PROVENANCE + MEASUREMENT + [c for c in CLAIM if c not in MEASUREMENT]


def _provenance(record: RunRecord, where: str) -> dict:
    prov = record.provenance
    target = prov.get("target") or {}
    return {"run_id": record.run_id, "time": run_time(record, where).isoformat(), "cluster": machine_name(prov),
            "target": target.get("name"), "target_version": target.get("version"),
            "commit": (prov.get("git") or {}).get("commit"), "host": prov.get("host")}


def rows(record: RunRecord, where: str = "record") -> list[dict]:
    """The run's rows: every measurement, then every claim the run judged (canary verdicts left out)."""
    base = _provenance(record, where)
    out = []
    for m in record.measurements:
        s = m.stats or {}
        row = {"row": "measurement", **base, "metric": m.metric, "config": m.config,
               "params": json.dumps(m.params, sort_keys=True, default=str), "unit": m.unit,
               "direction": m.direction, "value": m.value, "n": s.get("n", len(m.samples))}
        row.update({k: s.get(k) for k in ("min", "mean", "stdev", "p99", "p99_9", "max")})
        out.append(row)
    for v in record.verdicts:
        if v.get("injected") or v.get("outcome") in ("n/a", "not evaluated"):
            continue
        ci = v.get("ci") or [None, None]
        out.append({"row": "claim", **base, "claim_id": v.get("claim_id"), "outcome": v.get("outcome"),
                    "claim_kind": v.get("kind"), "quantity": v.get("quantity"), "ci_lo": ci[0], "ci_hi": ci[1],
                    "bound": v.get("bound"), "n": v.get("n"), "enforced": v.get("enforced"),
                    "metric": v.get("metric") or None, "direction": v.get("direction") or None})
    return [{c: row.get(c) for c in COLUMNS} for row in out]


def to_csv(all_rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in all_rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def to_jsonl(all_rows: list[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=False) + "\n" for row in all_rows)


# --- InfluxDB line protocol -----------------------------------------------------------------------

def _clean(text) -> str:
    return str(text).replace("\r", " ").replace("\n", " ")


def _no_trailing_backslash(text: str) -> str:
    # a backslash is literal unless a reserved character follows it; at the end of a tag it would
    # escape the separator after it, so it is left out there
    return text[:-1] if text.endswith("\\") else text


def escape_measurement(name: str) -> str:
    return _no_trailing_backslash(_clean(name)).replace(",", "\\,").replace(" ", "\\ ")


def escape_key(text) -> str:
    """A tag key, tag value or field key."""
    return _no_trailing_backslash(_clean(text)).replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def field_value(value) -> str | None:
    """A field value in the protocol's syntax; None when the protocol cannot carry it (NaN, inf, None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    return '"' + _clean(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def influx_line(name: str, tags: dict, fields: dict, ns: int) -> str | None:
    tag_text = "".join(f",{escape_key(k)}={escape_key(v)}" for k, v in sorted(tags.items())
                       if v is not None and _clean(v) != "")
    field_text = ",".join(f"{escape_key(k)}={fv}" for k, v in fields.items() if (fv := field_value(v)) is not None)
    if not field_text:
        return None     # a point needs at least one field
    return f"{escape_measurement(name)}{tag_text} {field_text} {ns}"


def to_influx(all_rows: list[dict]) -> str:
    lines = []
    for row in all_rows:
        ns = int(datetime.fromisoformat(row["time"]).timestamp()) * 1_000_000_000
        tags = {k: row[k] for k in ("cluster", "target", "target_version", "commit", "host")}
        if row["row"] == "measurement":
            params = json.loads(row["params"]) if row["params"] else {}
            tags.update({"metric": row["metric"], "config": row["config"] or None, "unit": row["unit"]})
            tags.update({f"p_{k}": v for k, v in params.items()})
            fields = {k: row[k] for k in ("value", "n", "min", "mean", "stdev", "p99", "p99_9", "max")}
            fields.update(direction=row["direction"], run_id=row["run_id"])
            line = influx_line("hpcnet_measurement", tags, fields, ns)
        else:
            tags.update({"claim_id": row["claim_id"], "claim_kind": row["claim_kind"]})
            fields = {k: row[k] for k in ("quantity", "ci_lo", "ci_hi", "outcome", "bound", "n", "enforced", "run_id")}
            line = influx_line("hpcnet_claim", tags, fields, ns)
        if line:
            lines.append(line)
    return "".join(line + "\n" for line in lines)


WRITERS = {"csv": to_csv, "jsonl": to_jsonl, "influx": to_influx}


def export(paths: list[Path], fmt: str) -> str:
    if fmt not in WRITERS:
        raise ConfigError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}", "--format")
    all_rows = []
    for path in paths:
        all_rows += rows(load(path), str(path))
    return WRITERS[fmt](all_rows)


# --- the command ---------------------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("export", help="a run's measurements and claims as csv, jsonl or InfluxDB "
                              "line protocol", description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, metavar="RUN.json")
    p.add_argument("--format", required=True, metavar="FORMAT", help=f"one of {', '.join(FORMATS)}")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE", help="write here (default stdout)")
    p.set_defaults(func=_export_command)


def _export_command(args) -> int:
    for path in args.records:
        if path.is_dir():
            raise ConfigError("not a run record (a directory)", str(path))
    text = export(args.records, args.format)
    if args.output is None:
        sys.stdout.write(text)
    else:
        from .results import write_atomic
        write_atomic(args.output, text)
        print(f"wrote {args.output}")
    return 0
