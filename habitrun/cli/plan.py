"""`habitrun plan` (being written)."""
