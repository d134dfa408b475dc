"""Adapters: the runtime's hands in the world, and the authority on what they did."""

from tether.adapters._base import (
    Adapter,
    DeclaresEffectIdentity,
    Fence,
    ListsReceipts,
    LooksUpIntents,
    RoutesKinds,
    VerifierResult,
    capabilities_of,
    effect_identity,
    look_up,
    namespace_of,
)
from tether.adapters._composite import Adapters, AdaptersConfigError
from tether.adapters._errors import (
    FenceRejectedError,
    HttpConfigError,
    JournalCorruptError,
    KeyInFlightError,
    KeyReusedError,
    NotQueryableError,
    RequestRefusedError,
    UnresolvedWriteError,
    UnsupportedEntryError,
    WorkspaceConfigError,
)
from tether.adapters._http import REFERENCE_PROFILE, HttpEffect, ServiceProfile
from tether.adapters._httpfields import (
    FENCE,
    IDEMPOTENCY_KEY,
    HeaderFieldError,
    fence_header,
    parse_fence,
    parse_sf_string,
    sf_string,
)
from tether.adapters._sandbox import Sandbox
from tether.adapters._smtp import MaildirLookup, SmtpConfigError, SmtpEffect, message_id
from tether.adapters._workspace import FileWorkspace
from tether.core import Capabilities

__all__ = [
    "FENCE",
    "IDEMPOTENCY_KEY",
    "REFERENCE_PROFILE",
    "Adapter",
    "Adapters",
    "AdaptersConfigError",
    "Capabilities",
    "DeclaresEffectIdentity",
    "Fence",
    "FenceRejectedError",
    "FileWorkspace",
    "HeaderFieldError",
    "HttpConfigError",
    "HttpEffect",
    "JournalCorruptError",
    "KeyInFlightError",
    "KeyReusedError",
    "ListsReceipts",
    "LooksUpIntents",
    "MaildirLookup",
    "NotQueryableError",
    "RequestRefusedError",
    "RoutesKinds",
    "Sandbox",
    "ServiceProfile",
    "SmtpConfigError",
    "SmtpEffect",
    "UnresolvedWriteError",
    "UnsupportedEntryError",
    "VerifierResult",
    "WorkspaceConfigError",
    "capabilities_of",
    "effect_identity",
    "fence_header",
    "look_up",
    "message_id",
    "namespace_of",
    "parse_fence",
    "parse_sf_string",
    "sf_string",
]
