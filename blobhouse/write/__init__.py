"""The write side: what a write accepts, preparing a table for it, and one write as a change
(:func:`begin_write`, :class:`TableWrite`); the pipeline that writes data files is
:mod:`blobhouse.write.pipeline`."""

from blobhouse.write.inputs import input_stream
from blobhouse.write.prepare import check_target, prepared_for_write
from blobhouse.write.table_write import (
    TableWrite,
    WriteAttempt,
    WriteChange,
    WriteMode,
    add_data_file,
    begin_write,
)

__all__ = [
    "TableWrite",
    "WriteAttempt",
    "WriteChange",
    "WriteMode",
    "add_data_file",
    "begin_write",
    "check_target",
    "input_stream",
    "prepared_for_write",
]
