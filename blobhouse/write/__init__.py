"""The write side: what a write accepts, preparing a table for it, and one write's lifecycle
(:class:`TableWrite`); the pipeline that writes data files is :mod:`blobhouse.write.pipeline`."""

from blobhouse.write.inputs import input_stream
from blobhouse.write.prepare import check_target, prepared_for_write
from blobhouse.write.table_write import TableWrite, WriteMode

__all__ = ["TableWrite", "WriteMode", "check_target", "input_stream", "prepared_for_write"]
