"""The inputs of the public API as pydantic models: every limit of the data model in one
place, shared by the Python API, the CLI (and the HTTP and MCP edges, whose JSON schemas
come from these models). Events inside stay msgspec; these only guard the edge.

``validated(Model, **fields)`` builds a model or raises ``eventlog.ValidationError`` whose
message names each bad field, what is wrong and the limit, e.g.
``importance: Input should be less than or equal to 1 (got 1.5)``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

import numpy as np
import numpy.typing as npt
import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from eventlog import events as ev
from eventlog import recorded as _recorded
from eventlog.errors import ValidationError
from eventlog.languages import LANGUAGES as LANGUAGES

# -- limits (DESIGN.md, the data-model table) ----------------------------------------------
# Defined once, in eventlog.limits (the codec checks every event from the log against them);
# re-exported ("X as X"), so callers can go on reading them as models.NAME_MAX.
from eventlog.limits import CONTENT_MAX_BYTES as CONTENT_MAX_BYTES
from eventlog.limits import DIMENSION_MAX as DIMENSION_MAX
from eventlog.limits import DOMAIN_MAX as DOMAIN_MAX
from eventlog.limits import DOMAIN_TAG_MAX as DOMAIN_TAG_MAX
from eventlog.limits import EMBEDDER_NAME_MAX as EMBEDDER_NAME_MAX
from eventlog.limits import FILE_PATH_MAX as FILE_PATH_MAX
from eventlog.limits import FILES_MAX as FILES_MAX
from eventlog.limits import INSIGHT_MAX_BYTES as INSIGHT_MAX_BYTES
from eventlog.limits import METADATA_MAX_BYTES as METADATA_MAX_BYTES
from eventlog.limits import NAME_MAX as NAME_MAX
from eventlog.limits import PATTERN_MAX as PATTERN_MAX
from eventlog.limits import REASON_MAX_BYTES as REASON_MAX_BYTES
from eventlog.limits import SESSION_NOTE_MAX_BYTES as SESSION_NOTE_MAX_BYTES
from eventlog.limits import SESSION_NOTES_MAX as SESSION_NOTES_MAX
from eventlog.limits import SESSION_SUMMARY_MAX_BYTES as SESSION_SUMMARY_MAX_BYTES
from eventlog.limits import SESSION_TODO_MAX as SESSION_TODO_MAX
from eventlog.limits import SOURCE_EXPERIENCE_COUNT_MAX as SOURCE_EXPERIENCE_COUNT_MAX
from eventlog.limits import SOURCE_TASK_MAX as SOURCE_TASK_MAX
from eventlog.limits import SOURCES_MAX as SOURCES_MAX
from eventlog.limits import TASK_MAX_BYTES as TASK_MAX_BYTES
from eventlog.limits import THREAD_KEY_MAX_BYTES as THREAD_KEY_MAX_BYTES
from eventlog.limits import THREAD_METADATA_MAX_BYTES as THREAD_METADATA_MAX_BYTES
from eventlog.limits import THREAD_NAME_MAX_BYTES as THREAD_NAME_MAX_BYTES
from eventlog.limits import THREAD_TYPE_MAX as THREAD_TYPE_MAX
from eventlog.limits import THREAD_VALUE_MAX_BYTES as THREAD_VALUE_MAX_BYTES
from eventlog.limits import THREAD_WRITE_IDX_MAX as THREAD_WRITE_IDX_MAX
from eventlog.limits import THREAD_WRITE_IDX_MIN as THREAD_WRITE_IDX_MIN
from eventlog.limits import TODO_NOTE_MAX_BYTES as TODO_NOTE_MAX_BYTES
from eventlog.limits import TODO_TASK_MAX_BYTES as TODO_TASK_MAX_BYTES
from eventlog.limits import TYPE_TEXT_MAX as TYPE_TEXT_MAX
from eventlog.limits import WORKING_ON_ITEM_MAX as WORKING_ON_ITEM_MAX
from eventlog.limits import WORKING_ON_MAX as WORKING_ON_MAX
from projections import naming
from projections.language import AUTO
from projections.language import check as check_language
from sync import pages
from sync.pages import PAGE_MAX as PAGE_MAX
from sync.pages import Page as Page

K_MAX = 1000  # a search's k (a limit of the API, not of the data model)
PAGE_DEFAULT = 100  # items per page of a listing (limits of the API, not of the data model)
CONTEXT_ITEMS_MAX = 300  # k + recent + insights of one get_context_candidates

Vector = npt.NDArray[np.float32]
MOMENT_MAX = 2**47 - 1  # Unix ms: the wall-clock part of any HLC (the year 6429)


def moment_ms(value: Any) -> Any:
    """A moment as Unix milliseconds: an int (ms), or an ISO 8601 time ("2026-11-30",
    "2026-11-30T09:00:00Z"; without a zone it is UTC), or a ``datetime``."""
    import datetime as dt

    if isinstance(value, bool):
        raise ValueError("must be Unix milliseconds or an ISO 8601 time, got a bool")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?[0-9]+", text):
            return int(text)
        try:
            value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"must be Unix milliseconds or an ISO 8601 time (2026-11-30T09:00:00Z), "
                f"got {value!r:.60}"
            ) from None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    return value


# What JSON Schema can say of a moment: Unix ms, or an RFC 3339 time in the years that
# fit (1970..6429; moment_ms also reads a date alone, or a time without its zone, as UTC)
TIME_PATTERN = r"^(19[7-9][0-9]|[2-5][0-9]{3}|6[0-3][0-9]{2}|64[01][0-9]|642[0-8])-"
TIME_SCHEMA: dict[str, Any] = {"type": "string", "format": "date-time", "pattern": TIME_PATTERN}
MOMENT_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 0, "maximum": MOMENT_MAX}, TIME_SCHEMA],
    "description": "Unix milliseconds, or an ISO 8601 time (2026-11-30T09:00:00Z)",
}
Moment = Annotated[
    int,
    BeforeValidator(moment_ms),
    Field(ge=0, le=MOMENT_MAX),
    WithJsonSchema(MOMENT_SCHEMA),
]


def as_of_value(value: Any) -> tuple[Literal["seq", "ms"], int]:
    """What ``as_of`` names: ("seq", a stream sequence) for an integer (or a string of
    digits), ("ms", Unix ms) for an ISO 8601 time or a ``datetime``."""
    number: int | None
    if isinstance(value, int) and not isinstance(value, bool):
        kind: Literal["seq", "ms"] = "seq"
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        kind, number = "seq", int(value)
    else:
        try:
            kind, number = "ms", moment_ms(value)
        except ValueError:
            number = None
        if not isinstance(number, int) or isinstance(value, (int, float)):
            raise ValidationError(
                "as_of: must be a stream sequence (an integer >= 0) or a time (ISO 8601, "
                f"e.g. 2026-11-30T09:00:00Z), got {value!r:.60}"
            )
    assert number is not None
    if not 0 <= number <= (MOMENT_MAX if kind == "ms" else 2**63 - 1):
        raise ValidationError(f"as_of: must be >= 0, got {number}")
    return kind, number


def _as_of_input(value: Any) -> Any:
    """``as_of`` as given: an integer or a text (a bool or a float is not one)."""
    if isinstance(value, (bool, float)):
        raise ValueError(
            f"must be a stream sequence (an integer) or an ISO 8601 time, got {value!r}"
        )
    return value


# as_of: a stream sequence, or a time (ISO 8601); None: now
AsOf = Annotated[
    int | str | None,
    BeforeValidator(_as_of_input),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                TIME_SCHEMA,
                {"type": "null"},
            ],
            "description": "a stream sequence, or an ISO 8601 time (2026-11-30T09:00:00Z); "
            "null: now",
        }
    ),
]


FLOAT32_MAX = float(np.finfo(np.float32).max)  # a vector's values are float32


_PLAIN_NUMBERS = frozenset((float, int))


def _vector(value: Any) -> Vector:
    """A 1-D array of finite float32 values (from a list, a tuple or an array)."""
    if (
        type(value) is np.ndarray
        and value.dtype == np.float32
        and value.ndim == 1
        and 0 < value.size <= DIMENSION_MAX
        and math.isfinite(value @ value)  # (no NaN or infinity in it; a cheap screen)
    ):  # (already one, e.g. checked at the edge: a finite float32 fits a float32)
        return value.copy()
    if isinstance(value, (str, bytes)) or (
        isinstance(value, (list, tuple))
        # (a list of plain floats and ints, as JSON gives, is seen at C speed)
        and not _PLAIN_NUMBERS.issuperset(map(type, value))
        and any(isinstance(v, (bool, str, bytes)) for v in value)
    ):
        raise ValueError("must be a list of numbers")  # (numpy would convert "1" and True)
    try:
        wide = np.asarray(value, dtype=np.float64)  # (checked before float32 rounds it)
    except (TypeError, ValueError) as exc:
        raise ValueError("must be a list of numbers") from exc
    if wide.ndim != 1 or wide.size == 0:
        raise ValueError(f"must be a non-empty list of numbers, got shape {wide.shape}")
    if wide.size > DIMENSION_MAX:
        raise ValueError(f"has {wide.size} values, the limit is {DIMENSION_MAX}")
    if not np.isfinite(wide).all():
        raise ValueError("every value must be a finite number (no NaN or infinity)")
    if (np.abs(wide) > FLOAT32_MAX).any():
        raise ValueError(f"every value must fit a float32 (-{FLOAT32_MAX:.9g}..{FLOAT32_MAX:.9g})")
    return wide.astype(np.float32)


VectorField = Annotated[
    Any,
    BeforeValidator(_vector),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX},
            "minItems": 1,
            "maxItems": DIMENSION_MAX,
        }
    ),
]


class _Utf8Limit:
    """A text of at most ``limit`` bytes of UTF-8 (and at least one, unless
    ``allow_empty``), as the data model counts content.

    JSON Schema counts characters, not bytes, so its schema says what it can exactly:
    ``minLength`` 1 (one character is at least one byte) and ``maxLength`` ``limit`` (no
    text of more characters fits, a character being 1..4 bytes), and the byte limit
    itself in ``x-max-bytes`` and the description, which a client must keep to as
    well: a text of ``limit`` characters fits only if they are ASCII."""

    def __init__(self, limit: int, allow_empty: bool) -> None:
        self.limit, self.allow_empty = limit, allow_empty

    def check(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > self.limit or (size == 0 and not self.allow_empty):
            low = "0" if self.allow_empty else "1 byte"
            raise ValueError(
                f"must be {low} to {self.limit:,} bytes of UTF-8 ({self.limit // 1024} KB), "
                f"got {size:,}"
            )
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: pydantic.GetCoreSchemaHandler
    ) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: Any, handler: pydantic.GetJsonSchemaHandler
    ) -> Any:
        found = handler(schema)
        low = 0 if self.allow_empty else 1
        found.update(minLength=low, maxLength=self.limit)
        found["x-max-bytes"] = self.limit
        found["description"] = (
            f"{low}..{self.limit:,} bytes of UTF-8 ({self.limit // 1024} KB; maxLength is "
            "the bound in characters, which only ASCII text reaches)"
        )
        return found


def _utf8_limit(limit: int, *, allow_empty: bool = False) -> Any:
    return _Utf8Limit(limit, allow_empty)


Score = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX)]
# an owner id or a collective name where one is made: without "/", which separates the
# two when a caller names a collective as owner/name (projections.naming)
OWN_NAME_SCHEMA = {"type": "string", "minLength": 1, "maxLength": NAME_MAX, "pattern": "^[^/]*$"}
OwnName = Annotated[Name, AfterValidator(naming.unslashed), WithJsonSchema(OWN_NAME_SCHEMA)]
TypeText = Annotated[str, StringConstraints(max_length=TYPE_TEXT_MAX)]
DomainTag = Annotated[str, StringConstraints(min_length=1, max_length=DOMAIN_TAG_MAX)]
FilePath = Annotated[str, StringConstraints(min_length=1, max_length=FILE_PATH_MAX)]
Domains = Annotated[list[DomainTag], Field(max_length=DOMAIN_MAX)]
Files = Annotated[list[FilePath], Field(max_length=FILES_MAX)]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


IDEMPOTENCY_KEY_MAX = 200  # characters (sync.idempotency.KEY_MAX)
IdempotencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=IDEMPOTENCY_KEY_MAX),
    Field(
        description="makes the call idempotent: a retry with the same key and arguments "
        "returns the first call's result and stores nothing new; the same key with other "
        "arguments is a ConflictError (409). E.g. a UUID made per call."
    ),
]


# -- experience types (mirror eventlog.events, which stay the wire format) -----------------


class DifficultyIn(_Input):
    kind: Literal["Difficulty"] = "Difficulty"
    description: TypeText
    severity: ev.Severity


class SolutionIn(_Input):
    kind: Literal["Solution"] = "Solution"
    approach: TypeText
    worked: bool
    problem_ref: UUID | None = None


class ErrorPatternIn(_Input):
    kind: Literal["ErrorPattern"] = "ErrorPattern"
    signature: TypeText
    fix: TypeText
    prevention: TypeText


class SuccessPatternIn(_Input):
    kind: Literal["SuccessPattern"] = "SuccessPattern"
    task_type: TypeText
    approach: TypeText
    quality: Score


class UserPreferenceIn(_Input):
    kind: Literal["UserPreference"] = "UserPreference"
    category: TypeText
    preference: TypeText
    strength: Score


class ArchitecturalDecisionIn(_Input):
    kind: Literal["ArchitecturalDecision"] = "ArchitecturalDecision"
    decision: TypeText
    rationale: TypeText


class TechInsightIn(_Input):
    kind: Literal["TechInsight"] = "TechInsight"
    technology: TypeText
    insight: TypeText


class FactIn(_Input):
    kind: Literal["Fact"] = "Fact"
    statement: TypeText
    source: TypeText


class GenericIn(_Input):
    kind: Literal["Generic"] = "Generic"
    category: TypeText | None = None


ExperienceTypeIn = Annotated[
    DifficultyIn
    | SolutionIn
    | ErrorPatternIn
    | SuccessPatternIn
    | UserPreferenceIn
    | ArchitecturalDecisionIn
    | TechInsightIn
    | FactIn
    | GenericIn,
    Field(discriminator="kind"),
]


def _experience_type(value: Any) -> Any:
    """Accept the msgspec variants of ``eventlog.events`` as well as dicts."""
    if isinstance(value, tuple(ev.EXPERIENCE_TYPES)):
        import msgspec

        return msgspec.to_builtins(value)
    return value


def to_event_type(value: BaseModel) -> ev.ExperienceType:
    import msgspec

    converted: ev.ExperienceType = msgspec.convert(
        value.model_dump(mode="python"),
        ev.ExperienceType,
    )
    return converted


# -- collectives ---------------------------------------------------------------------------

# what recording an experience close to a live one does (``queries.Collective``)
OnDuplicate = Literal["keep", "reinforce", "link"]
Outcome = _recorded.Outcome
Recorded = _recorded.Recorded


def _language(value: str) -> str:
    if value != AUTO:
        check_language(value)  # ValueError naming the field and the choices
    return value


# a collective's text analyzer (projections.language), or "auto": each text its own
Language = Annotated[
    str,
    AfterValidator(_language),
    WithJsonSchema({"type": "string", "enum": [*LANGUAGES, AUTO]}),
]


class CollectiveIn(_Input):
    owner_id: OwnName
    name: OwnName
    embedding_dimension: Annotated[int, Field(ge=1, le=DIMENSION_MAX)] | None = None
    embedder: (
        Annotated[str, StringConstraints(min_length=1, max_length=EMBEDDER_NAME_MAX)] | None
    ) = None
    language: Language | None = None
    on_duplicate: OnDuplicate | None = None  # None: "keep"
    duplicate_similarity: Annotated[float, Field(gt=0.0, le=1.0)] | None = None

    @model_validator(mode="after")
    def _dimension_given(self) -> CollectiveIn:
        if self.embedding_dimension is None and self.embedder is None:
            raise ValueError(
                "embedding_dimension: required (1..4096) when the collective has no embedder"
            )
        return self


# -- experiences ---------------------------------------------------------------------------


class ExperienceItemIn(_Input):
    """One experience of a batch (``record_experiences``): ``ExperienceIn`` without the
    collective, which the batch names once."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    content: Annotated[str, _utf8_limit(CONTENT_MAX_BYTES)]
    embedding: VectorField | None = None  # None: the collective's embedder embeds content
    embedder: str | None = None  # the embedder the given vector came from, if any
    experience_type: Annotated[ExperienceTypeIn, BeforeValidator(_experience_type)] = Field(
        default_factory=GenericIn
    )
    importance: Score = 0.5
    confidence: Score = 0.5
    domain: Domains = Field(default_factory=list)
    related_files: Files = Field(default_factory=list)
    source_agent: Name = "agent"
    source_task: (
        Annotated[str, StringConstraints(min_length=1, max_length=SOURCE_TASK_MAX)] | None
    ) = None
    visibility: ev.Visibility = "team"  # private (its author), team (members), org (all)
    valid_from: Moment | None = None  # when it became true; None: when it is recorded
    on_duplicate: OnDuplicate | None = None  # None: its collective's


