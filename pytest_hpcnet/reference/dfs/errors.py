"""Errors the block store reports. All are ``HpcnetError``s: one clear line, no traceback needed."""

from ...errors import HpcnetError


class DfsError(HpcnetError, OSError):
    """Anything the block store reports to a caller."""


class NoSuchFile(DfsError, FileNotFoundError):
    pass


class ChecksumError(DfsError):
    """Data read back does not match the checksum stored when it was written."""


class DfsWriteError(DfsError):
    """A write could not be completed; the file is left unclosed (unreadable), never short."""


class ProtocolError(DfsError):
    """A peer sent something that is not a message of this protocol."""


def unreadable(path: str, block_id: int, errors: list[DfsError]) -> DfsError:
    """The error of a read no replica of a block could serve: ``ChecksumError`` if any replica failed
    its checksums, else ``DfsError``, naming every replica's failure in order."""
    cls = ChecksumError if any(isinstance(e, ChecksumError) for e in errors) else DfsError
    return cls(f"{path}: no replica of block {block_id} could be read: " + "; ".join(map(str, errors)))
