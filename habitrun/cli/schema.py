"""`habitrun schema` (being written)."""
