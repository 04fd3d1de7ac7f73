"""The old path of :mod:`fakensq.testing.simulation`, kept for existing imports."""

from fakensq.testing.simulation import SimCluster, SimHTTPTransport, SimNetwork, seed_scheduler

__all__ = ["SimCluster", "SimHTTPTransport", "SimNetwork", "seed_scheduler"]
