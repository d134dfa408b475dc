"""The workspace's state as a content-addressed (Merkle) tree, and restoring one.

Each directory is a *tree object*: the canonical JSON of its entries,
``name -> {"type": "file", "hash": <sha256 of the bytes>, "exec": bool}`` or
``name -> {"type": "dir", "hash": <digest of the subtree's object>}``; its
digest is ``sha256:`` of those bytes, and the state fingerprint is the root
object's digest. Files are blobs addressed by the same ``sha256:`` of their
bytes, so a snapshot is just "the root digest", and two snapshots share every
blob of every subtree they have in common.

Empty directories are not part of the state (as in git): a directory holding
no regular file anywhere below it has no entry in its parent. Creating or
removing one changes nothing an agent's writes depend on, and a rewind
neither creates nor needs them.

Everything here is a function of values; the disk is :mod:`._statcache`'s and
:mod:`._tree`'s business.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from tether.adapters._errors import UnsupportedEntryError
from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    canonical_bytes,
    digest_bytes,
    strict_loads,
)

FILE = "file"
DIR = "dir"

#: In memory an entry is ``(FILE, hash, exec)`` or ``(DIR, digest, False)``:
#: tuples compare fast, which is what keeps an unchanged directory cheap.
Entry = tuple[str, str, bool]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def tree_bytes(entries: Mapping[str, Entry]) -> bytes:
    """The canonical bytes of a directory's tree object."""
    body: dict[str, object] = {}
    for name, (kind, value, executable) in entries.items():
        if kind == FILE:
            body[name] = {"type": FILE, "hash": value, "exec": executable}
        else:
            body[name] = {"type": DIR, "hash": value}
    return canonical_bytes(body)


#: The fingerprint of a tree with no regular file in it.
EMPTY_TREE = digest_bytes(tree_bytes({}))


def merkle_root(hashes: Mapping[str, str], executable: Collection[str] = ()) -> str:
    """The root digest of a tree given flat, as ``{relpath: "sha256:<hex>"}``.

    ``executable`` names the files whose executable bit is set. The on-disk
    workspace computes the same digest incrementally; this is the reference
    (and the in-memory sandbox's fingerprint, whose files are never executable).
    """
    nested: dict[str, object] = {}
    for path, file_hash in hashes.items():
        parts = path.split("/")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UnsupportedEntryError(path, "file below another file")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise UnsupportedEntryError(path, "file that is also a directory")
        node[parts[-1]] = (FILE, file_hash, path in executable)
    return _digest_of(nested)


def _digest_of(node: dict[str, object]) -> str:
    entries: dict[str, Entry] = {}
    for name, child in node.items():
        if isinstance(child, dict):
            entries[name] = (DIR, _digest_of(child), False)
        else:
            entries[name] = child  # type: ignore[assignment]
    return digest_bytes(tree_bytes(entries))


def parse_tree(tree_digest: str, data: bytes | None) -> dict[str, Entry]:
    """The entries of the tree object ``data`` fetched for ``tree_digest``; refuses damage.

    Missing bytes, bytes that do not hash to their digest, or a document that
    is not a canonical, well-formed tree object raise
    :class:`~tether.core.CheckpointCorruptError`: a snapshot is restored whole
    from verified objects or not at all.
    """
    body = verified_blob(tree_digest, data, "tree object")
    try:
        raw = strict_loads(body)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(f"tree object {tree_digest}: {exc}") from exc
    if not isinstance(raw, dict) or canonical_bytes(raw) != body:
        raise CheckpointCorruptError(f"tree object {tree_digest}: not a canonical object")
    entries: dict[str, Entry] = {}
    for name, value in raw.items():
        if name in ("", ".", "..") or "/" in name or "\x00" in name:
            raise CheckpointCorruptError(f"tree object {tree_digest}: bad entry name {name!r}")
        if not isinstance(value, dict):
            raise CheckpointCorruptError(f"tree object {tree_digest}: entry {name!r}")
        kind, hash_ = value.get("type"), value.get("hash")
        if not isinstance(hash_, str) or not _DIGEST.fullmatch(hash_):
            raise CheckpointCorruptError(f"tree object {tree_digest}: hash of {name!r}")
        if kind == FILE and set(value) == {"type", "hash", "exec"}:
            executable = value["exec"]
            if not isinstance(executable, bool):
                raise CheckpointCorruptError(f"tree object {tree_digest}: exec of {name!r}")
            entries[name] = (FILE, hash_, executable)
        elif kind == DIR and set(value) == {"type", "hash"}:
            entries[name] = (DIR, hash_, False)
        else:
            raise CheckpointCorruptError(f"tree object {tree_digest}: entry {name!r}")
    return entries


