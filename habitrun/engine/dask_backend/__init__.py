"""The Dask backend: the same recipe on a Dask cluster (``policy.backend: dask``).

``cluster`` reaches the cluster, ``worker`` is what runs inside a Dask
worker, ``batching`` sizes micro-batches, ``dispatch`` turns one stage's
tasks into outcomes, ``state`` holds what outlives a stage.
"""

from habitrun.engine.dask_backend.cluster import DaskClusterError
from habitrun.engine.dask_backend.distributed_backend import DaskBackend

__all__ = ["DaskBackend", "DaskClusterError"]
