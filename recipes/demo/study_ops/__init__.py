"""Operators of the habitrun demo study: a synthetic lung-lesion cohort (no download needed)."""
