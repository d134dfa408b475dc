"""Examples of tether in use; each directory is one, with a README that says how to run it."""
