"""Errors the shipped adapters raise beyond the core's adapter family.

They all derive from :class:`~tether.core.AdapterError`, so a caller that
handles "the adapter refused or failed" handles these too.
"""

from __future__ import annotations

import re

from tether.core import AdapterError, IdempotencyConflictError, PreconditionFailedError

#: What may carry a secret in an exception's text: a URL's user and query,
#: a ``name=value`` whose name says secret, a bearer token, a long opaque run.
_SECRETS = (
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@"), r"\1[redacted]@"),
    (re.compile(r"(?i)(\?|#)[^\s'\"]*"), r"\1[redacted]"),
    (re.compile(r"(?i)\b(bearer|basic)\s+\S+"), r"\1 [redacted]"),
    (
        re.compile(
            r"(?i)\b(\w*(?:key|token|secret|passw\w*|pwd|auth\w*|cookie|session|sig\w*))"
            r"(\s*[=:]\s*)('[^']*'|\"[^\"]*\"|\S+)"
        ),
        r"\1\2[redacted]",
    ),
    (re.compile(r"[A-Za-z0-9_\-+/=.]{24,}"), "[redacted]"),
)


def exception_summary(error: BaseException) -> str:
    """An exception as tether stores it (checkpoint, trace): its type and a redacted first line.

    A user's exception text may hold a secret (a URL with a token, a header
    echoed back): only the first line, at most 200 characters, is kept, with
    URL credentials and queries, ``token=...``-like pairs, bearer tokens and
    long opaque strings replaced by ``[redacted]``.
    """
    lines = str(error).strip().splitlines()
    text = lines[0][:200] if lines else ""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class WorkspaceConfigError(AdapterError):
    """The workspace was configured in a way that would defeat its guarantees.

    The usual cause: the journal directory lies inside the workspace tree, where
    a rewind of the tree could erase receipts. Move the journal outside ``root``.
    """


