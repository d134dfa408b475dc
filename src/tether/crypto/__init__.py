"""Keys and signatures: HMAC keyrings for checkpoints."""

from tether.crypto._envelope import envelope_digest, open_envelope, seal
from tether.crypto._keyring import (
    ENV_KEYRING,
    ENV_KEYRING_FILE,
    MIN_KEY_BYTES,
    Key,
    Keyring,
    KeyringError,
    KeyStatus,
)
from tether.crypto._signing import Alg, Role, Signer, TrustError, TrustRoots

__all__ = [
    "ENV_KEYRING",
    "ENV_KEYRING_FILE",
    "MIN_KEY_BYTES",
    "Alg",
    "Key",
    "KeyStatus",
    "Keyring",
    "KeyringError",
    "Role",
    "Signer",
    "TrustError",
    "TrustRoots",
    "envelope_digest",
    "open_envelope",
    "seal",
]
