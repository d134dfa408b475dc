"""A hand-written tool-calling loop, as written today (unguarded) and made crash-safe (guarded)."""
