"""Which CPU this host has, as local gates key their bounds (``Claim.hosts``).

A timing ratio between two code paths depends on the microarchitecture it runs on: the native RPC
over the raw-socket ping-pong measured 1.16-1.25 on an AMD EPYC of family 25 and 1.46 on one of
family 23, both 2-core VMs. So a gate's bound is recorded per CPU, named by the model name the
kernel reports with its family and model numbers (the model name alone, "AMD EPYC", is the same
for both).

    python -m pytest_hpcnet.hostcpu      # prints e.g. "AMD EPYC family 25 model 1"
"""

from __future__ import annotations

from pathlib import Path

UNKNOWN = "unknown CPU"


def host_cpu(cpuinfo: str | None = None) -> str:
    """"<model name> family <f> model <m>" of the first processor in /proc/cpuinfo (or ``cpuinfo``)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return UNKNOWN
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break                     # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or fields.get("cpu") or UNKNOWN   # "cpu": POWER's /proc/cpuinfo
    parts = [name] + [f"{k} {fields[k2]}" for k, k2 in (("family", "cpu family"), ("model", "model"))
                      if fields.get(k2)]
    return " ".join(parts)


if __name__ == "__main__":
    print(host_cpu())
