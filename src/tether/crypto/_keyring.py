"""Keyrings: named HMAC keys with one active signer, verify-only and retired keys.

The secret bytes live only inside :class:`Key`; its ``repr`` and every error
name the key id, never the secret. A keyring is supplied by the caller from a
file or an environment variable and is never written into a checkpoint.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tether.core import CanonicalJSONError, TetherError, canonical_bytes, strict_loads
from tether.core._fields import Fields
from tether.crypto._private import write_private

MIN_KEY_BYTES = 32
ENV_KEYRING = "TETHER_KEYRING"
ENV_KEYRING_FILE = "TETHER_KEYRING_FILE"
#: Where the keyring lives when none is named: under the user's data directory
#: (``$XDG_DATA_HOME``, else ``~/.local/share``), apart from the stores it seals.
DEFAULT_KEYRING = Path("tether") / "keyring.json"
_CHECK_LABEL = b"tether key check v1"


class KeyringError(TetherError):
    """A keyring document is malformed, a key too short, or no key is usable."""


class KeyStatus(StrEnum):
    """What a key may still do."""

    ACTIVE = "active"  # signs and verifies; exactly one per keyring
    VERIFY = "verify"  # verifies only: an older key kept through a rotation
    RETIRED = "retired"  # trusted for nothing; signatures under it are refused


@dataclass(frozen=True, slots=True)
class Key:
    """One named key. The secret is never shown."""

    key_id: str
    status: KeyStatus
    _secret: bytes = field(repr=False)
    # The check value, computed once (it is asked at every seal and open).
    _check: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check = hmac.digest(self._secret, _CHECK_LABEL, "sha256").hex()[:32]
        object.__setattr__(self, "_check", check)

    def __repr__(self) -> str:
        return f"Key(key_id={self.key_id!r}, status={self.status.value!r})"

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 over ``parts``, each prefixed with its length (one pass, in C)."""
        framed = b"".join(len(part).to_bytes(8, "big") + part for part in parts)
        return hmac.digest(self._secret, framed, "sha256")

    @property
    def check_value(self) -> str:
        """A one-way tag that tells two keys with the same id apart, revealing neither."""
        return self._check


