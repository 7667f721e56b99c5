"""habitrun: run a study's per-subject batch pipeline from a YAML recipe."""

__version__ = "0.1.0"
