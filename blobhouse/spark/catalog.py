"""Spark SQL catalog tables of the ``blobhouse`` data source (``CREATE TABLE ... USING blobhouse``).

pyspark 4.3 shows a Python data source a catalog table's ``OPTIONS``, ``LOCATION`` and
``TBLPROPERTIES`` once: when ``CREATE TABLE`` without a column list asks it for the schema. Later
statements on the table (``SELECT``, ``INSERT``) create the data source with only the
statement's own ``WITH (...)`` options and the schema stored in the catalog (Spark's
``PythonDataSourceV2.getTable`` drops the table's properties). So the schema the data source
returns at ``CREATE TABLE`` carries the table's options in every column's metadata, under
:data:`TABLE_KEY`; a reader gets the catalog schema of the table it scans, and finds them there.

A writer cannot trust that metadata: when an ``INSERT ... SELECT`` passes another relation's
columns through unchanged, Spark hands the writer the source's columns, metadata included. A
write names its table in the statement (``INSERT INTO t WITH ('path' = '<uri>') ...``) and uses
the carried options only when they describe that same table. docs/spark-sql.md has the details.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from blobhouse.errors import InvalidInputError

TABLE_KEY = "blobhouse.table"
"""Column metadata key holding a catalog table's options (JSON)."""

_FORMAT = 1

_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "float": FloatType(),
    "real": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}
_DECIMALS = ("decimal", "dec", "numeric")
_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<string>'(?:[^'\\]|\\.|'')*')"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)|(?P<punct>[<>(),:]))"
)


def with_table_options(
    schema: StructType, options: Mapping[str, str], blob_columns: set[str], blobs: str
) -> StructType:
    """``schema`` with the table's ``options`` in every column's metadata, and a comment on each
    top-level blob column saying what its values are (``DESCRIBE TABLE`` shows it).

    >>> s = StructType([StructField("id", LongType()), StructField("img", BinaryType())])
    >>> marked = with_table_options(s, {"path": "/data/t"}, {"img"}, "bytes")
    >>> table_options(marked)
    {'path': '/data/t'}
    >>> marked["img"].metadata["comment"]
    'blobhouse blob column: its bytes (read with blobs=bytes)'
    """
    marker = json.dumps({"format": _FORMAT, "options": dict(sorted(options.items()))})
    fields = []
    for f in schema.fields:
        metadata = {**(f.metadata or {}), TABLE_KEY: marker}
        if f.name in blob_columns and "comment" not in metadata:
            metadata["comment"] = (
                f"blobhouse blob column: a reference (uri, position, size, blake3); "
                f"read_blob({f.name}) reads its bytes, checked"
                if blobs == "refs"
                else "blobhouse blob column: its bytes (read with blobs=bytes)"
            )
        fields.append(StructField(f.name, f.dataType, f.nullable, metadata))
    return StructType(fields)


def table_options(schema: StructType, whole: bool = False) -> dict[str, str] | None:
    """The options :func:`with_table_options` put in ``schema``, or None when its columns carry
    none, or not all the same (columns of different tables). ``whole``: a catalog table's own
    schema, where columns that carry none next to some that do mean it was altered."""
    markers = {(f.metadata or {}).get(TABLE_KEY) for f in schema.fields}
    if whole and len(markers) > 1 and markers != {None}:
        raise InvalidInputError(
            "this catalog table's columns changed after CREATE TABLE (ALTER TABLE), which "
            "blobhouse tables do not support: DROP TABLE and CREATE TABLE it again (the data "
            "stays)"
        )
    if len(markers) != 1 or None in markers:
        return None
    decoded = json.loads(markers.pop())
    if decoded.get("format") != _FORMAT:
        raise InvalidInputError(
            f"this catalog table was created by another blobhouse version (column metadata "
            f"{TABLE_KEY} format {decoded.get('format')}); create it again"
        )
    return decoded["options"]