class Keyring:
    """A set of named keys with exactly one active key (unless all are retired)."""

    __slots__ = ("_keys", "source")

    def __init__(self, keys: Mapping[str, Key], *, source: str | None = None) -> None:
        active = [k for k in keys.values() if k.status is KeyStatus.ACTIVE]
        if len(active) > 1:
            raise KeyringError("a keyring has at most one active key")
        self._keys = dict(keys)
        #: Where it was read from (a file's path, or the variable that held it), for
        #: messages about it; ``None`` for one built in memory. Never the secrets.
        self.source = source

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}:{v.status.value}" for k, v in sorted(self._keys.items()))
        return f"Keyring({inner})"

    @property
    def active(self) -> Key:
        for key in self._keys.values():
            if key.status is KeyStatus.ACTIVE:
                return key
        raise KeyringError("the keyring has no active key; rotate in a new one to sign")

    def get(self, key_id: str) -> Key | None:
        return self._keys.get(key_id)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    # -- building ----------------------------------------------------------

    @classmethod
    def generate(cls, key_id: str = "k1") -> Keyring:
        """A new keyring with one fresh random active key."""
        return cls({key_id: Key(key_id, KeyStatus.ACTIVE, secrets.token_bytes(MIN_KEY_BYTES))})

    @classmethod
    def single(cls, key_id: str, secret: bytes) -> Keyring:
        """A keyring with one active key made from ``secret``."""
        _check_secret(key_id, secret)
        return cls({key_id: Key(key_id, KeyStatus.ACTIVE, secret)})

    def rotate(self, key_id: str, secret: bytes | None = None) -> Keyring:
        """A keyring where ``key_id`` signs and the previous active key only verifies."""
        if key_id in self._keys:
            raise KeyringError(f"key id {key_id!r} is already in the keyring")
        secret = secrets.token_bytes(MIN_KEY_BYTES) if secret is None else secret
        _check_secret(key_id, secret)
        keys = {
            kid: Key(kid, KeyStatus.VERIFY, k._secret) if k.status is KeyStatus.ACTIVE else k
            for kid, k in self._keys.items()
        }
        keys[key_id] = Key(key_id, KeyStatus.ACTIVE, secret)
        return Keyring(keys)

    def retire(self, key_id: str) -> Keyring:
        """A keyring where ``key_id`` is trusted for nothing."""
        key = self._keys.get(key_id)
        if key is None:
            raise KeyringError(f"no key id {key_id!r} to retire")
        keys = dict(self._keys)
        keys[key_id] = Key(key_id, KeyStatus.RETIRED, b"")
        return Keyring(keys)

    # -- files and the environment ----------------------------------------

    @classmethod
    def from_json(cls, data: bytes | str) -> Keyring:
        """Parse ``{"keys": [{"id", "status", "secret"}...]}``; secrets are base64url."""
        try:
            doc = strict_loads(data)
        except CanonicalJSONError as exc:
            raise KeyringError(f"keyring is not strict JSON: {exc}") from exc
        f = Fields(doc, "", lambda fld, problem: KeyringError(f"keyring {fld}: {problem}"))
        keys: dict[str, Key] = {}
        for entry in f.items("keys"):
            key_id = entry.str("id")
            status_text = entry.str("status")
            try:
                status = KeyStatus(status_text)
            except ValueError:
                entry.fail(entry.name("status"), f"unknown status {status_text!r}")
            if status is KeyStatus.RETIRED:
                entry.optional_raw("secret")
                secret = b""
            else:
                secret = _decode_secret(key_id, entry.str("secret"))
            entry.done()
            if key_id in keys:
                raise KeyringError(f"key id {key_id!r} appears twice")
            keys[key_id] = Key(key_id, status, secret)
        f.done()
        if not keys:
            raise KeyringError("the keyring holds no keys")
        return cls(keys)

    def to_json(self) -> bytes:
        """The keyring document, secrets included: write it only to a 0600 file."""
        entries: list[dict[str, Any]] = []
        for key_id, key in sorted(self._keys.items()):
            entry: dict[str, Any] = {"id": key_id, "status": key.status.value}
            if key.status is not KeyStatus.RETIRED:
                entry["secret"] = base64.urlsafe_b64encode(key._secret).decode("ascii")
            entries.append(entry)
        return canonical_bytes({"keys": entries})

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keyring in ``path``, refused if other users may read or write it."""
        try:
            data = Path(path).read_bytes()
            _check_private(Path(path))
        except OSError as exc:
            missing = isinstance(exc, FileNotFoundError)
            raise KeyringError(
                f"cannot read keyring file {os.fspath(path)!r}: {exc.strerror}"
                + (f"; make one with `tether keyring new {os.fspath(path)}`" if missing else "")
            ) from exc
        keyring = cls.from_json(data)
        keyring.source = os.fspath(path)
        return keyring

    def write_file(self, path: str | os.PathLike[str], *, replace: bool = False) -> None:
        """Write the keyring to ``path`` with mode 0600, atomically.

        An existing file is never written over unless ``replace=True``: the keys
        it holds verify every checkpoint signed under them, and a keyring lost
        this way cannot be recovered.
        """
        try:
            write_private(path, self.to_json(), what="keyring file", replace=replace)
        except FileExistsError as exc:
            raise KeyringError(
                f"{exc}; its keys verify the checkpoints signed under them"
                if exc.filename is None
                else f"keyring file {os.fspath(path)!r} appeared while writing; nothing was "
                "written over it"
            ) from exc
        except OSError as exc:
            raise KeyringError(
                f"cannot write keyring file {os.fspath(path)!r}: {exc.strerror}"
            ) from exc

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """``TETHER_KEYRING`` (the document) or ``TETHER_KEYRING_FILE`` (its path), else
        the default keyring file if it exists (see :meth:`default`); never creates one."""
        env = os.environ if environ is None else environ
        named = _named(env)
        if named is not None:
            return named
        path = default_keyring_path(env)
        if path is not None and path.exists():
            return cls.from_file(path)
        raise KeyringError(
            f"no keyring: set {ENV_KEYRING_FILE} to a keyring file or {ENV_KEYRING} to its JSON"
            + (
                ""
                if path is None
                else f"; the default one, {path}, does not exist yet (tether.guard(...) or "
                f"Keyring.default() makes it on first use, or `tether keyring new {path}`)"
            )
        )

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """The keyring to use when none is named, made on first use.

        ``TETHER_KEYRING`` or ``TETHER_KEYRING_FILE`` when set; else the file
        :func:`default_keyring_path` names (``~/.local/share/tether/keyring.json``,
        or under ``$XDG_DATA_HOME``), created there the first time with one
        fresh key: mode 0600 in a 0700 directory, never printed. A file others
        can read is refused. Keep it: checkpoints sealed with it verify only
        with it (copy it to every machine that recovers the same runs).
        """
        env = os.environ if environ is None else environ
        named = _named(env)
        if named is not None:
            return named
        path = default_keyring_path(env)
        if path is None:
            raise KeyringError(
                "no keyring and no place for the default one: set HOME or XDG_DATA_HOME, or "
                f"{ENV_KEYRING_FILE} to a keyring file (`tether keyring new PATH` makes one)"
            )
        return cls.load_or_create(path)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keyring in ``path``; the first call makes it (one fresh key, mode 0600).

        Two processes making it at once end with one keyring: the file appears
        whole or not at all (written aside, then linked into place), and the
        loser reads the winner's. A keyring file others can read is refused.
        """
        target = Path(path)
        if not target.exists():
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fresh = cls.generate(f"k-{secrets.token_hex(4)}")
            aside = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                data = memoryview(fresh.to_json())
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(aside, target)  # refuses to replace: another process's keyring stays
            except FileExistsError:
                pass
            finally:
                os.unlink(aside)
            _fsync_dir(target.parent)
        _check_private(target)
        return cls.from_file(target)


