"""TestDFSIO over the project's filesystem targets (a POSIX directory, the reference block store).

    opts = parse_dfsio_args(["-write", "-nrFiles", "4", "-size", "64MB"])
    result = run_dfsio(opts, parse_fs("posix:/scratch/dfsio", fsync="close"), launchers, cluster)
    print(result.block(), end="")

Modules: ``options`` (Hadoop's command line), ``results`` (formulas and the printed block), ``fs``
(targets), ``task`` (one file's I/O on a node), ``job`` (tasks over the cluster), ``commands``
(``hpcnet dfsio``).
"""

# Imported lazily: a task process on a node imports ``task`` through this package and should not pay
# for scipy (via ``measure``) or the launcher machinery it never uses.
_EXPORTS = {"DfsioError": "job", "FsTarget": "job", "parse_fs": "job", "run_dfsio": "job",
            "DfsioOptions": "options", "parse_dfsio_args": "options", "parse_size": "options",
            "DfsioResult": "results", "TaskResult": "results", "decimal_format": "results"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
