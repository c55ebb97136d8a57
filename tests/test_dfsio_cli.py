"""``hpcnet dfsio`` end to end, as a user runs it: separate commands, a result file in the cwd."""

import re
import subprocess
import sys

HPCNET = [sys.executable, "-m", "pytest_hpcnet.cli"]


def hpcnet(*args, cwd, timeout=180):
    return subprocess.run([*HPCNET, "dfsio", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_write_then_read_in_separate_commands(tmp_path):
    """The block store keeps its state in the node dirs, so a -read command finds a -write's files.
    (The POSIX target is exercised through the same code by suites/dfsio.)"""
    where = ["--fs", "blockstore", "--transport", "shm", "--replication", "2", "--block-size", "256KB"]
    common = ["-nrFiles", "3", "-size", "600KB", "--cluster", "local:2", "--workdir", str(tmp_path / "wd"), *where]
    w = hpcnet("-write", *common, cwd=tmp_path)
    assert w.returncode == 0, w.stderr
    assert w.stdout.startswith("----- TestDFSIO ----- : write\n            Date & time: ")
    assert "        Number of files: 3\n Total MBytes processed: 1.76\n" in w.stdout
    assert w.stdout.endswith("\n\n") and w.stdout.count("\n") == 9
    assert "transport=shm, replication=2, block_size=262144" in w.stderr
    r = hpcnet("-read", *common, "--verify", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^----- TestDFSIO ----- : read$", r.stdout, re.M)
    assert (tmp_path / "TestDFSIO_results.log").read_text() == w.stdout + r.stdout
    c = hpcnet("-clean", *common[:4], *common[6:], cwd=tmp_path)
    assert c.returncode == 0 and c.stdout == ""
    gone = hpcnet("-read", *common, cwd=tmp_path)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1
    assert "task test_io_0 on node0 failed:" in gone.stderr


def test_bad_option_is_one_line_and_exit_2(tmp_path):
    p = hpcnet("-write", "-size", "3 MB", cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "hpcnet dfsio: -size: '3 MB': unsupported unit ' MB' (use B, KB, MB, GB or TB)\n"
