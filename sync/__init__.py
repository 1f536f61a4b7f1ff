"""Many hosts as one: CRDTs, the instance (``PulseDB``) and its blocking facade."""

from sync.blocking import PulseDBSync
from sync.instance import Activity, Context, ExperienceChange, InstanceSettings, PulseDB

__all__ = ["Activity", "Context", "ExperienceChange", "InstanceSettings", "PulseDB", "PulseDBSync"]
