"""`habitrun init` (being written)."""
