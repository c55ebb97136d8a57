"""Reference MapReduce: the data tools (TeraGen, TeraSort, TeraValidate, RandomWriter, Sort,
SortValidator), compatible with Hadoop's where Hadoop defines the bytes, as split-level functions the
distributed engine's map and reduce tasks call, plus single-process jobs that serve as its reference.

Map-side:   teragen.write_teragen_split, randomwriter.write_random_split, teravalidate.validate_file,
            terasort.map_sort_partition, sort.map_partition_sort
Reduce-side: terasort.merge_segments, sort.merge_sorted, teravalidate.reduce_validations
Driver-side: partition.sample_split_points, teragen.split_ranges, records.input_splits,
            records.committed_output

Import from the submodules (``from .teragen import teragen``); the package does not re-export, so the
module names stay importable.
"""
