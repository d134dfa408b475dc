"""The README and the docs site: every code block runs, the CLI reference covers every command."""
