"""The HTTP header fields tether speaks: ``Idempotency-Key``, ``Tether-Fence``, ``Tether-Instance``.

``Idempotency-Key`` is a Structured Field string (RFC 8941, section 3.3.3),
as the IETF httpapi idempotency-key draft asks: printable ASCII in double
quotes, with ``\\`` escaping only ``"`` and ``\\``. Both directions are strict,
so a client and a service built on these functions agree byte for byte.
``Tether-Instance`` is a Structured Field string too: on a request, the
service instance the run is bound to (a service that verifies it refuses the
request with ``421`` if it is another); on a reply, the instance that answered.
"""

from __future__ import annotations

import hashlib

from tether.core import AdapterError

IDEMPOTENCY_KEY = "Idempotency-Key"
FENCE = "Tether-Fence"
INSTANCE = "Tether-Instance"
#: Keys longer than this are refused on both sides (the draft leaves it open;
#: services commonly cap at 255).
MAX_KEY_LENGTH = 255


class HeaderFieldError(AdapterError):
    """A header field that does not parse as the form tether sends."""


def sf_string(value: str, what: str = "an idempotency key") -> str:
    """``value`` as a Structured Field string; refuses what RFC 8941 cannot carry."""
    if not value or len(value) > MAX_KEY_LENGTH:
        raise HeaderFieldError(f"{what} must be 1-{MAX_KEY_LENGTH} characters")
    out = ['"']
    for char in value:
        if not 0x20 <= ord(char) <= 0x7E:
            raise HeaderFieldError(f"{what} may hold printable ASCII only, not {char!r}")
        out.append("\\" + char if char in '"\\' else char)
    out.append('"')
    return "".join(out)


def parse_sf_string(text: str, what: str = "an idempotency key") -> str:
    """The string a Structured Field string header carries; strict (no parameters)."""
    text = text.strip(" ")
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise HeaderFieldError(f"{what} must be a quoted Structured Field string")
    out: list[str] = []
    body = text[1:-1]
    index = 0
    while index < len(body):
        char = body[index]
        if not 0x20 <= ord(char) <= 0x7E:
            raise HeaderFieldError(f"non-printable character {char!r} in a Structured string")
        if char == "\\":
            index += 1
            if index == len(body) or body[index] not in '"\\':
                raise HeaderFieldError("a backslash may escape only '\"' or '\\'")
            char = body[index]
        elif char == '"':
            raise HeaderFieldError("an unescaped quote inside a Structured string")
        out.append(char)
        index += 1
    value = "".join(out)
    if not value or len(value) > MAX_KEY_LENGTH:
        raise HeaderFieldError(f"{what} must be 1-{MAX_KEY_LENGTH} characters")
    return value


def fence_header(run_id: str, lease_version: int) -> str:
    """``Tether-Fence``: the run and its lease version, highest wins at the service.

    A run id a header cannot carry as it is (not printable ASCII, or long) is
    sent as its digest: still one name per run, never a refused header.
    """
    name = run_id
    if not (0 < len(run_id) <= 200 and all(0x20 <= ord(c) <= 0x7E for c in run_id)):
        name = "sha256-" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{sf_string(name, 'a run id')};v={int(lease_version)}"


def parse_fence(text: str) -> tuple[str, int]:
    """``(run_id, lease_version)`` from a ``Tether-Fence`` header."""
    head, sep, tail = text.rpartition(";v=")
    if not sep or not tail.isascii() or not tail.isdigit() or len(tail) > 18:
        raise HeaderFieldError("a Tether-Fence must be '\"run\";v=VERSION'")
    return parse_sf_string(head), int(tail)
