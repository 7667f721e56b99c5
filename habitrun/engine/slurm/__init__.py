"""SLURM job arrays of warm worker sessions (``policy.backend: slurm``).

The runner side (``backend``, ``commands``, ``chunking``) writes a batch
folder (``batch``), submits it as ``sbatch --array`` tasks and follows the
tasks' shards (``shard``); each array task runs ``session`` on its node,
which runs its chunk of subjects through a local process backend and
appends every outcome to its own shard. Nothing here is imported until a
stage asks for the slurm backend.
"""