def verified_blob(blob_digest: str, data: bytes | None, what: str = "blob") -> bytes:
    """``data`` if it hashes to ``blob_digest``; a missing or damaged blob raises."""
    if data is None:
        raise CheckpointCorruptError(f"snapshot {what} {blob_digest} is missing from the store")
    if digest_bytes(data) != blob_digest:
        raise CheckpointCorruptError(
            f"snapshot {what} {blob_digest}: the stored bytes do not hash to their address"
        )
    return data


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What a restore must do, with every byte it writes already fetched and verified.

    ``deletes`` are file paths, ``rmdirs`` directories to remove once empty
    (deepest first), ``writes`` maps a path to ``(bytes, executable)`` and
    ``chmods`` a path whose bytes are right to the executable bit it needs.
    """

    deletes: tuple[str, ...]
    rmdirs: tuple[str, ...]
    writes: dict[str, tuple[bytes, bool]]
    chmods: dict[str, bool]


def plan_restore(
    target_root: str,
    current_root: str,
    current_dirs: Mapping[str, Mapping[str, Entry]],
    get_blob: Callable[[str], bytes | None],
) -> RestorePlan:
    """Compare the snapshot ``target_root`` with the current tree, top down.

    ``current_dirs`` maps a directory (``""`` for the root, else ``"a/b/"``)
    to its current entries. Subtrees whose digests agree are not visited, so
    the work (and the blobs fetched) is proportional to what differs. Every
    blob is fetched and verified here, before the caller writes anything.
    """
    deletes: list[str] = []
    rmdirs: list[str] = []
    writes: dict[str, tuple[bytes, bool]] = {}
    chmods: dict[str, bool] = {}

    def drop_dir(prefix: str) -> None:
        for name, (kind, _value, _exec) in current_dirs.get(prefix, {}).items():
            if kind == DIR:
                drop_dir(prefix + name + "/")
            else:
                deletes.append(prefix + name)
        rmdirs.append(prefix.rstrip("/"))

    def visit(target: str, current: str | None, prefix: str) -> None:
        if target == current:
            return
        wanted = parse_tree(target, get_blob(target))
        have = current_dirs.get(prefix, {}) if current is not None else {}
        for name, (kind, _value, _exec) in have.items():
            new = wanted.get(name)
            if new is not None and new[0] == kind:
                continue
            if kind == DIR:
                drop_dir(prefix + name + "/")
            else:
                deletes.append(prefix + name)
        for name, (kind, value, executable) in wanted.items():
            old = have.get(name)
            path = prefix + name
            if kind == DIR:
                visit(value, old[1] if old is not None and old[0] == DIR else None, path + "/")
            elif old is not None and old[0] == FILE and old[1] == value:
                if old[2] != executable:
                    chmods[path] = executable
            else:
                writes[path] = (verified_blob(value, get_blob(value)), executable)

    visit(target_root, current_root, "")
    # Deepest first, so a parent is empty by the time it is removed.
    rmdirs.sort(key=lambda d: d.count("/"), reverse=True)
    return RestorePlan(tuple(deletes), tuple(rmdirs), writes, chmods)


def snapshot_blobs(
    dirs: Mapping[str, Mapping[str, Entry]],
    digests: Mapping[str, str],
    read_file: Callable[[str, str], bytes],
    have: Callable[[str], bool],
    encode: Callable[[Mapping[str, Entry]], bytes] = tree_bytes,
    have_many: Callable[[list[str]], set[str]] | None = None,
) -> dict[str, bytes]:
    """The blobs reachable from the root directory (prefix ``""``) that the store lacks.

    ``dirs`` maps a directory prefix (``""``, ``"a/"``) to its entries and
    ``digests`` to its tree digest. The walk goes down one level at a time
    from the root, and a subtree the store already holds is not entered, so
    the cost follows what changed since the last snapshot, not the size of
    the tree. ``have_many`` (which of these digests are stored) asks the
    store once per level instead of once per digest.
    """

    def stored(candidates: list[str]) -> set[str]:
        if have_many is not None:
            return have_many(candidates) if candidates else set()
        return {d for d in candidates if have(d)}

    found: dict[str, bytes] = {}
    level = [""]
    while level:
        held = stored([digests[prefix] for prefix in level])
        below: list[str] = []
        files: list[tuple[str, str]] = []
        for prefix in level:
            tree_digest = digests[prefix]
            if tree_digest in found or tree_digest in held:
                continue
            entries = dirs[prefix]
            found[tree_digest] = encode(entries)
            for name, (kind, value, _exec) in entries.items():
                if kind == DIR:
                    below.append(prefix + name + "/")
                else:
                    files.append((prefix + name, value))
        held = stored(sorted({value for _, value in files if value not in found}))
        for path, value in files:
            if value not in found and value not in held:
                found[value] = read_file(path, value)
        level = below
    return found


def blobs_of_flat(
    hashes: Mapping[str, str],
    read_file: Callable[[str], bytes],
    have: Callable[[str], bool],
    have_many: Callable[[list[str]], set[str]] | None = None,
) -> tuple[str, dict[str, bytes]]:
    """The root and the missing blobs of a tree given flat (an in-memory adapter's files).

    The same objects the on-disk workspace stores, built from scratch: fine
    for the small trees an in-memory adapter holds. With ``have_many`` the
    store is asked once for every object of the tree, not once per object.
    """
    nested: dict[str, object] = {}
    for path in hashes:
        node = nested
        parts = path.split("/")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"{path}: a file and a directory share a name")
            node = child
        node[parts[-1]] = path
    trees: dict[str, bytes] = {}
    files: dict[str, str] = {}  # digest -> one path holding it

    def visit(node: dict[str, object]) -> str:
        entries: dict[str, Entry] = {}
        for name, child in node.items():
            if isinstance(child, dict):
                entries[name] = (DIR, visit(child), False)
            else:
                path = str(child)
                entries[name] = (FILE, hashes[path], False)
                files.setdefault(hashes[path], path)
        body = tree_bytes(entries)
        tree_digest = digest_bytes(body)
        trees.setdefault(tree_digest, body)
        return tree_digest

    root = visit(nested)
    wanted = sorted({*trees, *files})
    held = have_many(wanted) if have_many is not None else {d for d in wanted if have(d)}
    found: dict[str, bytes] = {}
    for found_digest in wanted:
        if found_digest in held:
            continue
        tree = trees.get(found_digest)
        found[found_digest] = tree if tree is not None else read_file(files[found_digest])
    return root, found


def flatten(root: str, get_blob: Callable[[str], bytes | None]) -> dict[str, tuple[bytes, bool]]:
    """Every file of the snapshot ``root``: path -> (verified bytes, executable)."""
    files: dict[str, tuple[bytes, bool]] = {}

    def visit(tree_digest: str, prefix: str) -> None:
        for name, (kind, value, executable) in parse_tree(
            tree_digest, get_blob(tree_digest)
        ).items():
            if kind == DIR:
                visit(value, prefix + name + "/")
            else:
                files[prefix + name] = (verified_blob(value, get_blob(value)), executable)

    visit(root, "")
    return files


def missing_blobs(
    root: str,
    get_blob: Callable[[str], bytes | None],
    stored: Callable[[list[str]], set[str]],
) -> list[str]:
    """Every blob of the snapshot ``root`` that ``stored`` does not hold, a tree level at a time.

    A damaged tree object raises :class:`~tether.core.CheckpointCorruptError`:
    whoever asks (a rewind) refuses whole rather than restores half.
    """
    missing: list[str] = []
    level, seen = [root], {root}
    while level:
        held = stored(level)
        below: list[str] = []
        files: set[str] = set()
        for tree in level:
            if tree not in held:
                missing.append(tree)
                continue
            for kind, value, _executable in parse_tree(tree, get_blob(tree)).values():
                if kind == DIR:
                    below.append(value)
                else:
                    files.add(value)
        wanted = sorted(files)
        held_files = stored(wanted) if wanted else set()
        missing += [f for f in wanted if f not in held_files]
        level = [d for d in dict.fromkeys(below) if d not in seen]
        seen.update(level)
    return missing
