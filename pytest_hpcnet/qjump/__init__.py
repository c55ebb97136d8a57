"""Old import paths of the QJump modules, kept only for ``benchmarks/common.py`` until it imports the new
homes: the workload is ``pytest_hpcnet.workloads.qjump``, the levels and tc layout are
``pytest_hpcnet.cluster.shaping``, the ``.bs`` format is ``pytest_hpcnet.report.bsfile``. Nothing in the
package imports this; delete it with that last caller (issue 18).
"""
