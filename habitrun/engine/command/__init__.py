"""Command-line tools as stages: run per subject, in a container or not, under habitrun's guarantees."""
