"""`habitrun status` (being written)."""
