"""TestDFSIO conformance on Apache Hadoop (``--hpcnet-target hadoop``): the block Hadoop itself prints
has the layout and figures our reference reproduces (labels, ``#.##`` numbers, files x size MB), the
result file is appended per run, and write then read both complete on MiniDFS."""

from __future__ import annotations

import re

import pytest

from pytest_hpcnet.targets.hadoop import jobs

pytestmark = pytest.mark.hadoop

LABELS = ["----- TestDFSIO ----- : ", "            Date & time: ", "        Number of files: ",
          " Total MBytes processed: ", "      Throughput mb/sec: ", " Average IO rate mb/sec: ",
          "  IO rate std deviation: ", "     Test exec time sec: "]
NUMBER = r"(\d+(\.\d{1,2})?|\.\d{1,2})"


def test_write_then_read_blocks_as_the_reference_prints_them(hadoop_target, tmp_path):
    rt, mc = hadoop_target
    res = tmp_path / "TestDFSIO_results.log"
    for kind in ("-write", "-read"):
        jobs.dfsio(rt, [kind, "-nrFiles", "3", "-size", "1MB"], res_file=res, conf_dir=mc.conf_dir)
    blocks = res.read_text().split("\n\n")
    assert [b for b in blocks if b.strip()] and len([b for b in blocks if b.strip()]) == 2
    for block, kind in zip(blocks, ("write", "read")):
        lines = block.strip("\n").split("\n")
        assert len(lines) == 8
        for line, label in zip(lines, LABELS):
            assert line.startswith(label), line
        assert lines[0] == f"----- TestDFSIO ----- : {kind}"
        assert lines[2].endswith(": 3") and lines[3].endswith(": 3")
        for line in lines[4:8]:
            assert re.fullmatch(NUMBER, line.split(": ", 1)[1]), line
