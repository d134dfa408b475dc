"""Signed evidence: approvals and reviewer decisions, signed outside the runtime.

A person (an approver or a reviewer) signs a canonical JSON body with their
own key. The runtime holds only *trust roots*: for Ed25519 the public half,
so a runtime that can check an approval cannot forge one. HMAC roots are
accepted where a deployment has no asymmetric keys (then the runtime could
forge, and the docs say so).

A signed document is ``{"body": {...}, "signer": id, "alg": ..., "signature":
base64url}``; the signature covers a domain label and the canonical body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tether.core import (
    CanonicalJSONError,
    EvidenceSignatureError,
    TetherError,
    UnknownSignerError,
    canonical_bytes,
    strict_loads,
)
from tether.core._fields import Fields
from tether.crypto._keyring import MIN_KEY_BYTES

_DOMAIN = b"tether.evidence.v1\x00"


class Role(StrEnum):
    """What a signer is trusted to sign."""

    APPROVER = "approver"
    REVIEWER = "reviewer"
    #: A person who may admit a recovery, select a rewind point or sign a fork
    #: (as the policy says).
    OPERATOR = "operator"
    #: A worker process: it admits its own recoveries by signing them.
    WORKER = "worker"


class Alg(StrEnum):
    """Signature algorithms for evidence."""

    ED25519 = "ed25519"
    HMAC_SHA256 = "hmac-sha256"


class TrustError(TetherError):
    """A trust-root or signing-key document is malformed."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise TrustError(f"{what} is not base64url") from exc


