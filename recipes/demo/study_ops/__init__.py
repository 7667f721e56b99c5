"""Operators of the habitrun demo study: a synthetic lung-lesion CT cohort as NIfTI files (no download needed)."""