def parse_columns(ddl: str) -> StructType:
    """The Spark schema a ``columns`` option declares, in Spark's DDL (``"id BIGINT, img BINARY
    NOT NULL COMMENT 'frame'"``). Parsed here because a data source's Python worker has no JVM
    to ask; it knows Spark's primitive types, ``DECIMAL(p, s)``, ``ARRAY<t>``, ``MAP<k, v>`` and
    ``STRUCT<name: t, ...>``.

    >>> parse_columns("id BIGINT NOT NULL, tags ARRAY<STRING>, `the img` BINARY COMMENT 'x'")
    ... # doctest: +NORMALIZE_WHITESPACE
    StructType([StructField('id', LongType(), False),
                StructField('tags', ArrayType(StringType(), True), True),
                StructField('the img', BinaryType(), True)])
    """
    parser = _Parser(ddl)
    fields = parser.fields(end=None)
    if not fields:
        raise InvalidInputError("option columns declares no column")
    return StructType(fields)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(self._tokens(text))
        self.at = 0

    def _tokens(self, text: str) -> Iterator[tuple[str, str]]:
        position = 0
        while text[position:].strip():
            match = _TOKEN.match(text, position)
            if match is None:
                self._fail(f"unexpected {text[position:].strip()[:20]!r}")
            position = match.end()
            kind = match.lastgroup
            yield kind, match.group(kind)

    def _fail(self, problem: str):
        raise InvalidInputError(f"option columns {self.text!r}: {problem}")

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _next(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            self._fail("ends too early")
        self.at += 1
        return token

    def _expect(self, punct: str) -> None:
        kind, value = self._next()
        if (kind, value) != ("punct", punct):
            self._fail(f"expected {punct!r}, got {value!r}")

    def _keyword(self, *words: str) -> bool:
        """Consume ``words`` (case-insensitive) if they come next."""
        upcoming = self.tokens[self.at : self.at + len(words)]
        if [(k, v.lower()) for k, v in upcoming] == [("word", w) for w in words]:
            self.at += len(words)
            return True
        return False

    def _name(self) -> str:
        kind, value = self._next()
        if kind == "quoted":
            return value[1:-1].replace("``", "`")
        if kind != "word":
            self._fail(f"expected a column name, got {value!r}")
        return value

    def fields(self, end: str | None, struct: bool = False) -> list[StructField]:
        fields: list[StructField] = []
        names: set[str] = set()
        while self._peek() is not None and self._peek() != ("punct", end):
            if fields:
                self._expect(",")
            name = self._name()
            if struct and self._peek() == ("punct", ":"):
                self.at += 1
            data_type = self.data_type()
            nullable = not self._keyword("not", "null")
            metadata = {}
            if self._keyword("comment"):
                kind, value = self._next()
                if kind != "string":
                    self._fail(f"COMMENT needs a quoted string, got {value!r}")
                metadata["comment"] = re.sub(r"\\(.)|''", lambda m: m.group(1) or "'", value[1:-1])
            if name.lower() in names:
                self._fail(f"column {name!r} is declared twice")
            names.add(name.lower())
            fields.append(StructField(name, data_type, nullable, metadata))
        if end is None and self._peek() is not None:
            self._fail(f"unexpected {self._peek()[1]!r}")
        return fields

    def data_type(self) -> DataType:
        kind, value = self._next()
        word = value.lower()
        if kind != "word":
            self._fail(f"expected a type, got {value!r}")
        if word in _PRIMITIVES:
            return _PRIMITIVES[word]
        if word in _DECIMALS:
            numbers = [10, 0]
            if self._peek() == ("punct", "("):
                self.at += 1
                numbers = [self._number()]
                if self._peek() == ("punct", ","):
                    self.at += 1
                    numbers.append(self._number())
                else:
                    numbers.append(0)
                self._expect(")")
            return DecimalType(*numbers)
        if word == "array":
            self._expect("<")
            element = self.data_type()
            self._expect(">")
            return ArrayType(element)
        if word == "map":
            self._expect("<")
            key = self.data_type()
            self._expect(",")
            value_type = self.data_type()
            self._expect(">")
            return MapType(key, value_type)
        if word == "struct":
            self._expect("<")
            fields = self.fields(end=">", struct=True)
            self._expect(">")
            return StructType(fields)
        if word in ("char", "varchar"):
            self._fail(f"{value} is not supported here; declare the column STRING")
        return self._fail(
            f"type {value!r} is not supported here (Spark primitive types, DECIMAL(p, s), "
            "ARRAY<t>, MAP<k, v>, STRUCT<name: t, ...>)"
        )

    def _number(self) -> int:
        kind, value = self._next()
        if kind != "number":
            self._fail(f"expected a number, got {value!r}")
        return int(value)
