"""Reference MapReduce: the data tools (TeraGen, TeraSort, TeraValidate, RandomWriter, Sort,
SortValidator), compatible with Hadoop's where Hadoop defines the bytes, as split-level functions the
distributed engine's map and reduce tasks call, plus single-process jobs that serve as its reference.

Map-side:   teragen.write_teragen_split, randomwriter.write_random_split, teravalidate.validate_file,
            terasort.map_sort_partition, sort.map_partition_sort
Reduce-side: terasort.merge_segments, sort.merge_sorted, teravalidate.reduce_validations
Driver-side: partition.sample_split_points, teragen.split_ranges, records.input_splits,
            records.committed_output
"""

from .partition import partition, sample_split_points
from .records import RECORD_LENGTH, KEY_LENGTH, committed_output, input_files, input_splits, read_records
from .randomwriter import randomwriter
from .sort import sort
from .sortvalidate import SUCCESS_LINE, sortvalidate
from .teragen import generate_rows, split_ranges, teragen, teragen_split
from .terasort import terasort
from .teravalidate import terachecksum, teravalidate

__all__ = [
    "RECORD_LENGTH", "KEY_LENGTH", "SUCCESS_LINE", "committed_output", "generate_rows", "input_files",
    "input_splits", "partition", "randomwriter", "read_records", "sample_split_points", "sort",
    "sortvalidate", "split_ranges", "teragen", "teragen_split", "terachecksum", "terasort", "teravalidate",
]
