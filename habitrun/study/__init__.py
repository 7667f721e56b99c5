"""A study opened for reading: recipe, subjects, store and runs, asked by the read commands and the Python API."""
