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

__all__ = [
    "ENV_KEYRING",
    "ENV_KEYRING_FILE",
    "MIN_KEY_BYTES",
    "Key",
    "KeyStatus",
    "Keyring",
    "KeyringError",
    "envelope_digest",
    "open_envelope",
    "seal",
]
