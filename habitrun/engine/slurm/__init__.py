"""SLURM job arrays of warm worker sessions (backend: slurm)."""
