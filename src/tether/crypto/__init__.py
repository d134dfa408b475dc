"""Keys and signatures: HMAC keyrings for checkpoints, AEAD boxes for secret context."""

from tether.crypto._envelope import envelope_digest, open_envelope, seal
from tether.crypto._keyring import (
    DEFAULT_KEYRING,
    ENV_KEYRING,
    ENV_KEYRING_FILE,
    MIN_KEY_BYTES,
    Key,
    Keyring,
    KeyringError,
    KeyStatus,
    default_keyring_path,
)
from tether.crypto._secrets import (
    ENV_SECRET_KEYS,
    ENV_SECRET_KEYS_FILE,
    SealedSecret,
    SecretAccessError,
    SecretBox,
    SecretIntegrityError,
    SecretKey,
    SecretKeyError,
)
from tether.crypto._signing import Alg, PublishedTrust, Role, Signer, TrustError, TrustRoots

__all__ = [
    "DEFAULT_KEYRING",
    "ENV_KEYRING",
    "ENV_KEYRING_FILE",
    "ENV_SECRET_KEYS",
    "ENV_SECRET_KEYS_FILE",
    "MIN_KEY_BYTES",
    "Alg",
    "Key",
    "KeyStatus",
    "Keyring",
    "KeyringError",
    "PublishedTrust",
    "Role",
    "SealedSecret",
    "SecretAccessError",
    "SecretBox",
    "SecretIntegrityError",
    "SecretKey",
    "SecretKeyError",
    "Signer",
    "TrustError",
    "TrustRoots",
    "default_keyring_path",
    "envelope_digest",
    "open_envelope",
    "seal",
]
