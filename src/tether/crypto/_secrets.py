"""Secret boxes: AEAD keys that seal secret agent-context items at rest.

A :class:`SecretBox` is a keyring of AES-256-GCM keys, kept apart from the
checkpoint MAC :class:`~tether.crypto.Keyring` on purpose: who may verify a
checkpoint is not who may read the secrets inside it, and rotating one must
not touch the other. The conventions are the keyring's: named keys, one
``active`` key seals, ``verify`` keys only open (a key kept through a
rotation), ``retired`` keys open nothing; the secret bytes never appear in a
``repr`` or an error.

Each seal draws a fresh random 96-bit nonce. The associated data binds the
run id, the item's name and the key id, so a sealed item moved to another run
or another name does not open. A one-way check value (as the checkpoint
envelope's ``kcv``) tells "the box holds another key under this id" apart
from "the ciphertext was altered".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tether.core import (
    CanonicalJSONError,
    IntegrityError,
    JSONValue,
    PolicyError,
    TetherError,
    canonical_bytes,
    strict_loads,
)
from tether.core._fields import Fields
from tether.crypto._keyring import Keyring, KeyStatus
from tether.crypto._private import write_private

ALG = "A256GCM"
SECRET_KEY_BYTES = 32
NONCE_BYTES = 12
ENV_SECRET_KEYS = "TETHER_SECRET_KEYS"
ENV_SECRET_KEYS_FILE = "TETHER_SECRET_KEYS_FILE"
_DOMAIN = "tether.context-secret.v1"
# The keyring's label: a secret key equal to a checkpoint key shows as an equal check value.
_CHECK_LABEL = b"tether key check v1"


class SecretKeyError(TetherError):
    """A secret-key document is malformed, unreadable or too open, or no key can do the job.

    ``key_id`` names the key involved, when one is (never its bytes).
    """

    def __init__(self, message: str, *, key_id: str | None = None) -> None:
        self.key_id = key_id
        super().__init__(message)


class SecretIntegrityError(IntegrityError):
    """A sealed secret item does not open: altered, or moved to another run or name.

    Fails closed; nothing is released. ``name`` is the item, ``key_id`` its key.
    """

    def __init__(self, message: str, *, run_id: str | None, name: str, key_id: str) -> None:
        self.name = name
        self.key_id = key_id
        super().__init__(message, run_id=run_id)


class SecretAccessError(PolicyError):
    """Secret items were withheld and the caller asked for refusal, not redaction.

    ``names`` are the withheld items. Recover with a principal allowed to read
    secrets and the secret key, or ask for redaction instead.
    """

    def __init__(self, run_id: str, names: tuple[str, ...], why: str) -> None:
        self.names = names
        super().__init__(
            f"run {run_id}: {len(names)} secret context item(s) withheld ({', '.join(names)}): "
            f"{why}; nothing was restored",
            run_id=run_id,
        )


@dataclass(frozen=True, slots=True)
class SealedSecret:
    """One secret item as stored: ciphertext only, and what is needed to open it."""

    key_id: str
    kcv: str
    nonce: bytes
    ciphertext: bytes

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "alg": ALG,
            "ciphertext": _b64(self.ciphertext),
            "kcv": self.kcv,
            "key_id": self.key_id,
            "nonce": _b64(self.nonce),
        }

    @classmethod
    def from_fields(cls, f: Fields) -> SealedSecret:
        """Parse a stored item; errors go through ``f``'s error factory."""
        if f.str("alg") != ALG:
            f.fail(f.name("alg"), f"expected {ALG!r}")
        sealed = cls(
            key_id=f.str("key_id"),
            kcv=f.str("kcv"),
            nonce=_unb64_field(f, "nonce"),
            ciphertext=_unb64_field(f, "ciphertext"),
        )
        if len(sealed.nonce) != NONCE_BYTES:
            f.fail(f.name("nonce"), f"expected {NONCE_BYTES} bytes")
        f.done()
        return sealed


@dataclass(frozen=True, slots=True)
class SecretKey:
    """One named AEAD key. The key bytes are never shown."""

    key_id: str
    status: KeyStatus
    _secret: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"SecretKey(key_id={self.key_id!r}, status={self.status.value!r})"

    @property
    def check_value(self) -> str:
        """A one-way tag that tells two keys with the same id apart, revealing neither."""
        return hmac.new(self._secret, _CHECK_LABEL, hashlib.sha256).hexdigest()[:32]


