"""What a LeRobot dataset holds, checked before an import writes anything: numbers of the right
type and range, text that is text, and names that stay distinct once they are the table's.

Each check names the file, the field and the row (a frame by its ``index``, an episode by its
``episode_index``), what it found and what is expected (a
:class:`~blobhouse.errors.LeRobotDatasetError`). :class:`FrameScan` reads the data files'
frame fields once (a few small columns, not the state or the images) and keeps what the video
checks need: each episode's first and last frame time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blobhouse.columns import name_problem
from blobhouse.errors import LeRobotDatasetError
from blobhouse.lerobot.folder import readable

#: the fields every frame row has (LeRobot's DEFAULT_FEATURES): integers, and the timestamp
FRAME_INTEGERS = ("index", "episode_index", "frame_index", "task_index")
FRAME_COLUMNS = (*FRAME_INTEGERS, "timestamp")


def column_name(key: str) -> str:
    """The table column of LeRobot feature ``key``: dots become underscores (a dot in a
    column name addresses a field inside a struct).

    >>> column_name("observation.images.top")
    'observation_images_top'
    """
    return key.replace(".", "_")


def positive_number(value: object) -> float | None:
    """``value`` as a finite float > 0, or None if it is not one (a bool, a string, NaN,
    infinite, or an integer too large for a float).

    >>> positive_number(30), positive_number(float("nan")), positive_number(10**400)
    (30.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def check_names(dataset: Sequence[tuple[str, str]], made: Sequence[tuple[str, str]]) -> None:
    """Refuse two names that would become one column. ``dataset``: (key, where it is) of the
    dataset's names (features, data columns), a key seen twice being one name; ``made``:
    (column, what it holds) of the columns the import adds, which must meet nothing else.

    >>> check_names([("x.y", "data column 'x.y'"), ("x_y", "data column 'x_y'")], [])
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    blobhouse.errors.LeRobotDatasetError: data column 'x.y' and data column 'x_y' would both ...
    """
    seen: dict[str, tuple[str | None, str]] = {}  # column -> (dataset key or None, source)
    for key, source in dataset:
        column = column_name(key)
        _check_column_name(column, source)
        if column in seen and seen[column][0] != key:
            raise LeRobotDatasetError(
                f"{seen[column][1]} and {source} would both be column {column!r} of the table: "
                "rename one of them in the dataset"
            )
        seen.setdefault(column, (key, source))
    for column, what in made:
        _check_column_name(column, f"the import's column {column!r} ({what})")
        if column in seen:
            key, source = seen[column]
            if key is None:
                raise LeRobotDatasetError(
                    f"the import would make column {column!r} twice: {source} and {what}; "
                    "rename a camera in the dataset"
                )
            raise LeRobotDatasetError(
                f"{source} would be replaced by the import's column {column!r} ({what}): "
                "rename it in the dataset (the import adds 'task' and, per camera, its video "
                "column and '<camera>_timestamp')"
            )
        seen[column] = (None, f"column {column!r} ({what})")


def _check_column_name(column: str, source: str) -> None:
    """Refuse a column name Lance cannot address or blobhouse keeps (:func:`name_problem`)
    before anything is stored, naming where it comes from."""
    problem = name_problem(column)
    if problem is not None:
        raise LeRobotDatasetError(
            f"{source} cannot be a column of the table: its name {problem}; rename it in the "
            "dataset"
        )


def check_kinds(
    schema: pa.Schema, path: Path, integers: Iterable[str], numbers: Iterable[str] = ()
) -> None:
    """Refuse a field of ``integers`` that is not of an integer type, or of ``numbers`` that
    is not a number (integer or floating point), naming the file, field and type found.

    >>> check_kinds(pa.schema([("index", pa.string())]), Path("f.parquet"), ["index"])
    Traceback (most recent call last):
    blobhouse.errors.LeRobotDatasetError: f.parquet: index must hold integers, it holds string
    """
    for names, accepts, what in (
        (integers, pa.types.is_integer, "integers"),
        (numbers, lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "numbers"),
    ):
        for name in names:
            kind = schema.field(name).type
            if not accepts(kind):
                raise LeRobotDatasetError(f"{path}: {name} must hold {what}, it holds {kind}")


def check_range(
    values: np.ndarray, names: np.ndarray, path: Path, field: str, row: str, rule: str
) -> None:
    """Refuse a value of ``values`` that is NaN, infinite or negative: the first one is named
    as ``field`` of ``row`` ``names[i]``, followed by ``rule``.

    >>> check_range(np.array([0.5, np.inf]), np.array([7, 8]), Path("f"), "timestamp",
    ...             "frame index", "it must be finite")
    Traceback (most recent call last):
    blobhouse.errors.LeRobotDatasetError: f: timestamp of frame index 8 is inf: it must be finite
    """
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        at = int(np.argmax(bad))
        value = values[at]
        shown = repr(float(value)) if values.dtype.kind == "f" else str(int(value))
        raise LeRobotDatasetError(f"{path}: {field} of {row} {names[at]} is {shown}: {rule}")


def task_texts(path: Path, indices: Sequence[object], texts: Sequence[object]) -> dict[int, str]:
    """The tasks of ``meta/tasks.parquet``: task_index -> its text, which must be text (UTF-8
    bytes are decoded); an index given twice is refused.

    >>> task_texts(Path("tasks.parquet"), [0, 1], ["pick", b"place"])
    {0: 'pick', 1: 'place'}
    """
    tasks: dict[int, str] = {}
    for index, text in zip(indices, texts, strict=True):
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise LeRobotDatasetError(f"{path}: task_index must hold integers, got {index!r}")
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise LeRobotDatasetError(
                    f"{path}: the task of task_index {index} is not UTF-8 text: {text[:60]!r}"
                ) from None
        if not isinstance(text, str):
            raise LeRobotDatasetError(
                f"{path}: the task of task_index {index} must be text, got {text!r}"
            )
        if int(index) in tasks:
            raise LeRobotDatasetError(f"{path}: task_index {index} appears twice")
        tasks[int(index)] = text
    return tasks


def has_text(kind: pa.DataType) -> bool:
    """Whether values of ``kind`` hold strings (at any depth).

    >>> has_text(pa.list_(pa.string())), has_text(pa.list_(pa.float32()))
    (True, False)
    """
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return True
    if pa.types.is_struct(kind):
        return any(has_text(f.type) for f in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return has_text(kind.value_type)
    return False


def check_text(column: pa.Array, name: str, frames: np.ndarray, path: Path) -> None:
    """Refuse a string of ``column`` that is not UTF-8, naming the frame (by ``index``).

    >>> bad = pa.Array.from_buffers(pa.string(), 2, pa.array([b"ok", b"\\xff"]).buffers())
    >>> check_text(bad, "note", np.array([7, 8]), Path("f.parquet"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    blobhouse.errors.LeRobotDatasetError: f.parquet: column 'note' of frame index 8 is not UTF-8 ...
    """
    try:
        column.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        binary = column.view(
            pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        )
        for row, value in enumerate(binary.to_pylist()):
            try:
                if value is not None:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                raise LeRobotDatasetError(
                    f"{path}: column {name!r} of frame index {frames[row]} is not UTF-8 text: "
                    f"{value[:60]!r}"
                ) from None
    raise LeRobotDatasetError(f"{path}: column {name!r} holds text that is not UTF-8")


@dataclass
class FrameScan:
    """The frame fields of every data file, read once and checked: no nulls, integers where
    LeRobot writes them, timestamps finite and >= 0, every episode and task known, text UTF-8,
    and each episode's frame count equal to its ``length``. Keeps each episode's first and
    last timestamp (``first``, ``last``: by position in ``episodes``), what its video files
    must cover.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "file-000.parquet"
    >>> pq.write_table(pa.table({"index": [0, 1, 2], "episode_index": [4, 4, 6],
    ...     "frame_index": [0, 1, 0], "task_index": [0, 0, 0],
    ...     "timestamp": pa.array([0.0, 1 / 30, 0.0], pa.float32())}), path)
    >>> scan = FrameScan(np.array([4, 6]), {0: "pick"})
    >>> scan.scan(path, pq.read_schema(path))
    >>> scan.count.tolist(), scan.last.round(4).tolist()
    ([2, 1], [0.0333, 0.0])
    """

    episodes: np.ndarray  # episode_index, sorted
    tasks: Mapping[int, str]
    count: np.ndarray = field(init=False)
    first: np.ndarray = field(init=False)
    last: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        size = len(self.episodes)
        self.count = np.zeros(size, np.int64)
        self.first = np.full(size, np.inf)
        self.last = np.full(size, -np.inf)

    def scan(self, path: Path, schema: pa.Schema) -> None:
        """Check the frame rows of data file ``path`` (of columns ``schema``)."""
        texts = [f.name for f in schema if has_text(f.type)]
        try:
            table = pq.read_table(readable(path), columns=[*FRAME_COLUMNS, *texts])
        except (OSError, pa.ArrowException) as error:  # a damaged page
            raise LeRobotDatasetError(f"{path} cannot be read: {error}") from None
        frames = table["index"].to_numpy(zero_copy_only=False)
        for name in FRAME_COLUMNS:
            if table[name].null_count:
                at = int(np.argmax(table[name].is_null().to_numpy(zero_copy_only=False)))
                raise LeRobotDatasetError(f"{path}: {name} is null in row {at} of the file")
        seconds = table["timestamp"].to_numpy().astype(np.float64)
        check_range(
            seconds,
            frames,
            path,
            "timestamp",
            "frame index",
            "a frame's time in seconds from its episode's start must be a finite number >= 0",
        )
        rows = episode_rows(self.episodes, table["episode_index"].to_numpy(), frames, path)
        tasks = table["task_index"].to_numpy()
        known = np.isin(tasks, np.fromiter(self.tasks, np.int64, len(self.tasks)))
        if not known.all():
            at = int(np.argmin(known))
            raise LeRobotDatasetError(
                f"{path}: task_index {tasks[at]} (frame index {frames[at]}) is not in "
                "meta/tasks.parquet"
            )
        for name in texts:
            check_text(table[name].combine_chunks(), name, frames, path)
        self.count += np.bincount(rows, minlength=len(self.episodes))
        np.minimum.at(self.first, rows, seconds)
        np.maximum.at(self.last, rows, seconds)

    def check_lengths(self, lengths: np.ndarray, data: Path, episodes: Path) -> None:
        """Each episode holds as many frames as its ``length`` says."""
        differ = self.count != lengths
        if differ.any():
            at = int(np.argmax(differ))
            raise LeRobotDatasetError(
                f"episode {self.episodes[at]} has {self.count[at]} frames in {data}, but "
                f"{episodes} gives its length as {lengths[at]}"
            )


def episode_rows(
    known: np.ndarray, wanted: np.ndarray, frames: np.ndarray, path: Path
) -> np.ndarray:
    """The position in ``known`` (sorted episode indices) of each of ``wanted``; a frame of
    an episode ``known`` lacks is named by its ``frames`` index.

    >>> episode_rows(np.array([3, 5]), np.array([5, 5, 3]), np.array([0, 1, 2]), Path("f")).tolist()
    [1, 1, 0]
    """
    rows = np.searchsorted(known, wanted).clip(0, len(known) - 1)
    unknown = known[rows] != wanted
    if unknown.any():
        at = int(np.argmax(unknown))
        raise LeRobotDatasetError(
            f"{path}: frame index {frames[at]} has episode_index {wanted[at]}, which "
            "meta/episodes does not list"
        )
    return rows