class ExperienceIn(ExperienceItemIn):
    collective_id: UUID


BATCH_MAX = 1000  # experiences per record_experiences call


def _batch_size(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and not 1 <= len(value) <= BATCH_MAX:
        raise ValueError(f"must hold 1..{BATCH_MAX} experiences, got {len(value)}")
    return value


class ExperiencesIn(_Input):
    """A batch of experiences for one collective (``record_experiences``)."""

    collective_id: UUID
    items: Annotated[
        list[ExperienceItemIn],
        BeforeValidator(_batch_size),
        Field(json_schema_extra={"minItems": 1, "maxItems": BATCH_MAX}),
    ]


IMMUTABLE = ("content", "embedding", "timestamp", "experience_type", "collective_id",
             "source_agent", "source_task")  # fmt: skip


class InvalidationIn(_Input):
    """Why and when an experience stopped being true (``invalidate_experience``)."""

    experience_id: UUID
    reason: Annotated[str, _utf8_limit(REASON_MAX_BYTES)]
    at: Moment | None = None  # None: now


class ExperienceUpdateIn(_Input):
    importance: Score | None = None
    confidence: Score | None = None
    domain: Domains | None = None
    related_files: Files | None = None

    @model_validator(mode="before")
    @classmethod
    def _mutable_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in IMMUTABLE:
                if name in data:
                    raise ValueError(
                        f"{name}: is immutable once recorded (record a new experience "
                        "instead); updatable: importance, confidence, domain, related_files"
                    )
            if all(data.get(n) is None for n in cls.model_fields):
                raise ValueError(
                    "update: give at least one of importance, confidence, domain, related_files"
                )
        return data


# -- relations, insights -------------------------------------------------------------------


class RelationIn(_Input):
    source_id: UUID
    target_id: UUID
    relation_type: ev.RelationType
    strength: Score = 0.5
    metadata: Annotated[str, _utf8_limit(METADATA_MAX_BYTES, allow_empty=True)] | None = None
    visibility: ev.Visibility = "team"
    invalidate: bool = False  # Supersedes / Contradicts: the target stops being true

    @model_validator(mode="after")
    def _not_self(self) -> RelationIn:
        if self.source_id == self.target_id:
            raise ValueError(
                "target_id: must differ from source_id (an experience cannot relate to itself)"
            )
        return self


class InsightIn(_Input):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    collective_id: UUID
    content: Annotated[str, _utf8_limit(INSIGHT_MAX_BYTES)]
    embedding: VectorField | None = None
    embedder: str | None = None
    source_experiences: Annotated[
        list[UUID],
        Field(min_length=1, max_length=SOURCES_MAX, json_schema_extra={"uniqueItems": True}),
    ]
    confidence: Score = 0.5
    domain: Domains = Field(default_factory=list)
    visibility: ev.Visibility = "team"

    @field_validator("source_experiences")
    @classmethod
    def _distinct(cls, value: list[UUID]) -> list[UUID]:
        if len(set(value)) != len(value):
            raise ValueError("must not name an experience twice")
        return value


# -- activities, wisdom --------------------------------------------------------------------


class ActivityIn(_Input):
    collective_id: UUID
    agent_id: Name
    task_description: Annotated[str, _utf8_limit(TASK_MAX_BYTES, allow_empty=True)] = ""
    working_on: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=WORKING_ON_ITEM_MAX)]],
        Field(max_length=WORKING_ON_MAX),
    ] = Field(default_factory=list)


