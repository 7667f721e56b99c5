"""`habitrun run` (being written)."""
