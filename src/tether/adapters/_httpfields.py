"""The HTTP header fields tether speaks: ``Idempotency-Key`` and ``Tether-Fence``.

``Idempotency-Key`` is a Structured Field string (RFC 8941, section 3.3.3),
as the IETF httpapi idempotency-key draft asks: printable ASCII in double
quotes, with ``\\`` escaping only ``"`` and ``\\``. Both directions are strict,
so a client and a service built on these functions agree byte for byte.
"""

from __future__ import annotations

from tether.core import AdapterError

IDEMPOTENCY_KEY = "Idempotency-Key"
FENCE = "Tether-Fence"
#: Keys longer than this are refused on both sides (the draft leaves it open;
#: services commonly cap at 255).
MAX_KEY_LENGTH = 255


class HeaderFieldError(AdapterError):
    """A header field that does not parse as the form tether sends."""


def sf_string(value: str) -> str:
    """``value`` as a Structured Field string; refuses what RFC 8941 cannot carry."""
    if not value or len(value) > MAX_KEY_LENGTH:
        raise HeaderFieldError(f"an idempotency key must be 1-{MAX_KEY_LENGTH} characters")
    out = ['"']
    for char in value:
        if not 0x20 <= ord(char) <= 0x7E:
            raise HeaderFieldError(
                f"an idempotency key may hold printable ASCII only, not {char!r}"
            )
        out.append("\\" + char if char in '"\\' else char)
    out.append('"')
    return "".join(out)


def parse_sf_string(text: str) -> str:
    """The string a Structured Field string header carries; strict (no parameters)."""
    text = text.strip(" ")
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise HeaderFieldError("an Idempotency-Key must be a quoted Structured Field string")
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
        raise HeaderFieldError(f"an idempotency key must be 1-{MAX_KEY_LENGTH} characters")
    return value


def fence_header(run_id: str, lease_version: int) -> str:
    """``Tether-Fence``: the run and its lease version, highest wins at the service."""
    return f"{sf_string(run_id)};v={int(lease_version)}"


def parse_fence(text: str) -> tuple[str, int]:
    """``(run_id, lease_version)`` from a ``Tether-Fence`` header."""
    head, sep, tail = text.rpartition(";v=")
    if not sep or not tail.isascii() or not tail.isdigit() or len(tail) > 18:
        raise HeaderFieldError("a Tether-Fence must be '\"run\";v=VERSION'")
    return parse_sf_string(head), int(tail)