class WisdomIn(_Input):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    owner_id: OwnName
    category: ev.WisdomCategory
    pattern: Annotated[str, StringConstraints(min_length=1, max_length=PATTERN_MAX)]
    confidence: Score = 0.5
    embedding: VectorField
    source_collectives: Annotated[list[UUID], Field(max_length=SOURCES_MAX)] = Field(
        default_factory=list
    )
    source_experience_count: Annotated[int, Field(ge=0, le=SOURCE_EXPERIENCE_COUNT_MAX)] = 0
    applicable_domains: Domains = Field(default_factory=list)
    visibility: ev.Visibility = "team"


# -- searching -----------------------------------------------------------------------------


class FilterIn(_Input):
    """Which experiences a search may return (every field optional)."""

    domains: Annotated[list[DomainTag], Field(min_length=1, max_length=DOMAIN_MAX)] | None = None
    # only what was recorded for this task (its source_task, equal)
    source_task: (
        Annotated[str, StringConstraints(min_length=1, max_length=SOURCE_TASK_MAX)] | None
    ) = None
    experience_types: (
        Annotated[
            list[
                Literal[
                    "Difficulty", "Solution", "ErrorPattern", "SuccessPattern",
                    "UserPreference", "ArchitecturalDecision", "TechInsight", "Fact", "Generic",
                ]
            ],
            Field(min_length=1),
        ]
        | None
    ) = None  # fmt: skip
    min_importance: Score | None = None
    min_confidence: Score | None = None
    since_ms: Annotated[int, Field(ge=0, le=2**47)] | None = None
    include_archived: bool = False
    # validity: by default what is still true now; include_invalid takes everything,
    # valid_at (Unix ms or ISO 8601) what was true at that moment
    include_invalid: bool = False
    valid_at: Moment | None = None


