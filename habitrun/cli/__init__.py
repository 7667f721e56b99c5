"""The `habitrun` command line: parsing and display only; the work is in the layers below."""
