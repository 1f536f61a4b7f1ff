"""Many hosts as one memory: CRDTs, the hybrid logical clock, and the instance
(write path, replication loop, read-your-writes) with its blocking facade."""

from sync.blocking import PulseDBSync
from sync.instance import ExperienceChange, PulseDB

__all__ = ["ExperienceChange", "PulseDB", "PulseDBSync"]
