"""Recipe and RunPolicy: from a YAML file to validated, frozen models.

This layer imports nothing of habitrun except :mod:`habitrun.errors`.
"""