class JournalCorruptError(AdapterError):
    """A journal row or meta record does not parse; nothing was trusted from it.

    ``field`` is the dotted path of the offending field when one is known.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"journal record {field or 'document'}: {problem}")


class UnsupportedEntryError(AdapterError):
    """The tree holds an entry the workspace refuses to follow (symlink, device, ...).

    Following a symlink could read or write outside the workspace, so the
    workspace refuses instead. Remove or replace the entry at ``path``.
    """

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(f"{path}: refusing {kind}; only regular files and directories are managed")


class UnresolvedWriteError(AdapterError):
    """A write under ``key`` was prepared, and the target now matches neither side.

    The workspace cannot tell whether its write landed and was overwritten or
    never landed, so it will not guess: it neither replays nor issues a receipt.
    Put ``target`` back to the before or after content, or send the case to review.
    """

    def __init__(
        self, key: str, target: str, before: str | None, after: str, actual: str | None
    ) -> None:
        self.key = key
        self.target = target
        self.before = before
        self.after = after
        self.actual = actual
        super().__init__(
            f"write to {target} is unresolved: expected {before or 'absent'} (before) or "
            f"{after} (after), found {actual or 'absent'}; resolve it or open a review"
        )


class NotQueryableError(AdapterError):
    """The adapter cannot look up a write by key; an uncertain outcome needs review."""


class FenceRejectedError(AdapterError):
    """A write presented an expired fencing token, or one lower than the adapter has seen.

    A newer lease holder has acted on the run; the caller's lease was taken over
    and its write is refused. Stop working on the run.
    """

    def __init__(self, run_id: str, presented: int, highest: int | None) -> None:
        self.run_id = run_id
        self.presented = presented
        self.highest = highest
        why = "has expired" if highest is None else f"is older than {highest}"
        super().__init__(
            f"run {run_id}: fencing token {presented} {why}; "
            "the lease is no longer yours, stop working on this run"
        )


class HttpConfigError(AdapterError):
    """An HTTP adapter or service profile is configured in a way that cannot work.

    Also raised when the service refuses the ``Idempotency-Key`` header itself
    (a 400 about the key): no retry can fix that, the configuration must.
    """


class KeyInFlightError(UnresolvedWriteError):
    """The service still runs a request under ``key`` (409): wait, then ask by the same key.

    An unresolved write like the workspace's: the runtime neither resends nor
    settles it until the service answers for the key.
    """

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.target = ""
        self.before = None
        self.after = ""
        self.actual = None
        AdapterError.__init__(self, f"key {key}: {detail}")


class KeyReusedError(IdempotencyConflictError):
    """The service says ``key`` was used with another payload (422, or as its profile says).

    A person decides. No receipt exists for the other payload; ``response`` is
    the service's answer, ``status`` its status.
    """

    def __init__(self, key: str, expected_digest: str, response: str, status: int = 422) -> None:
        self.key = key
        self.expected_digest = expected_digest
        self.receipt = None
        self.response = response
        self.status = status
        AdapterError.__init__(
            self,
            f"the service refused key {key} as reused with another payload ({status}): {response}",
        )


class RequestRefusedError(PreconditionFailedError):
    """The service refused the request (a 4xx other than 409/412/422): nothing was applied.

    A refusal of a first send is a rejected effect; of a retry, an unknown
    outcome (the first attempt may have landed).
    """

    def __init__(self, target: str, status: int, response: str) -> None:
        self.target = target
        self.expected = "2xx"
        self.actual = str(status)
        self.status = status
        self.response = response
        AdapterError.__init__(self, f"POST /{target} refused with {status}: {response[:500]}")


class KeyHeldError(RequestRefusedError):
    """The service answers 409 for a key it already holds, in flight or done (``replay="conflict"``).

    This send was not applied. Whether an earlier one under the key landed,
    no wait and no resend can tell: read like any refusal, a first send's is
    a rejected effect, a resend's an unknown outcome for a person.
    """

    def __init__(self, target: str, key: str, response: str) -> None:
        super().__init__(target, 409, response)
        self.key = key
        AdapterError.__init__(
            self,
            f"POST /{target}: the service holds key {key} already (409), in flight or done; "
            "a resend cannot tell whether it landed",
        )


class FunctionRefusedError(PreconditionFailedError):
    """A function effect's body raised an exception it declares as "nothing happened" (refused).

    ``error`` is that exception (its type name in ``actual``). Read like any
    refusal: a first send's is a rejected effect; a resend's, an unknown outcome
    (the first attempt may have landed).
    """

    def __init__(self, kind: str, target: str, error: BaseException) -> None:
        self.target = target
        self.expected = "success"
        self.actual = type(error).__name__
        self.error = error
        AdapterError.__init__(
            self, f"{kind} refused ({exception_summary(error)}); nothing happened"
        )


class HiddenCoroutineError(FunctionRefusedError):
    """A function effect written as a plain ``def`` returned a coroutine: refused, nothing ran.

    A synchronous body that hands back a coroutine (``return client.post(...)``
    on an async client, a wrapper that hides an ``async def``) has done
    nothing yet: tether closes the coroutine before it starts, so its effect
    never happens, and refuses the call rather than await it on some loop the
    client was not made for. Declare the function ``async def`` (and await).
    """

    def __init__(self, function: str) -> None:
        FunctionRefusedError.__init__(
            self, function, "", TypeError("a plain def returned a coroutine")
        )
        self.function = function
        AdapterError.__init__(
            self,
            f"{function} is a plain def that returned a coroutine; it was closed unstarted, "
            "so nothing happened: declare the function `async def` and await inside it",
        )


class FunctionKeyConflictError(IdempotencyConflictError):
    """A function effect's body says the callee holds its key for another request: a person decides.

    ``error`` is the exception the body raised (one of its declared ``conflicts``);
    no receipt exists for the other request.
    """

    def __init__(self, key: str, expected_digest: str, error: BaseException) -> None:
        self.key = key
        self.expected_digest = expected_digest
        self.receipt = None
        self.error = error
        AdapterError.__init__(
            self,
            f"the callee holds key {key} for another request ({exception_summary(error)})",
        )


class RestoreIncompleteError(AdapterError):
    """A snapshot restore to ``root`` began and did not finish; the tree is part-way there.

    The workspace refuses writes until it is finished: call
    ``restore_snapshot(root, ...)`` again (it completes the job), or restore
    another snapshot.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(
            f"a restore to {root} did not finish; call restore_snapshot with it again first"
        )
