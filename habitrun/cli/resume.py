"""`habitrun resume` (being written)."""