class SearchIn(_Input):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    collective_id: UUID
    text: Annotated[str, StringConstraints(max_length=10_000)] | None = None
    embedding: VectorField | None = None
    embedder: str | None = None  # the embedder the given vector came from, if any
    k: Annotated[int, Field(ge=1, le=K_MAX)] = 10
    filter: FilterIn = Field(default_factory=FilterIn)
    energy_weight: Score | None = None  # None: the instance's RecallSettings
    vector_weight: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 1.0
    text_weight: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 1.0


class ContextIn(SearchIn):
    """What ``get_context_candidates`` gathers; each part can be switched off. The parts
    together hold at most ``CONTEXT_ITEMS_MAX`` experiences and insights (k, when similar
    is on, + recent + insights), so one context stays a bounded answer."""

    similar: bool = True
    recent: Annotated[int, Field(ge=0, le=K_MAX)] = 5
    insights: Annotated[int, Field(ge=0, le=K_MAX)] = 5
    relations: bool = True
    active_agents: bool = True
    as_of: AsOf = None  # a stream sequence or a time (ISO 8601); None: now

    @model_validator(mode="after")
    def _bounded(self) -> ContextIn:
        k = self.k if self.similar else 0
        if k + self.recent + self.insights > CONTEXT_ITEMS_MAX:
            raise ValueError(
                f"k + recent + insights: at most {CONTEXT_ITEMS_MAX} items in one context, "
                f"got {k + self.recent + self.insights} (k={k}, recent={self.recent}, "
                f"insights={self.insights}); page through search_hybrid or "
                "list_experiences for more"
            )
        return self