class SecretBox:
    """AES-256-GCM keys for secret context items: the active key seals, any known key opens."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, SecretKey]) -> None:
        active = [k for k in keys.values() if k.status is KeyStatus.ACTIVE]
        if len(active) > 1:
            raise SecretKeyError("a secret box has at most one active key")
        self._keys = dict(keys)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}:{v.status.value}" for k, v in sorted(self._keys.items()))
        return f"SecretBox({inner})"

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    @property
    def active(self) -> SecretKey:
        for key in self._keys.values():
            if key.status is KeyStatus.ACTIVE:
                return key
        raise SecretKeyError("the secret box has no active key; rotate in a new one to seal")

    # -- sealing -------------------------------------------------------------

    def seal(self, value: JSONValue, *, run_id: str, name: str) -> SealedSecret:
        """Encrypt ``value`` (any JSON) for item ``name`` of run ``run_id`` under the active key."""
        key = self.active
        try:
            plain = canonical_bytes(value)
        except CanonicalJSONError:
            # The encoder's message may quote the value; this one never does.
            raise SecretKeyError(
                f"secret context item {name!r} is not a JSON value; nothing was sealed",
                key_id=key.key_id,
            ) from None
        nonce = secrets.token_bytes(NONCE_BYTES)
        ciphertext = AESGCM(key._secret).encrypt(nonce, plain, _aad(run_id, name, key.key_id))
        return SealedSecret(key.key_id, key.check_value, nonce, ciphertext)

    def open(self, sealed: SealedSecret, *, run_id: str, name: str) -> JSONValue:
        """Decrypt item ``name`` of run ``run_id``, or fail closed with a typed error."""
        key = self._keys.get(sealed.key_id)
        if key is None:
            raise SecretKeyError(
                f"secret context item {name!r} is sealed under key id {sealed.key_id!r}, "
                f"which the secret box does not hold (it holds {list(self.key_ids)})",
                key_id=sealed.key_id,
            )
        if key.status is KeyStatus.RETIRED:
            raise SecretKeyError(
                f"secret context item {name!r} is sealed under retired key id "
                f"{sealed.key_id!r}; re-seal under a live key before retiring it",
                key_id=sealed.key_id,
            )
        if not hmac.compare_digest(key.check_value, sealed.kcv):
            raise SecretKeyError(
                f"key id {sealed.key_id!r} in the secret box is not the key that sealed "
                f"item {name!r}",
                key_id=sealed.key_id,
            )
        try:
            plain = AESGCM(key._secret).decrypt(
                sealed.nonce, sealed.ciphertext, _aad(run_id, name, sealed.key_id)
            )
        except InvalidTag:
            raise SecretIntegrityError(
                f"run {run_id}: secret context item {name!r} does not authenticate: its "
                "ciphertext was altered, or it was moved from another run or item",
                run_id=run_id,
                name=name,
                key_id=sealed.key_id,
            ) from None
        try:
            return strict_loads(plain)
        except CanonicalJSONError:
            raise SecretIntegrityError(
                f"run {run_id}: secret context item {name!r} opened to bytes that are not JSON",
                run_id=run_id,
                name=name,
                key_id=sealed.key_id,
            ) from None

    def shares_key_with(self, keyring: Keyring) -> str | None:
        """The id of a checkpoint key whose bytes are also a key of this box, if any."""
        mine = {k.check_value for k in self._keys.values() if k.status is not KeyStatus.RETIRED}
        for key_id in keyring.key_ids:
            key = keyring.get(key_id)
            if key is not None and key.status is not KeyStatus.RETIRED and key.check_value in mine:
                return key_id
        return None

    # -- building ------------------------------------------------------------

    @classmethod
    def generate(cls, key_id: str = "s1") -> SecretBox:
        """A new box with one fresh random active key."""
        return cls({key_id: SecretKey(key_id, KeyStatus.ACTIVE, AESGCM.generate_key(256))})

    @classmethod
    def single(cls, key_id: str, secret: bytes) -> SecretBox:
        """A box with one active key made from ``secret`` (exactly 32 bytes)."""
        _check_secret(key_id, secret)
        return cls({key_id: SecretKey(key_id, KeyStatus.ACTIVE, secret)})

    def rotate(self, key_id: str, secret: bytes | None = None) -> SecretBox:
        """A box where ``key_id`` seals and the previous active key only opens."""
        if key_id in self._keys:
            raise SecretKeyError(f"key id {key_id!r} is already in the secret box", key_id=key_id)
        secret = AESGCM.generate_key(256) if secret is None else secret
        _check_secret(key_id, secret)
        keys = {
            kid: SecretKey(kid, KeyStatus.VERIFY, k._secret) if k.status is KeyStatus.ACTIVE else k
            for kid, k in self._keys.items()
        }
        keys[key_id] = SecretKey(key_id, KeyStatus.ACTIVE, secret)
        return SecretBox(keys)

    def retire(self, key_id: str) -> SecretBox:
        """A box where ``key_id`` opens nothing (its bytes are dropped)."""
        if key_id not in self._keys:
            raise SecretKeyError(f"no key id {key_id!r} to retire", key_id=key_id)
        keys = dict(self._keys)
        keys[key_id] = SecretKey(key_id, KeyStatus.RETIRED, b"")
        return SecretBox(keys)

    # -- files and the environment --------------------------------------------

    @classmethod
    def from_json(cls, data: bytes | str) -> SecretBox:
        """Parse ``{"keys": [{"id", "status", "secret"}...]}``; secrets are base64url."""
        try:
            doc = strict_loads(data)
        except CanonicalJSONError as exc:
            raise SecretKeyError(f"secret-key document is not strict JSON: {exc}") from None
        f = Fields(doc, "", lambda fld, problem: SecretKeyError(f"secret keys {fld}: {problem}"))
        keys: dict[str, SecretKey] = {}
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
                raise SecretKeyError(f"key id {key_id!r} appears twice", key_id=key_id)
            keys[key_id] = SecretKey(key_id, status, secret)
        f.done()
        if not keys:
            raise SecretKeyError("the secret-key document holds no keys")
        return cls(keys)

    def to_json(self) -> bytes:
        """The key document, key bytes included: write it only to a 0600 file."""
        entries: list[dict[str, Any]] = []
        for key_id, key in sorted(self._keys.items()):
            entry: dict[str, Any] = {"id": key_id, "status": key.status.value}
            if key.status is not KeyStatus.RETIRED:
                entry["secret"] = _b64(key._secret)
            entries.append(entry)
        return canonical_bytes({"keys": entries})

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SecretBox:
        """Read a key document, refusing a file that group or others can read or write."""
        where = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SecretKeyError(f"cannot read secret-key file {where!r}: {exc.strerror}") from exc
        try:
            # Checked on the open descriptor: the file read is the file checked.
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o077:
                raise SecretKeyError(
                    f"secret-key file {where!r} has mode {mode:04o}; it must be readable by "
                    f"its owner only (chmod 600 {where})"
                )
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read()
        except OSError as exc:
            raise SecretKeyError(f"cannot read secret-key file {where!r}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        return cls.from_json(data)

    def write_file(self, path: str | os.PathLike[str], *, replace: bool = False) -> None:
        """Write the key document to ``path`` with mode 0600, atomically.

        An existing file is never written over unless ``replace=True``: its
        keys open every context sealed under them.
        """
        try:
            write_private(path, self.to_json(), what="secret-key file", replace=replace)
        except FileExistsError as exc:
            raise SecretKeyError(
                f"{exc}; its keys open the contexts sealed under them"
                if exc.filename is None
                else f"secret-key file {os.fspath(path)!r} appeared while writing; nothing "
                "was written over it"
            ) from exc
        except OSError as exc:
            raise SecretKeyError(
                f"cannot write secret-key file {os.fspath(path)!r}: {exc.strerror}"
            ) from exc

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SecretBox:
        """``TETHER_SECRET_KEYS`` (the document) or ``TETHER_SECRET_KEYS_FILE`` (its path)."""
        env = os.environ if environ is None else environ
        if env.get(ENV_SECRET_KEYS):
            return cls.from_json(env[ENV_SECRET_KEYS])
        if env.get(ENV_SECRET_KEYS_FILE):
            return cls.from_file(env[ENV_SECRET_KEYS_FILE])
        raise SecretKeyError(
            f"no secret keys: set {ENV_SECRET_KEYS_FILE} to a key file or "
            f"{ENV_SECRET_KEYS} to its JSON"
        )


def _aad(run_id: str, name: str, key_id: str) -> bytes:
    return canonical_bytes({"domain": _DOMAIN, "key_id": key_id, "name": name, "run_id": run_id})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _unb64_field(f: Fields, key: str) -> bytes:
    text = f.str(key)
    try:
        return base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        f.fail(f.name(key), "not base64url")


def _decode_secret(key_id: str, text: str) -> bytes:
    try:
        secret = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise SecretKeyError(f"key {key_id!r}: secret is not base64url", key_id=key_id) from None
    _check_secret(key_id, secret)
    return secret


def _check_secret(key_id: str, secret: bytes) -> None:
    if len(secret) != SECRET_KEY_BYTES:
        raise SecretKeyError(
            f"key {key_id!r} is {len(secret)} bytes; AES-256-GCM keys are exactly "
            f"{SECRET_KEY_BYTES}",
            key_id=key_id,
        )
