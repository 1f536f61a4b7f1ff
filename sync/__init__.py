"""Many hosts as one: CRDTs, the instance (``PulseDB``) and its blocking facade.

The names below are imported on first use (PEP 562), not with the package: a light
module of it (``sync.access``, say) must not bring the whole instance (DuckDB, FAISS,
tantivy, NATS) into a process that only needs it, such as ``pulse --help``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventlog.lazy import lazy_names

if TYPE_CHECKING:
    from sync.blocking import PulseDBSync
    from sync.instance import Activity, Context, ExperienceChange, InstanceSettings, PulseDB

_HOMES = {
    "PulseDBSync": "sync.blocking",
    "Activity": "sync.instance",
    "Context": "sync.instance",
    "ExperienceChange": "sync.instance",
    "InstanceSettings": "sync.instance",
    "PulseDB": "sync.instance",
}

__all__ = ["Activity", "Context", "ExperienceChange", "InstanceSettings", "PulseDB", "PulseDBSync"]


__getattr__ = lazy_names(__name__, _HOMES)
