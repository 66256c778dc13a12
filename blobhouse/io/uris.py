"""URIs: where objects live, in one canonical form (local paths as ``file://`` URIs, ``.`` and
``..`` resolved, percent-encoding normalized), so a prefix check on them cannot be escaped.

>>> normalize_uri("s3://bucket/media/%2e%2e/x.bin")
's3://bucket/x.bin'
"""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import quote, unquote, urlsplit

from blobhouse.errors import InvalidInputError

_CONTROL = re.compile("[\x00-\x1f\x7f]")

# the stores Lance and blobhouse both reach (Lance 14 has no hdfs:// and no http(s):// store)
SCHEMES = ("file", "s3", "gs", "az", "abfs", "abfss")
# RFC 3986 characters kept as they are in a path; everything else is percent-encoded
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def local_uri(path: str) -> str:
    """The ``file://`` URI of a local path: absolute, special characters percent-encoded (so
    a literal ``%`` or space in a name survives the round trip through URI parsers).

    >>> local_uri("/data/my clips/50%.mp4")
    'file:///data/my%20clips/50%25.mp4'
    """
    return "file://" + quote(os.path.abspath(path), safe=PATH_SAFE)


def child_of(root: str, name: str) -> str:
    """The location of the object ``name`` (any characters but ``/``) under ``root``: the name
    percent-encoded in a URI, as it is under a local path.

    >>> child_of("s3://bucket/t", "50%.json"), child_of("/data/t", "50%.json")
    ('s3://bucket/t/50%25.json', '/data/t/50%.json')
    """
    return f"{root}/{quote(name, safe=PATH_SAFE) if '://' in root else name}"


def as_uri(location: str) -> str:
    """``location`` as a URI: URIs unchanged, local paths through :func:`local_uri`."""
    return location if "://" in location else local_uri(location)


def normalize_uri(uri: str) -> str:
    """An absolute URI in one canonical form, or :class:`InvalidInputError`: percent-encoding
    decoded, then ``.`` and ``..`` resolved (so an encoded ``%2e%2e`` cannot escape a prefix
    check), local symlinks resolved, the path re-encoded. Local paths become ``file://`` URIs.
    Refused: control characters, unsupported schemes, credentials, queries and fragments, and
    ``file://`` URIs naming a host.

    >>> normalize_uri("/a/b/../c")
    'file:///a/c'
    >>> normalize_uri("s3://bucket/media/%2e%2e/x.bin")
    's3://bucket/x.bin'
    """
    if not isinstance(uri, str) or not uri:
        raise InvalidInputError(f"empty or non-string uri {uri!r}")
    if has_control(uri):
        raise InvalidInputError(f"uri {uri!r} contains control characters")
    parts = urlsplit(uri)
    if not parts.scheme:
        return local_uri(os.path.realpath(uri))
    if parts.scheme not in SCHEMES:
        raise InvalidInputError(
            f"uri {uri!r}: scheme {parts.scheme!r} is not supported (supported: {SCHEMES})"
        )
    if parts.query or parts.fragment or uri.endswith(("?", "#")):
        raise InvalidInputError(f"uri {uri!r} has a query or fragment")
    if "@" in parts.netloc:
        raise InvalidInputError(f"uri {uri!r} carries credentials; use storage_options")
    path = unquote(parts.path)
    if has_control(path):
        raise InvalidInputError(f"uri {uri!r} encodes control characters")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidInputError(
                f"file uri {uri!r} names a host ({parts.netloc!r}); use file:///absolute/path"
            )
        if not path:
            raise InvalidInputError(f"empty path in uri {uri!r}")
        return local_uri(os.path.realpath(path))
    if not parts.netloc:
        raise InvalidInputError(f"uri {uri!r} has no bucket or host")
    path = posixpath.normpath("/" + path.lstrip("/")) if path else ""
    path = "" if path == "/" else quote(path, safe=PATH_SAFE)
    return f"{parts.scheme}://{parts.netloc}{path}"


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def is_under(uri: str, prefix: str) -> bool:
    """Whether normalized ``uri`` is ``prefix`` or lies below it (``prefix`` may end in ``/``:
    the local root, ``file:///``).

    >>> is_under("s3://b/media/a.mp4", "s3://b/media"), is_under("s3://b/mediax", "s3://b/media")
    (True, False)
    >>> is_under("file:///data/a.mp4", "file:///")
    True
    """
    return uri == prefix or uri.startswith(prefix.rstrip("/") + "/")


def base_uri(normalized: str) -> str:
    """A base's one form: a normalized URI without a trailing ``/``, but for the local root,
    which is ``file:///`` (``file:`` would be a relative path).

    >>> base_uri("s3://bucket/media/"), base_uri("file:///")
    ('s3://bucket/media', 'file:///')
    """
    trimmed = normalized.rstrip("/")
    return normalized if trimmed.endswith(":") else trimmed


def is_root(normalized: str) -> bool:
    """Whether normalized ``normalized`` names a whole filesystem, bucket or container (no
    directory in it).

    >>> is_root("file:///"), is_root("s3://bucket"), is_root("s3://bucket/media")
    (True, True, False)
    """
    scheme, _, rest = normalized.partition("://")
    path = rest if scheme == "file" else rest.partition("/")[2]
    return not path.strip("/")
