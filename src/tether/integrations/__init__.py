"""Bridges to agent frameworks people already use; each is an optional extra.

Nothing else in tether imports these packages: they sit on tether's public
API (``tether.store``, ``tether.crypto``, ``tether.core``) the way a
user's own code would.
"""