# -- pages of a listing (Page and PAGE_MAX: sync.pages) -------------------------------------


def check_page_limit(limit: Any) -> int:
    most = pages.PAGE_MAX  # (read at each call, as the CLI's every_page reads it)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise ValidationError(
            f"limit: must be an integer in 1..{most} (items per page), got {limit!r}; "
            "follow `next` for more"
        )
    return limit


def cursor(listing: str, key: Sequence[Any]) -> str:
    """The opaque cursor of a listing after the item with sort key ``key``."""
    text = json.dumps([listing, *(str(k) if isinstance(k, UUID) else k for k in key)])
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def from_cursor(
    listing: str, after: Any, types: Sequence[Callable[[Any], Any]]
) -> tuple[Any, ...] | None:
    """The sort key a cursor of ``listing`` holds (None for None), each part converted by
    ``types``; anything else is a ``ValidationError`` naming ``after``."""
    if after is None:
        return None
    try:
        if not isinstance(after, str) or len(after) > 1000:
            raise ValueError
        data = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
        if not isinstance(data, list) or len(data) != len(types) + 1 or data[0] != listing:
            raise ValueError
        return tuple(_key_part(t, v) for t, v in zip(types, data[1:], strict=True))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValidationError(
            f"after: not a cursor of {listing} (pass the `next` of the page before)"
        ) from None


