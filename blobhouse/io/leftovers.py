"""Leftovers: what stands where blobhouse creates a small object exclusively -- a lock, a lease, a
claim, an owner marker -- in a shape no live writer leaves there.

blobhouse makes each of those objects as one regular file (one object on an object store),
whose content it writes right after the exclusive create. So at such a path:

- a directory, a symbolic link (dangling or not) or another special file is never a live
  writer's: another tool, a hand, or a sync made it;
- an empty file older than :data:`EMPTY_SECONDS` was left by a process that died between its
  create and its write (an object store writes content and object in one request);
- content that is not what blobhouse writes there is garbage: each kind of object judges its
  own (a lock must hold its holder's token; an owner marker may be another table's, damaged).

:func:`found_at` says what is at a path, :func:`clear_once` removes it when it is still what was
found, one process at a time (two writers that meet the same leftover never remove the object
the first one created after it); what cannot be removed is named with the command that clears
it (:func:`leftover_error`). A directory is moved aside before it is removed, and a link is
removed itself, never what it points to.

>>> import tempfile, os
>>> from blobhouse.io.objects import LOCAL
>>> lock = os.path.join(tempfile.mkdtemp(), "upsert")
>>> os.symlink("/nonexistent", lock)
>>> found = found_at(LOCAL, lock)
>>> found.describe(), clear_once(LOCAL, lock, found), os.path.lexists(lock)
('a symbolic link to /nonexistent', True, False)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import stat
import time
import uuid
from dataclasses import dataclass

from blobhouse.errors import LeftoverError
from blobhouse.io.objects import ObjectStore, is_local, put_new, uri_to_path

#: an exclusive create writes its content at once: an object empty for longer than this was
#: left by a process that died in between
EMPTY_SECONDS = 2.0
#: how much of an object is read to judge it (what blobhouse writes there is far smaller)
MAX_BODY = 64 * 1024
#: the marker that makes clearing one leftover exclusive is ``<folder>/.break-<hash>`` (the hash
#: of the leftover's name and identity: a fixed length, whatever the name's)
BREAK = ".break-"
#: a clearer that died leaves its marker: one older than this is removed by the next
MARKER_SECONDS = 30.0


@dataclass(frozen=True)
class Found:
    """What stands at a path: ``kind`` is ``"file"`` (an object), ``"directory"``,
    ``"symlink"`` or ``"special"`` (a FIFO, a socket, a device); ``mtime`` when it was last
    written (epoch seconds, by its store's clock); ``body`` a file's first :data:`MAX_BODY`
    bytes; ``identity`` tells it from a later object at the same path."""

    kind: str
    mtime: float
    body: bytes = b""
    identity: str = ""
    target: str = ""  # a symlink's target

    @property
    def is_object(self) -> bool:
        """Whether it is an object blobhouse could have made (a regular file)."""
        return self.kind == "file"

    def age(self, store: ObjectStore, uri: str) -> float:
        return store.now(uri) - self.mtime

    def describe(self) -> str:
        """What it is, as an error names it.

        >>> Found("file", 0.0, b"").describe(), Found("file", 0.0, b"xyz").describe()
        ('an empty file', "3 bytes (b'xyz')")
        """
        if self.kind == "directory":
            return "a directory"
        if self.kind == "symlink":
            return f"a symbolic link to {self.target}"
        if self.kind == "special":
            return "a special file (a FIFO, socket or device)"
        if not self.body:
            return "an empty file"
        return f"{len(self.body)} bytes ({self.body[:24]!r})"


def found_at(store: ObjectStore, uri: str) -> Found | None:
    """What stands at ``uri`` (None: nothing), without following a link or opening anything
    but a regular file (a FIFO would block the read)."""
    if is_local(uri):
        return _found_locally(uri_to_path(uri))
    folder, name = uri.rsplit("/", 1)
    info = next((i for i in store.list(folder) if i.name == name), None)
    if info is None:
        return None
    try:
        source = store.open(uri)
        try:
            body = source.read(0, min(info.size, MAX_BODY))
        finally:
            source.close()
    except FileNotFoundError:
        return None
    return Found("file", info.mtime, body, f"{int(info.mtime * 1e6)}-{info.size}-{_digest(body)}")


def listed(store: ObjectStore, folder: str) -> list[str]:
    """The names directly in ``folder``: its objects, and on a local disk its directories and
    links too (a listing of objects descends into a directory and never shows it)."""
    if is_local(folder):
        try:
            return sorted(os.listdir(uri_to_path(folder)))
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted({info.name.split("/", 1)[0] for info in store.list(folder)})


def make_way(store: ObjectStore, uri: str) -> None:
    """Clear a directory or a link standing at ``uri`` on a local disk (no object is ever one:
    an object store has neither), so that an object can be written there."""
    if not is_local(uri):
        return
    found = _found_locally(uri_to_path(uri))
    if found is not None and not found.is_object:
        clear_once(store, uri, found)


def folder_leftovers(store: ObjectStore, root: str, relative: str) -> list[tuple[str, Found]]:
    """What stands, on a local disk, at the first part of the table's own folder ``relative``
    (``_leases/locks``) under table ``root`` that is no folder: a link (to a user's folder,
    say), a file, a special file. Nothing blobhouse creates, lists or removes there may go
    through it (an object store has no such thing).

    >>> import tempfile, os
    >>> from blobhouse.io.objects import LOCAL
    >>> root = tempfile.mkdtemp(); os.symlink(tempfile.mkdtemp(), f"{root}/_leases")
    >>> [found.kind for _, found in folder_leftovers(LOCAL, root, "_leases/locks")]
    ['symlink']
    """
    if not is_local(root):
        return []
    uri = root.rstrip("/")
    for part in relative.split("/"):
        uri = f"{uri}/{part}"
        found = found_at(store, uri)
        if found is None:
            return []
        if found.kind != "directory":
            return [(uri, found)]
    return []


def own_folder(store: ObjectStore, root: str, relative: str) -> None:
    """Clear what stands where the table's own folder ``relative`` belongs under ``root``
    (:func:`folder_leftovers`: a link is removed itself, never what it leads to; a file is
    removed), so that what a writer creates there stays in the table. Two processes meeting
    it clear it once; one that cannot be cleared is named (:class:`LeftoverError`)."""
    deadline = time.monotonic() + MARKER_SECONDS
    while stale := folder_leftovers(store, root, relative):
        uri, found = stale[0]
        if not clear_once(store, uri, found):
            if time.monotonic() > deadline:
                raise leftover_error(uri, found, "it stayed while another process cleared it")
            time.sleep(0.01)  # another process is clearing it


def _found_locally(path: str) -> Found | None:
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    identity = f"{info.st_ino}-{info.st_mtime_ns}"
    if stat.S_ISLNK(info.st_mode):
        with contextlib.suppress(OSError):  # gone meanwhile: its target is not what matters
            return Found(
                "symlink", info.st_mtime, identity=f"l{identity}", target=os.readlink(path)
            )
        return None
    if stat.S_ISDIR(info.st_mode):
        return Found("directory", info.st_mtime, identity=f"d{identity}")
    if not stat.S_ISREG(info.st_mode):
        return Found("special", info.st_mtime, identity=f"s{identity}")
    try:  # replaced meanwhile by a link or a FIFO: neither followed nor waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # such a swap, or a file this process may not read: not an object
        body = f"(cannot be read: {exc.strerror})".encode()  # blobhouse wrote: garbage
        return Found("file", info.st_mtime, body, f"f{identity}-{_digest(body)}")
    try:
        body = os.read(fd, MAX_BODY)
    finally:
        os.close(fd)
    return Found("file", info.st_mtime, body, f"f{identity}-{_digest(body)}")


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:32]


def clear_once(store: ObjectStore, uri: str, found: Found) -> bool:
    """Remove ``found`` from ``uri`` if it is still what stands there, as the one process doing
    so (a marker named after it, created exclusively); whether this call removed it. A
    leftover that cannot be removed raises :class:`~blobhouse.errors.LeftoverError` naming it
    and the command that clears it."""
    folder, name = uri.rsplit("/", 1)
    marker = f"{folder}/{BREAK}{_digest(f'{name}/{found.identity}'.encode())}"
    if not put_new(store, marker, b""):
        stale = found_at(store, marker)
        if stale is not None and stale.age(store, marker) >= MARKER_SECONDS:
            store.delete(marker)  # its clearer died while clearing
        return False
    try:
        again = found_at(store, uri)
        if again is None or again.identity != found.identity:
            return False  # cleared meanwhile, or a new object: not the one judged
        try:
            _remove(store, uri, found)
        except OSError as exc:
            why = f"it could not be removed ({exc.strerror or exc})"
            raise leftover_error(uri, found, why) from exc
        return True
    finally:
        with contextlib.suppress(OSError):
            store.delete(marker)


def _remove(store: ObjectStore, uri: str, found: Found) -> None:
    if not is_local(uri):
        store.delete(uri)
        return
    path = uri_to_path(uri)
    if found.kind != "directory":
        os.unlink(path)  # a link itself, never what it points to
        return
    # a trailing slash renames only a directory: a lock created at the path meanwhile stays
    aside = os.path.join(os.path.dirname(path), f"{BREAK}{uuid.uuid4().hex}")
    os.rename(f"{path}/", aside)
    shutil.rmtree(aside)


def leftover_error(uri: str, found: Found, why: str) -> LeftoverError:
    """The one-line error naming the leftover at ``uri``, ``why`` it stays, and the command
    that clears it."""
    return LeftoverError(
        f"{uri} is {found.describe()}, which no live blobhouse writer leaves there, and {why}: "
        f"clear it with `{clear_command(uri, found.kind == 'directory')}`, then run again",
        uri,
    )


def clear_command(uri: str, directory: bool = False) -> str:
    """The shell command that removes the leftover at ``uri`` (a ``directory``, or a file).

    >>> clear_command("/data/t/_leases/locks/upsert", True), clear_command("s3://b/t/x")
    ('rm -r -- /data/t/_leases/locks/upsert', 'aws s3 rm s3://b/t/x')
    """
    if not is_local(uri):
        return f"aws s3 rm {uri}" if uri.startswith(("s3://", "s3a://")) else f"delete {uri}"
    return f"rm {'-r ' if directory else ''}-- {shlex.quote(uri_to_path(uri))}"
