"""Collection names: the one rule for what may name a file in the index directory."""

import re
from pathlib import Path

from ..errors import CollectionNotFound, InvalidCollectionName

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SQLITE_SUFFIX = ".sqlite3"
LANCE_SUFFIX = ".lance"


def validate_name(name) -> str:
    """Return ``name`` if it is a valid collection name, else raise.

    Checked before anything touches the disk, so a traversal probe
    (separators, ``..``, NUL, absolute paths) learns nothing.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidCollectionName(
            "invalid collection name: use 1-64 letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def sqlite_path(index_dir: Path, name: str) -> Path:
    return Path(index_dir) / (validate_name(name) + SQLITE_SUFFIX)


def lance_path(index_dir: Path, name: str) -> Path:
    return Path(index_dir) / (validate_name(name) + LANCE_SUFFIX)


def resolve_collection_arg(arg: str, index_dir: Path) -> tuple[Path, str]:
    """CLI helper: a COLLECTION argument is a name in ``index_dir`` or a path to a ``.sqlite3`` file."""
    if arg.endswith(SQLITE_SUFFIX):
        path = Path(arg)
        name = validate_name(path.name[: -len(SQLITE_SUFFIX)])
        if not path.is_file():
            raise CollectionNotFound("no such collection")
        return path.parent, name
    name = validate_name(arg)
    return Path(index_dir), name