def _key_part(kind: Callable[[Any], Any], value: Any) -> Any:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError
    if kind in (str, UUID) and not isinstance(value, str):
        raise ValueError
    return kind(value)


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], /, **fields: Any) -> M:
    """``model(**fields)``, or ``ValidationError`` naming every bad field and its limit."""
    try:
        return model(**fields)
    except pydantic.ValidationError as exc:
        raise translate(exc) from None


def translate(exc: pydantic.ValidationError) -> ValidationError:
    return from_errors(exc.errors(include_url=False))


def from_errors(errors: Sequence[Any], *, skip: tuple[str, ...] = ()) -> ValidationError:
    """Our ``ValidationError`` from pydantic's error list (also FastAPI's, whose
    locations start with ``skip`` parts such as "body")."""
    problems = []
    for error in errors:
        loc = [p for p in error["loc"] if not _is_variant_tag(p)]
        while loc and loc[0] in skip:
            loc = loc[1:]
        where = ".".join(str(p) for p in loc)
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "value_error" and ": " in message and not where:
            problems.append(message)  # already "field: problem" (model-level checks)
            continue
        got = error.get("input")
        detail = ""
        if error["type"] not in ("missing", "extra_forbidden", "value_error") and _short(got):
            detail = f" (got {got!r})"
        if error["type"] == "extra_forbidden":
            message = "is not a field of this input"
        problems.append(f"{where or 'input'}: {message}{detail}")
    result = ValidationError("; ".join(problems))
    result.problems = problems  # type: ignore[attr-defined]
    return result


