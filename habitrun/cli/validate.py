"""`habitrun validate` (being written)."""
