"""Workloads: plain functions that run one benchmark on a cluster and return ``Measurement``s.

The suites, the benchmarks and the CLI all call these, so a number means the same thing everywhere.
"""