def default_keyring_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the default keyring lives: ``$XDG_DATA_HOME/tether/keyring.json``, else
    ``~/.local/share/tether/keyring.json``; ``None`` when neither variable is set."""
    env = os.environ if environ is None else environ
    data = env.get("XDG_DATA_HOME", "")
    if data and os.path.isabs(data):  # the XDG spec: a relative value is ignored
        return Path(data) / DEFAULT_KEYRING
    home = env.get("HOME", "")
    if home:
        return Path(home) / ".local" / "share" / DEFAULT_KEYRING
    return None


def _named(env: Mapping[str, str]) -> Keyring | None:
    """The keyring the environment names, or ``None`` when it names none."""
    if env.get(ENV_KEYRING):
        keyring = Keyring.from_json(env[ENV_KEYRING])
        keyring.source = f"${ENV_KEYRING}"
        return keyring
    if env.get(ENV_KEYRING_FILE):
        return Keyring.from_file(env[ENV_KEYRING_FILE])
    return None


def _check_private(path: Path) -> None:
    """Refuse a keyring file that other users may read or write (as ssh refuses a key)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise KeyringError(f"cannot read keyring file {str(path)!r}: {exc.strerror}") from exc
    if mode & 0o077:
        raise KeyringError(
            f"keyring file {str(path)!r} is open to other users (mode {mode & 0o777:04o}); "
            f"make it private: chmod 600 {path}"
        )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _decode_secret(key_id: str, text: str) -> bytes:
    try:
        secret = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise KeyringError(f"key {key_id!r}: secret is not base64url") from exc
    _check_secret(key_id, secret)
    return secret


def _check_secret(key_id: str, secret: bytes) -> None:
    if len(secret) < MIN_KEY_BYTES:
        raise KeyringError(
            f"key {key_id!r} is {len(secret)} bytes; keys shorter than {MIN_KEY_BYTES} are refused"
        )