_TAGS = {str(t.__struct_config__.tag) for t in ev.EXPERIENCE_TYPES}


def _is_variant_tag(part: Any) -> bool:
    """pydantic puts the union member's tag in an error's location; the field path is
    clearer without it (``experience_type.severity``)."""
    return isinstance(part, str) and part in _TAGS


def _short(value: Any) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return isinstance(value, (int, float, bool)) or (isinstance(value, str) and len(value) <= 40)


# -- sessions (sync.sessions) ------------------------------------------------------------------


def _builtins(value: Any) -> Any:
    """Accept msgspec Structs (``eventlog.events.TodoItem``, ``projections.queries.Todo``)
    as well as dicts."""
    import msgspec

    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value


class TodoIn(_Input):
    """One item of a session's todo list."""

    task: Annotated[str, _utf8_limit(TODO_TASK_MAX_BYTES)]
    priority: ev.TodoPriority = "medium"
    note: Annotated[str, _utf8_limit(TODO_NOTE_MAX_BYTES, allow_empty=True)] = ""
    done: bool = False


Summary = Annotated[str, _utf8_limit(SESSION_SUMMARY_MAX_BYTES, allow_empty=True)]
Notes = Annotated[
    list[Annotated[str, _utf8_limit(SESSION_NOTE_MAX_BYTES)]],
    Field(max_length=SESSION_NOTES_MAX),
]
TodoList = Annotated[
    list[Annotated[TodoIn, BeforeValidator(_builtins)]], Field(max_length=SESSION_TODO_MAX)
]
SESSION_FIELDS = ("summary", "todo", "changes", "bugs", "architecture")


class SessionIn(_Input):
    """A session to start (``start_session``)."""

    collective_id: UUID
    agent_id: Name
    summary: Summary = ""


class SessionUpdateIn(_Input):
    """What an update of a session replaces: the fields given (each field is replaced as
    a whole, a last-writer-wins register; the others stay as they are)."""

    summary: Summary | None = None
    todo: TodoList | None = None
    changes: Notes | None = None  # what changed, one short note each
    bugs: Notes | None = None  # known bugs, one short note each
    architecture: Notes | None = None  # architecture notes, one each

    @property
    def given(self) -> bool:
        return any(getattr(self, name) is not None for name in SESSION_FIELDS)


class SessionChangeIn(SessionUpdateIn):
    """A session and what to replace in it (``update_session``, ``end_session``)."""

    session_id: UUID


# -- threads: an agent framework's checkpoints (sync.threads) ------------------------------