@dataclass(frozen=True, slots=True)
class Signer:
    """A private signing key held by a person's tool, never by the runtime."""

    signer_id: str
    role: Role
    alg: Alg
    _secret: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"Signer(signer_id={self.signer_id!r}, role={self.role.value!r}, alg={self.alg.value!r})"

    @classmethod
    def generate(cls, signer_id: str, role: Role | str) -> Signer:
        """A fresh Ed25519 key pair for ``signer_id``."""
        key = Ed25519PrivateKey.generate()
        raw = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return cls(signer_id, Role(role), Alg.ED25519, raw)

    @classmethod
    def hmac(cls, signer_id: str, role: Role | str, secret: bytes) -> Signer:
        """An HMAC signer; its secret must also be given to the runtime as a trust root."""
        if len(secret) < MIN_KEY_BYTES:
            raise TrustError(
                f"HMAC signer {signer_id!r} needs a key of at least {MIN_KEY_BYTES} bytes"
            )
        return cls(signer_id, Role(role), Alg.HMAC_SHA256, secret)

    def sign(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The signed document for ``body``."""
        message = _DOMAIN + canonical_bytes(dict(body))
        if self.alg is Alg.ED25519:
            signature = Ed25519PrivateKey.from_private_bytes(self._secret).sign(message)
        else:
            signature = hmac.new(self._secret, message, hashlib.sha256).digest()
        return {
            "body": dict(body),
            "signer": self.signer_id,
            "alg": self.alg.value,
            "signature": _b64(signature),
        }

    def trust_root(self) -> dict[str, Any]:
        """The entry a runtime needs to verify this signer: the public half for Ed25519."""
        entry: dict[str, Any] = {
            "id": self.signer_id,
            "role": self.role.value,
            "alg": self.alg.value,
        }
        if self.alg is Alg.ED25519:
            public = Ed25519PrivateKey.from_private_bytes(self._secret).public_key()
            entry["public_key"] = _b64(
                public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            )
        else:
            entry["secret"] = _b64(self._secret)
        return entry

    def to_json(self) -> bytes:
        """The private key file's content: write it only with mode 0600."""
        return canonical_bytes(
            {
                "id": self.signer_id,
                "role": self.role.value,
                "alg": self.alg.value,
                "private_key": _b64(self._secret),
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> Signer:
        f = _fields(data, "signing key")
        signer = cls(
            f.str("id"),
            Role(_choice(f, "role", Role)),
            Alg(_choice(f, "alg", Alg)),
            _unb64(f.str("private_key"), "private_key"),
        )
        f.done()
        # Checked here, not at the first signature: a damaged key file must not
        # get as far as showing a person what they are about to sign.
        if signer.alg is Alg.ED25519 and len(signer._secret) != 32:
            raise TrustError(
                f"signing key {signer.signer_id!r}: an Ed25519 private key is 32 bytes"
            )
        if signer.alg is Alg.HMAC_SHA256 and len(signer._secret) < MIN_KEY_BYTES:
            raise TrustError(
                f"signing key {signer.signer_id!r}: HMAC keys shorter than {MIN_KEY_BYTES} "
                "bytes are refused"
            )
        return signer

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Signer:
        try:
            return cls.from_json(Path(path).read_bytes())
        except OSError as exc:
            raise TrustError(
                f"cannot read signing key {os.fspath(path)!r}: {exc.strerror}"
            ) from exc

    def write_file(self, path: str | os.PathLike[str]) -> None:
        """Write the private key with mode 0600 (created that way, never widened).

        An existing file is never written over: the key it holds may be the only
        copy of a signer a trust file names.
        """
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as exc:
            raise TrustError(
                f"signer key file {os.fspath(path)!r} already exists; nothing was written "
                "over it (choose another path, or remove it once no trust file names it)"
            ) from exc
        except OSError as exc:
            raise TrustError(
                f"cannot write signer key file {os.fspath(path)!r}: {exc.strerror}"
            ) from exc
        try:
            os.write(fd, self.to_json())
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class _Root:
    signer_id: str
    role: Role
    alg: Alg
    material: bytes = field(repr=False)


class TrustRoots:
    """The signers a runtime trusts, by id and role."""

    __slots__ = ("_roots",)

    def __init__(self, roots: Mapping[str, _Root] | None = None) -> None:
        self._roots = dict(roots or {})

    def __repr__(self) -> str:
        return (
            "TrustRoots("
            + ", ".join(f"{k}:{v.role.value}" for k, v in sorted(self._roots.items()))
            + ")"
        )

    def __bool__(self) -> bool:
        return bool(self._roots)

    def roles(self) -> set[Role]:
        return {root.role for root in self._roots.values()}

    def role_of(self, signer_id: str) -> Role | None:
        """The role ``signer_id`` holds now (``None``: not trusted, e.g. revoked)."""
        root = self._roots.get(signer_id)
        return None if root is None else root.role

    @classmethod
    def of(cls, *entries: Mapping[str, Any]) -> TrustRoots:
        """Trust roots from entries as :meth:`Signer.trust_root` produces them."""
        return cls.from_json(canonical_bytes({"signers": [dict(e) for e in entries]}))

    @classmethod
    def from_json(cls, data: bytes | str) -> TrustRoots:
        f = _fields(data, "trust roots")
        roots: dict[str, _Root] = {}
        for entry in f.items("signers"):
            signer_id = entry.str("id")
            role = Role(_choice(entry, "role", Role))
            alg = Alg(_choice(entry, "alg", Alg))
            if alg is Alg.ED25519:
                material = _unb64(entry.str("public_key"), "public_key")
                if len(material) != 32:
                    raise TrustError(f"signer {signer_id!r}: an Ed25519 public key is 32 bytes")
            else:
                material = _unb64(entry.str("secret"), "secret")
                if len(material) < MIN_KEY_BYTES:
                    raise TrustError(
                        f"signer {signer_id!r}: HMAC keys shorter than {MIN_KEY_BYTES} bytes are refused"
                    )
            entry.done()
            if signer_id in roots:
                raise TrustError(f"signer {signer_id!r} appears twice")
            roots[signer_id] = _Root(signer_id, role, alg, material)
        f.done()
        return cls(roots)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TrustRoots:
        try:
            return cls.from_json(Path(path).read_bytes())
        except OSError as exc:
            raise TrustError(
                f"cannot read trust roots {os.fspath(path)!r}: {exc.strerror}"
            ) from exc

    def verify(self, document: Any, role: Role) -> dict[str, Any]:
        """Check a signed document; return its body. Raises on an unknown signer or bad signature."""
        if not isinstance(document, dict) or set(document) != {
            "body",
            "signer",
            "alg",
            "signature",
        }:
            raise EvidenceSignatureError(
                "signed evidence must have exactly body, signer, alg, signature"
            )
        signer_id, body = document["signer"], document["body"]
        if not isinstance(signer_id, str) or not isinstance(body, dict):
            raise EvidenceSignatureError("signed evidence has a malformed signer or body")
        root = self._roots.get(signer_id)
        if root is None or root.role is not role:
            raise UnknownSignerError(signer_id, role.value)
        if document["alg"] != root.alg.value:
            raise EvidenceSignatureError(f"evidence from {signer_id!r} uses another algorithm")
        if not isinstance(document["signature"], str):
            raise EvidenceSignatureError(f"evidence from {signer_id!r} has no signature text")
        try:
            signature = _unb64(document["signature"], "signature")
            message = _DOMAIN + canonical_bytes(body)
        except (TrustError, CanonicalJSONError) as exc:
            raise EvidenceSignatureError(
                f"evidence from {signer_id!r} is malformed: {exc}"
            ) from exc
        if root.alg is Alg.ED25519:
            try:
                Ed25519PublicKey.from_public_bytes(root.material).verify(signature, message)
            except InvalidSignature as exc:
                raise EvidenceSignatureError(f"signature of {signer_id!r} does not verify") from exc
        else:
            expected = hmac.new(root.material, message, hashlib.sha256).digest()
            if not hmac.compare_digest(expected, signature):
                raise EvidenceSignatureError(f"signature of {signer_id!r} does not verify")
        return body

    def published(self) -> dict[str, Any]:
        """What may be kept of these roots beside a run: ids, roles, algorithms, public keys.

        An HMAC root's entry keeps its id, role and algorithm only: its secret
        is a signing key, and never leaves the runtime.
        """
        signers: list[dict[str, Any]] = []
        for root in sorted(self._roots.values(), key=lambda r: r.signer_id):
            entry: dict[str, Any] = {
                "id": root.signer_id,
                "role": root.role.value,
                "alg": root.alg.value,
            }
            if root.alg is Alg.ED25519:
                entry["public_key"] = _b64(root.material)
            signers.append(entry)
        return {"signers": signers}


class PublishedTrust:
    """A runtime's trust roots as kept in the store for its runs (see :meth:`TrustRoots.published`).

    Enough for the people's tools to refuse, before anything is signed, a
    signer the runtime would refuse: one it does not trust in that role, or
    (Ed25519) a key that is not the one it trusts under that id. An HMAC
    signer's key cannot be compared (its secret is not kept), only its id,
    role and algorithm; the runtime verifies every signature itself.
    """

    __slots__ = ("_keyed", "_unkeyed")

    def __init__(self, keyed: TrustRoots, unkeyed: Mapping[str, tuple[Role, Alg]]) -> None:
        self._keyed = keyed
        self._unkeyed = dict(unkeyed)

    def __repr__(self) -> str:
        return f"PublishedTrust({self._keyed!r}, hmac={sorted(self._unkeyed)})"

    def role_of(self, signer_id: str) -> Role | None:
        """The role ``signer_id`` is trusted in (``None``: not trusted)."""
        unkeyed = self._unkeyed.get(signer_id)
        return unkeyed[0] if unkeyed is not None else self._keyed.role_of(signer_id)

    @classmethod
    def from_json(cls, data: bytes | str) -> PublishedTrust:
        """Strictly parse what :meth:`TrustRoots.published` wrote (a secret in it is refused)."""
        f = _fields(data, "published trust roots")
        keyed: list[dict[str, Any]] = []
        unkeyed: dict[str, tuple[Role, Alg]] = {}
        for entry in f.items("signers"):
            signer_id = entry.str("id")
            role = Role(_choice(entry, "role", Role))
            alg = Alg(_choice(entry, "alg", Alg))
            if alg is Alg.ED25519:
                keyed.append(
                    {
                        "id": signer_id,
                        "role": role.value,
                        "alg": alg.value,
                        "public_key": entry.str("public_key"),
                    }
                )
            elif signer_id in unkeyed:
                raise TrustError(f"signer {signer_id!r} appears twice")
            else:
                unkeyed[signer_id] = (role, alg)
            entry.done()  # an HMAC entry carrying its secret is refused here
        f.done()
        roots = TrustRoots.of(*keyed)
        if any(roots.role_of(signer_id) is not None for signer_id in unkeyed):
            raise TrustError("a signer appears twice in the published trust roots")
        return cls(roots, unkeyed)

    def check_signer(self, signer: Signer, role: Role, *, hint: str = "") -> None:
        """Refuse ``signer`` signing as ``role`` where a runtime with these roots would.

        Raises :class:`~tether.core.UnknownSignerError` for a signer not trusted
        in ``role`` (or with another algorithm), and for an Ed25519 key that is
        not the public key trusted under its id. ``hint`` says what to do.
        """
        signer_id = signer.signer_id
        unkeyed = self._unkeyed.get(signer_id)
        if unkeyed is not None:
            trusted = unkeyed == (role, signer.alg)
        else:
            root = self._keyed._roots.get(signer_id)
            public = signer.trust_root().get("public_key")
            trusted = (
                root is not None
                and root.role is role
                and root.alg is signer.alg
                and public == _b64(root.material)
            )
        if not trusted:
            raise UnknownSignerError(signer_id, role.value, hint=hint)


def _fields(data: bytes | str, what: str) -> Fields:
    try:
        doc = strict_loads(data)
    except CanonicalJSONError as exc:
        raise TrustError(f"{what} is not strict JSON: {exc}") from exc
    return Fields(doc, "", lambda fld, problem: TrustError(f"{what} {fld}: {problem}"))


def _choice(f: Fields, key: str, enum: type[StrEnum]) -> str:
    value = f.str(key)
    if value not in {member.value for member in enum}:
        f.fail(f.name(key), f"must be one of {[m.value for m in enum]}")
    return value
