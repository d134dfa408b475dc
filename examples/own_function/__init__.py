"""Your own function as an effect: httpx against the reference ticket service, guarded."""