ThreadName = Annotated[str, _utf8_limit(THREAD_NAME_MAX_BYTES)]
ThreadPart = Annotated[str, _utf8_limit(THREAD_KEY_MAX_BYTES)]  # an id, a task, a channel
Namespace = Annotated[str, _utf8_limit(THREAD_KEY_MAX_BYTES, allow_empty=True)]
SerdeType = Annotated[str, StringConstraints(min_length=1, max_length=THREAD_TYPE_MAX)]
# bytes a framework's serializer made: in JSON, a base64 text (RFC 4648, with padding)
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BASE64 = re.compile(BASE64)


def _from_base64(value: Any) -> Any:
    """A text (JSON's form of the bytes) decoded; bytes as they are. Any text the
    pattern takes is read (the bits a last character leaves over are dropped, as RFC
    4648 lets a decoder do)."""
    if not isinstance(value, str):
        return value
    if not _BASE64.fullmatch(value):
        raise ValueError("must be base64 (RFC 4648: A-Z a-z 0-9 + /, padded with =)")
    return binascii.a2b_base64(value)


Blob = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    WithJsonSchema(
        {"type": "string", "contentEncoding": "base64", "pattern": BASE64,
         "description": f"base64 (at most {THREAD_VALUE_MAX_BYTES // 1024} KB once decoded)"}
    ),
]  # fmt: skip
WRITES_MAX = 1000  # pending writes of one call
THREAD_NAMES_MAX = 1000  # threads one prune takes, runs one delete of their checkpoints
_BYTES_IN_JSON = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class CheckpointIn(_Input):
    """One checkpoint of a thread to store (``put_checkpoint``)."""

    model_config = _BYTES_IN_JSON

    collective_id: UUID
    thread: ThreadName
    checkpoint_id: ThreadPart
    checkpoint_type: SerdeType
    checkpoint: Blob
    checkpoint_ns: Namespace = ""
    parent_checkpoint_id: ThreadPart | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @pydantic.model_validator(mode="after")
    def _fits(self) -> CheckpointIn:
        size = len(self.metadata_json.encode())
        if size > THREAD_METADATA_MAX_BYTES:
            raise ValueError(
                f"metadata: must be at most {THREAD_METADATA_MAX_BYTES:,} bytes as JSON, "
                f"got {size:,}"
            )
        run_id = self.metadata.get("run_id")
        if run_id is not None and len(str(run_id).encode()) > THREAD_KEY_MAX_BYTES:
            raise ValueError(
                f"metadata.run_id: must be at most {THREAD_KEY_MAX_BYTES:,} bytes of UTF-8, "
                f"got {len(str(run_id).encode()):,}"
            )
        if len(self.checkpoint) + size > THREAD_VALUE_MAX_BYTES:
            raise ValueError(
                f"checkpoint: with its metadata must be at most {THREAD_VALUE_MAX_BYTES:,} "
                f"bytes, got {len(self.checkpoint) + size:,}"
            )
        return self

    @property
    def metadata_json(self) -> str:
        return json.dumps(self.metadata, separators=(",", ":"), sort_keys=True, default=str)


class PendingWriteIn(_Input):
    """One pending write of a task: ``value`` (its serializer's bytes, of ``value_type``)
    for ``channel``, at place ``idx`` among the task's writes (negative: a special
    channel's, which a later write replaces)."""

    model_config = _BYTES_IN_JSON

    idx: Annotated[int, Field(ge=THREAD_WRITE_IDX_MIN, le=THREAD_WRITE_IDX_MAX)]
    channel: ThreadPart
    value_type: SerdeType
    value: Blob = b""

    @pydantic.field_validator("value")
    @classmethod
    def _fits(cls, value: bytes) -> bytes:
        if len(value) > THREAD_VALUE_MAX_BYTES:
            raise ValueError(
                f"must be at most {THREAD_VALUE_MAX_BYTES:,} bytes, got {len(value):,}"
            )
        return value


class PendingWritesIn(_Input):
    """A task's pending writes after a checkpoint (``put_pending_writes``)."""

    model_config = _BYTES_IN_JSON

    collective_id: UUID
    thread: ThreadName
    checkpoint_id: ThreadPart
    task_id: ThreadPart
    writes: Annotated[list[PendingWriteIn], Field(min_length=1, max_length=WRITES_MAX)]
    checkpoint_ns: Namespace = ""
    task_path: Namespace = ""
