"""Every `pulse` command, in one place: the records of each group's module, in the order
`pulse --help` and the CLI reference (``ops.cli.reference``) show them."""

from __future__ import annotations

from types import ModuleType

from ops.cli import (
    call,
    collectives,
    deployment,
    experiences,
    importing,
    links,
    maintenance,
    observing,
    presence,
    recall,
    service,
    sessions,
    tokens,
    wisdom,
)  # fmt: skip
from ops.cli.declare import Command

# (title, module): the sections of the reference, each module's COMMANDS in its order
SECTIONS: tuple[tuple[str, ModuleType], ...] = (
    ("Serving", service),
    ("Collectives", collectives),
    ("Experiences", experiences),
    ("Search, context and insights", recall),
    ("Relations", links),
    ("Activity", presence),
    ("Sessions", sessions),
    ("Wisdom", wisdom),
    ("Access tokens and keys", tokens),
    ("Status, SQL and the log", observing),
    ("Importing", importing),
    ("Maintenance", maintenance),
    ("Deployment", deployment),
    ("Any operation", call),
)

COMMANDS: tuple[Command, ...] = tuple(
    command for _, module in SECTIONS for command in module.COMMANDS
)

# what `pulse GROUP --help` says of the commands it gathers
GROUPS = {
    "collective": "Create, list, inspect and delete collectives.",
    "insight": "Store, search and delete distilled insights.",
    "activity": "Say what an agent works on; see who is active.",
    "session": "An agent's sessions: start, update, end, resume, get, list and delete.",
    "wisdom": "Patterns learned across an owner's collectives.",
    "token": "Create, list and revoke access tokens (admins only).",
    "keys": "The keys that seal what entities say (admins only).",
}
