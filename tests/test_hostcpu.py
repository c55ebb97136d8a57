"""The CPU name local gates key their bounds by (pytest_hpcnet.hostcpu)."""

from pytest_hpcnet.hostcpu import UNKNOWN, host_cpu

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC

processor\t: 1
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
"""
POWER8 = "processor\t: 0\ncpu\t\t: POWER8E (raw), altivec supported\nclock\t\t: 3690.000000MHz\n"


def test_model_name_with_family_and_model_of_the_first_processor():
    assert host_cpu(EPYC) == "AMD EPYC family 23 model 1"


def test_a_cpuinfo_without_family_numbers_gives_the_name_alone():
    assert host_cpu(POWER8) == "POWER8E (raw), altivec supported"
    assert host_cpu("") == UNKNOWN


def test_this_host_has_a_name():
    assert host_cpu() and host_cpu() != UNKNOWN
