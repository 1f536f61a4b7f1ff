"""The DuckDB schema of a projection: base tables (the folded rows), views (the live state,
the analysts' contract) and the migration path.

Base tables hold every folded row, including rows not yet valid (an update that arrived
before its create) and tombstones; ``*_stamp`` columns hold the last-writer-wins stamps.
Columns marked local (``vec_id``, ``updated_seq``) and the ``checkpoint`` and
``partition_positions`` tables differ between hosts and are left out of the digest; so
is ``create_seq`` (a stream sequence, or a position in a log in partitions, the same for
hosts reading one log, but not between a stream and its copies).

Views (stable names, what queries and analysts read):

  collectives        live collectives
  experiences        live experiences: created, not deleted, collective live, valid
                     embedding; ``archived`` is a column, ``applications`` the G-counter
                     total, ``last_reinforced`` the time of the last reinforcement;
                     validity: ``valid_from``, ``valid_to`` (NULL: still true),
                     ``invalid_reason``, ``valid`` (true now), ``invalidations``
  applications       per-instance application counts (the G-counter entries)
  relations          live relations: valid, both ends live, the winner of its triple
  insights           live insights;  insight_sources  their source experiences
  wisdom             live wisdom
  tokens             access tokens (sync.access), revoked ones flagged; never a secret
  sessions           agents' live sessions (sync.sessions): summary, todo (JSON), changes,
                     bugs, architecture notes, whether and when it ended
  audit              every folded event but reinforcements: sequence, time, type,
                     collective, entity, author and instance (forgetting an entity
                     forgets its history here too, all but its delete)
  history            every change, reinforcements included: the audit's columns and
                     ``change``, the event as JSON (embeddings left out); what ``as_of``
                     reads fold back (``projections.past``)
  dead_letters       what breaks an invariant of the folded state, with the reason:
                     wrong embedding dimension, missing collective / endpoint / source,
                     self-relation, relation across collectives, a (source, target, type)
                     triple taken by another relation; and messages the engine could
                     not apply (unreadable, or a value out of range), with the
                     sequence, subject and, when readable, the instance that wrote it

Deletes forget: a deleted row keeps only its key, its collective and the tombstone, and
the application counts of a deleted experience are removed (see ``projections.fold``).

Because the invariants are evaluated on the folded state (not when an event arrives),
dead letters do not depend on the order events arrived in: an experience that arrives
before its collective is simply not live yet, and becomes live when the collective does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# a step of a migration: a statement, or a function of the connection (for what SQL
# alone cannot work out)
Migration = str | Callable[[Any], None]

SCHEMA_VERSION = 12

MISPLACED = "collective_id: not the collective of the entity: "  # dead letter

TABLES = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY, seq BIGINT NOT NULL, applied BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS collective_rows (
    collective_id UUID PRIMARY KEY, create_event UUID, owner_id VARCHAR, name VARCHAR,
    embedding_dimension INTEGER, embedder VARCHAR, created_hlc UBIGINT,
    deleted BOOLEAN NOT NULL,
    updated_seq BIGINT, author_owner VARCHAR, author_agent VARCHAR, language VARCHAR,
    on_duplicate VARCHAR, duplicate_similarity DOUBLE);
CREATE TABLE IF NOT EXISTS experience_rows (
    experience_id UUID PRIMARY KEY, create_event UUID, collective_id UUID, content VARCHAR,
    embedding BLOB, experience_type VARCHAR, type_data VARCHAR, source_agent VARCHAR,
    source_task VARCHAR, created_hlc UBIGINT,
    importance DOUBLE, importance_stamp BLOB, confidence DOUBLE, confidence_stamp BLOB,
    domain VARCHAR[], domain_stamp BLOB, related_files VARCHAR[], related_files_stamp BLOB,
    archived BOOLEAN NOT NULL, archived_stamp BLOB, deleted BOOLEAN NOT NULL,
    vec_id BIGINT, updated_seq BIGINT, create_seq BIGINT,
    visibility VARCHAR, author_owner VARCHAR, author_agent VARCHAR,
    valid_from_ms BIGINT, valid_to BIGINT, valid_to_stamp BLOB, invalid_reason VARCHAR,
    invalid_reason_stamp BLOB, invalidations UBIGINT[], language VARCHAR);
CREATE TABLE IF NOT EXISTS application_rows (
    experience_id UUID, instance_id UUID, applications UBIGINT NOT NULL,
    last_hlc UBIGINT NOT NULL,
    updated_seq BIGINT, collective_id UUID,
    PRIMARY KEY (experience_id, instance_id, collective_id));
CREATE TABLE IF NOT EXISTS relation_rows (
    relation_id UUID PRIMARY KEY, create_event UUID, collective_id UUID, source_id UUID,
    target_id UUID, relation_type VARCHAR, strength DOUBLE, metadata VARCHAR,
    created_hlc UBIGINT, deleted BOOLEAN NOT NULL,
    updated_seq BIGINT, create_seq BIGINT,
    visibility VARCHAR, author_owner VARCHAR, author_agent VARCHAR);
CREATE TABLE IF NOT EXISTS insight_rows (
    insight_id UUID PRIMARY KEY, create_event UUID, collective_id UUID, content VARCHAR,
    embedding BLOB, source_experiences UUID[], confidence DOUBLE, domain VARCHAR[],
    created_hlc UBIGINT, deleted BOOLEAN NOT NULL,
    vec_id BIGINT, updated_seq BIGINT, create_seq BIGINT,
    visibility VARCHAR, author_owner VARCHAR, author_agent VARCHAR, language VARCHAR);
CREATE TABLE IF NOT EXISTS wisdom_rows (
    wisdom_id UUID PRIMARY KEY, create_event UUID, owner_id VARCHAR, category VARCHAR,
    pattern VARCHAR, confidence DOUBLE, embedding BLOB, source_collectives UUID[],
    source_experience_count UBIGINT, applicable_domains VARCHAR[], created_hlc UBIGINT,
    deleted BOOLEAN NOT NULL,
    updated_seq BIGINT, visibility VARCHAR, author_owner VARCHAR, author_agent VARCHAR);
CREATE TABLE IF NOT EXISTS token_rows (
    token_id UUID PRIMARY KEY, create_event UUID, owner_id VARCHAR, secret_sha256 VARCHAR,
    scope VARCHAR, agent_id VARCHAR, collectives UUID[], expires_ms BIGINT,
    created_hlc UBIGINT, deleted BOOLEAN NOT NULL, author_owner VARCHAR,
    author_agent VARCHAR, updated_seq BIGINT);
CREATE TABLE IF NOT EXISTS session_rows (
    session_id UUID PRIMARY KEY, create_event UUID, collective_id UUID, agent_id VARCHAR,
    created_hlc UBIGINT, summary VARCHAR, summary_stamp BLOB, todo VARCHAR, todo_stamp BLOB,
    changes VARCHAR[], changes_stamp BLOB, bugs VARCHAR[], bugs_stamp BLOB,
    architecture VARCHAR[], architecture_stamp BLOB, ended_hlc UBIGINT, ended_hlc_stamp BLOB,
    deleted BOOLEAN NOT NULL, author_owner VARCHAR, author_agent VARCHAR,
    create_seq BIGINT, updated_seq BIGINT);
CREATE TABLE IF NOT EXISTS checkpoint_rows (
    thread_id UUID, collective_id UUID, checkpoint_ns VARCHAR, checkpoint_id VARCHAR,
    create_event UUID, name VARCHAR, parent_checkpoint_id VARCHAR, checkpoint_type VARCHAR,
    checkpoint BLOB, metadata VARCHAR, run_id VARCHAR, created_hlc UBIGINT,
    deleted BOOLEAN NOT NULL, author_owner VARCHAR, author_agent VARCHAR, updated_seq BIGINT,
    PRIMARY KEY (thread_id, collective_id, checkpoint_ns, checkpoint_id));
CREATE TABLE IF NOT EXISTS pending_write_rows (
    thread_id UUID, collective_id UUID, checkpoint_ns VARCHAR, checkpoint_id VARCHAR,
    task_id VARCHAR, idx INTEGER, channel VARCHAR, channel_stamp BLOB, value_type VARCHAR,
    value_type_stamp BLOB, value BLOB, value_stamp BLOB, task_path VARCHAR,
    task_path_stamp BLOB, updated_seq BIGINT,
    PRIMARY KEY (thread_id, collective_id, checkpoint_ns, checkpoint_id, task_id, idx));
CREATE TABLE IF NOT EXISTS thread_rows (
    thread_id UUID, collective_id UUID, deleted BOOLEAN NOT NULL, updated_seq BIGINT,
    PRIMARY KEY (thread_id, collective_id));
CREATE TABLE IF NOT EXISTS audit_rows (
    seq BIGINT NOT NULL, event_type VARCHAR, collective_id UUID, entity VARCHAR,
    entity_id UUID, author_owner VARCHAR, author_agent VARCHAR, instance_id UUID,
    hlc UBIGINT, change VARCHAR);
CREATE TABLE IF NOT EXISTS count_history (
    seq BIGINT NOT NULL, experience_id UUID, instance_id UUID, collective_id UUID,
    applications UBIGINT, hlc UBIGINT, author_owner VARCHAR, author_agent VARCHAR);
CREATE TABLE IF NOT EXISTS undecodable (
    seq BIGINT PRIMARY KEY, subject VARCHAR, reason VARCHAR, instance_id UUID,
    position BIGINT);
CREATE TABLE IF NOT EXISTS stray_tombstones (
    experience_id UUID NOT NULL, collective_id UUID NOT NULL,
    PRIMARY KEY (experience_id, collective_id));
CREATE TABLE IF NOT EXISTS partition_positions (
    part INTEGER PRIMARY KEY, seq BIGINT NOT NULL);
"""

VIEWS = """
CREATE OR REPLACE VIEW collectives AS
SELECT collective_id, owner_id, name, embedding_dimension, embedder,
       epoch_ms((created_hlc >> 16)::BIGINT) AS created_at, author_owner, author_agent,
       coalesce(language, 'english') AS language,
       coalesce(on_duplicate, 'keep') AS on_duplicate,
       coalesce(duplicate_similarity, 0.95) AS duplicate_similarity
FROM collective_rows WHERE create_event IS NOT NULL AND NOT deleted;

CREATE OR REPLACE VIEW applications AS
SELECT a.experience_id, a.instance_id, a.applications,
       epoch_ms((a.last_hlc >> 16)::BIGINT) AS last_reinforced, a.collective_id
FROM application_rows a JOIN experience_rows e USING (experience_id, collective_id);

CREATE OR REPLACE VIEW experience_checks AS
SELECT e.experience_id, e.collective_id,
       CASE WHEN c.create_event IS NULL
                THEN 'collective ' || e.collective_id || ' does not exist'
            WHEN octet_length(e.embedding) <> 4 * c.embedding_dimension
                THEN 'embedding has ' || (octet_length(e.embedding) // 4)
                     || ' dimensions, the collective has ' || c.embedding_dimension
       END AS problem,
       c.create_event IS NOT NULL AND NOT c.deleted AS collective_live
FROM experience_rows e LEFT JOIN collective_rows c USING (collective_id)
WHERE e.create_event IS NOT NULL AND NOT e.deleted;

CREATE OR REPLACE VIEW experiences AS
SELECT e.experience_id, e.collective_id, e.content, e.embedding, e.experience_type,
       e.type_data, e.importance, e.confidence, e.domain, e.related_files, e.source_agent,
       e.source_task, (e.created_hlc >> 16)::BIGINT AS created_ms,
       epoch_ms((e.created_hlc >> 16)::BIGINT) AS timestamp, e.archived,
       coalesce(a.applications, 0)::UBIGINT AS applications,
       epoch_ms((a.last_hlc >> 16)::BIGINT) AS last_reinforced, e.vec_id,
       coalesce(e.visibility, 'team') AS visibility, e.author_owner, e.author_agent,
       epoch_ms(coalesce(e.valid_from_ms, (e.created_hlc >> 16)::BIGINT)) AS valid_from,
       epoch_ms(e.valid_to) AS valid_to, e.invalid_reason,
       e.valid_to IS NULL OR e.valid_to > epoch_ms(get_current_timestamp()) AS valid,
       len(coalesce(e.invalidations, []))::INTEGER AS invalidations,
       CASE WHEN c.language = 'auto' THEN e.language ELSE coalesce(c.language, 'english')
       END AS language
FROM experience_rows e
JOIN experience_checks k USING (experience_id)
JOIN collective_rows c ON c.collective_id = e.collective_id
LEFT JOIN (SELECT experience_id, collective_id, sum(applications) AS applications,
                  max(last_hlc) AS last_hlc
           FROM application_rows GROUP BY ALL) a
     ON a.experience_id = e.experience_id AND a.collective_id = e.collective_id
WHERE k.problem IS NULL AND k.collective_live;

CREATE OR REPLACE VIEW relation_checks AS
SELECT r.relation_id, r.collective_id,
       CASE WHEN r.source_id = r.target_id
                THEN 'a relation cannot link an experience to itself'
            WHEN s.create_event IS NULL AND NOT coalesce(s.deleted, false)
                THEN 'source experience ' || r.source_id || ' does not exist'
            WHEN t.create_event IS NULL AND NOT coalesce(t.deleted, false)
                THEN 'target experience ' || r.target_id || ' does not exist'
            WHEN s.collective_id <> t.collective_id OR s.collective_id <> r.collective_id
                THEN 'relation across collectives'
            WHEN r.relation_id <> min(r.relation_id) OVER triple
                THEN '(source, target, type) is already taken by relation '
                     || min(r.relation_id) OVER triple
       END AS problem
FROM relation_rows r
LEFT JOIN experience_rows s ON s.experience_id = r.source_id
LEFT JOIN experience_rows t ON t.experience_id = r.target_id
WHERE r.create_event IS NOT NULL AND NOT r.deleted
-- a triple is unique among the relations shared alike (projections.state.sharing)
WINDOW triple AS (
    PARTITION BY r.source_id, r.target_id, r.relation_type, coalesce(r.visibility, 'team'),
                 CASE WHEN r.visibility = 'private' THEN r.author_owner END,
                 CASE WHEN r.visibility = 'private' THEN r.author_agent END);

CREATE OR REPLACE VIEW relations AS
SELECT r.relation_id, r.collective_id, r.source_id, r.target_id, r.relation_type,
       r.strength, r.metadata, epoch_ms((r.created_hlc >> 16)::BIGINT) AS created_at,
       coalesce(r.visibility, 'team') AS visibility, r.author_owner, r.author_agent
FROM relation_rows r JOIN relation_checks k USING (relation_id)
WHERE k.problem IS NULL
  AND r.source_id IN (SELECT experience_id FROM experiences)
  AND r.target_id IN (SELECT experience_id FROM experiences);

CREATE OR REPLACE VIEW insight_checks AS
SELECT i.insight_id, i.collective_id,
       CASE WHEN c.create_event IS NULL
                THEN 'collective ' || i.collective_id || ' does not exist'
            WHEN octet_length(i.embedding) <> 4 * c.embedding_dimension
                THEN 'embedding has ' || (octet_length(i.embedding) // 4)
                     || ' dimensions, the collective has ' || c.embedding_dimension
            WHEN len(i.source_experiences) = 0 THEN 'an insight needs at least one source'
            WHEN EXISTS (SELECT 1 FROM unnest(i.source_experiences) AS s(id)
                         WHERE s.id NOT IN (SELECT experience_id FROM experience_rows
                                            WHERE create_event IS NOT NULL OR deleted))
                THEN 'a source experience does not exist'
       END AS problem,
       c.create_event IS NOT NULL AND NOT c.deleted AS collective_live
FROM insight_rows i LEFT JOIN collective_rows c USING (collective_id)
WHERE i.create_event IS NOT NULL AND NOT i.deleted;

CREATE OR REPLACE VIEW insights AS
SELECT i.insight_id, i.collective_id, i.content, i.embedding, i.source_experiences,
       i.confidence, i.domain, epoch_ms((i.created_hlc >> 16)::BIGINT) AS created_at, i.vec_id,
       coalesce(i.visibility, 'team') AS visibility, i.author_owner, i.author_agent,
       CASE WHEN c.language = 'auto' THEN i.language ELSE coalesce(c.language, 'english')
       END AS language
FROM insight_rows i JOIN insight_checks k USING (insight_id)
JOIN collective_rows c ON c.collective_id = i.collective_id
WHERE k.problem IS NULL AND k.collective_live;

CREATE OR REPLACE VIEW insight_sources AS
SELECT insight_id, unnest(source_experiences) AS experience_id FROM insights;

CREATE OR REPLACE VIEW wisdom AS
SELECT wisdom_id, owner_id, category, pattern, confidence, embedding, source_collectives,
       source_experience_count, applicable_domains,
       epoch_ms((created_hlc >> 16)::BIGINT) AS created_at,
       coalesce(visibility, 'team') AS visibility, author_owner, author_agent
FROM wisdom_rows WHERE create_event IS NOT NULL AND NOT deleted;

CREATE OR REPLACE VIEW tokens AS
SELECT token_id, owner_id, agent_id, scope, collectives,
       CASE WHEN expires_ms IS NOT NULL THEN epoch_ms(expires_ms) END AS expires_at,
       epoch_ms((created_hlc >> 16)::BIGINT) AS created_at, deleted AS revoked,
       author_owner, author_agent
FROM token_rows WHERE create_event IS NOT NULL OR deleted;

CREATE OR REPLACE VIEW audit AS
SELECT seq, epoch_ms((hlc >> 16)::BIGINT) AS written_at, event_type, collective_id, entity,
       entity_id, author_owner, author_agent, instance_id
FROM audit_rows WHERE event_type IS NOT NULL;

CREATE OR REPLACE VIEW sessions AS
SELECT s.session_id, s.collective_id, s.agent_id, coalesce(s.summary, '') AS summary,
       CAST(coalesce(s.todo, '[]') AS JSON) AS todo,
       coalesce(s.changes, []::VARCHAR[]) AS changes, coalesce(s.bugs, []::VARCHAR[]) AS bugs,
       coalesce(s.architecture, []::VARCHAR[]) AS architecture,
       s.ended_hlc IS NOT NULL AS ended,
       epoch_ms((s.created_hlc >> 16)::BIGINT) AS started_at,
       epoch_ms((s.ended_hlc >> 16)::BIGINT) AS ended_at, s.author_owner, s.author_agent
FROM session_rows s JOIN collective_rows c USING (collective_id)
WHERE s.create_event IS NOT NULL AND NOT s.deleted
  AND c.create_event IS NOT NULL AND NOT c.deleted;

CREATE OR REPLACE VIEW history AS
SELECT seq, epoch_ms((hlc >> 16)::BIGINT) AS written_at, event_type, collective_id, entity,
       entity_id, author_owner, author_agent, instance_id, change::JSON AS change
FROM audit_rows WHERE event_type IS NOT NULL
UNION ALL
SELECT seq, epoch_ms((hlc >> 16)::BIGINT), 'experience.reinforced', collective_id,
       'experience', experience_id, author_owner, author_agent, instance_id,
       json_object('applications', applications)
FROM count_history;

CREATE OR REPLACE VIEW dead_letters AS
SELECT 'experience' AS entity, experience_id AS id, collective_id, problem AS reason,
       NULL::BIGINT AS seq, NULL::VARCHAR AS subject, NULL::UUID AS instance_id
FROM experience_checks WHERE problem IS NOT NULL
UNION ALL
SELECT 'relation', relation_id, collective_id, problem, NULL, NULL, NULL
FROM relation_checks WHERE problem IS NOT NULL
UNION ALL
SELECT 'insight', insight_id, collective_id, problem, NULL, NULL, NULL
FROM insight_checks WHERE problem IS NOT NULL
UNION ALL
SELECT 'message', NULL, NULL, reason, seq, subject, instance_id FROM undecodable;
"""

# The logical content of each base table, in digest order: local columns left out.
DIGEST_QUERIES = {
    "collective_rows": "SELECT * EXCLUDE (updated_seq) FROM collective_rows ORDER BY 1",
    "experience_rows": (
        "SELECT * EXCLUDE (vec_id, updated_seq, create_seq) FROM experience_rows ORDER BY 1"
    ),
    "application_rows": "SELECT * EXCLUDE (updated_seq) FROM application_rows ORDER BY 1, 2, 5",
    "relation_rows": "SELECT * EXCLUDE (updated_seq, create_seq) FROM relation_rows ORDER BY 1",
    "insight_rows": (
        "SELECT * EXCLUDE (vec_id, updated_seq, create_seq) FROM insight_rows ORDER BY 1"
    ),
    "wisdom_rows": "SELECT * EXCLUDE (updated_seq) FROM wisdom_rows ORDER BY 1",
    "token_rows": "SELECT * EXCLUDE (updated_seq) FROM token_rows ORDER BY 1",
    "session_rows": "SELECT * EXCLUDE (updated_seq, create_seq) FROM session_rows ORDER BY 1",
    "checkpoint_rows": ("SELECT * EXCLUDE (updated_seq) FROM checkpoint_rows ORDER BY 1, 2, 3, 4"),
    "pending_write_rows": (
        "SELECT * EXCLUDE (updated_seq) FROM pending_write_rows ORDER BY 1, 2, 3, 4, 5, 6"
    ),
    "thread_rows": "SELECT * EXCLUDE (updated_seq) FROM thread_rows ORDER BY 1, 2",
    # (audit_rows is left out: it holds stream sequences, and what a host read of the
    # events a delete forgot until the tombstone reached it)
    # an event naming another collective than its entity's is reported when the entity's
    # create is in the log as it is read; forgetting purges the create, so a host that
    # reads the log later may not report it: those reports are left out
    "undecodable": (
        "SELECT subject, reason FROM undecodable "
        f"WHERE reason NOT LIKE '{MISPLACED}%' ORDER BY 1, 2"
    ),
}

# The digest of one collective: its rows of the tables that hold collectives' rows (the
# same queries, narrowed), so a host that follows some collectives can be compared, one
# collective at a time, with one that follows them all.
DIGEST_BY_COLLECTIVE = {
    name: query.replace(" ORDER BY", " WHERE collective_id = $cid ORDER BY", 1)
    for name, query in DIGEST_QUERIES.items()
    if name not in ("wisdom_rows", "token_rows", "undecodable")
}
DIGEST_BY_COLLECTIVE["undecodable"] = DIGEST_QUERIES["undecodable"].replace(
    " ORDER BY", " AND starts_with(subject, $prefix) ORDER BY", 1
)

# from_version -> statements that bring the schema to from_version + 1
MIGRATIONS: dict[int, list[Migration]] = {
    # 12: on a log in partitions, where the log holds a dead letter (its position: the
    # host's number finds it in no stream), so it is read again after an upgrade
    11: ["ALTER TABLE undecodable ADD COLUMN IF NOT EXISTS position BIGINT"],
    # 11: on a log in partitions, the last sequence of each partition this host applied
    # (partition_positions, made by TABLES), written with the checkpoint: where it resumes
    10: [],
    # 10: an experience's deletes that named another collective than its row's, kept
    # (stray_tombstones, made by TABLES): the counts such a collective's reports made go
    # whether or not the host restarted in between (projections.state)
    9: [],
    # 9: a language per document (an experience's and an insight's, in a collective of
    # "auto"), and "auto" read from an old collective's choice (eventlog.codec); what a
    # collective does with a duplicate (those before keep it)
    8: [
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS language VARCHAR",
        "ALTER TABLE insight_rows ADD COLUMN IF NOT EXISTS language VARCHAR",
        "ALTER TABLE collective_rows ADD COLUMN IF NOT EXISTS on_duplicate VARCHAR",
        "ALTER TABLE collective_rows ADD COLUMN IF NOT EXISTS duplicate_similarity DOUBLE",
        lambda con: _auto_collectives(con),
    ],
    # 8: threads (an agent framework's checkpoints; sync.threads): their tables are new,
    # made by TABLES
    7: [],
    # 7: a collective's text analyzer (projections.language); those before are English
    6: ["ALTER TABLE collective_rows ADD COLUMN IF NOT EXISTS language VARCHAR"],
    # 6: validity (an experience's [valid_from, valid_to), why it stopped being true, and
    # its invalidations); the history of every change (audit_rows.change, and the
    # application counts' history). Rows from before are valid from their recording on.
    5: [
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS valid_from_ms BIGINT",
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS valid_to BIGINT",
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS valid_to_stamp BLOB",
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS invalid_reason VARCHAR",
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS invalid_reason_stamp BLOB",
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS invalidations UBIGINT[]",
        "UPDATE experience_rows SET valid_to_stamp = ''::BLOB, invalid_reason_stamp = ''::BLOB",
        "ALTER TABLE audit_rows ADD COLUMN IF NOT EXISTS change VARCHAR",
        # (count_history is made by TABLES) the history starts here: as_of reads before it
        # need a rebuild (``projections.past``); the counts so far are its first entries
        """INSERT OR REPLACE INTO meta SELECT 'history_from',
               coalesce((SELECT seq FROM checkpoint WHERE id = 1), 0)::VARCHAR""",
        """INSERT INTO count_history SELECT coalesce(updated_seq, 0), experience_id,
               instance_id, collective_id, applications, last_hlc, NULL, NULL
           FROM application_rows""",
        # an entity from before the audit (schema 4) has no history at all: a row of
        # sequence 0 without an event says so, and a read as of a moment that needs its
        # history is refused by name instead of taking it for absent
        *(
            f"""INSERT INTO audit_rows (seq, collective_id, entity, entity_id)
                SELECT 0, {collective}, '{entity}', {entity}_id FROM {entity}_rows r
                WHERE NOT EXISTS (SELECT 1 FROM audit_rows a WHERE a.entity_id = r.{entity}_id)"""
            for entity, collective in (
                ("collective", "collective_id"),
                ("experience", "collective_id"),
                ("relation", "collective_id"),
                ("insight", "collective_id"),
                ("wisdom", "NULL"),
                ("token", "NULL"),
            )
        ),  # fmt: skip
    ],
    # 5: who wrote what (author columns, the audit) and who may see it (visibility);
    # access tokens (token_rows, created by TABLES). Rows from before have no author and
    # are seen as "team" (the views coalesce)
    4: [
        *(
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} VARCHAR"
            for t in ("experience_rows", "relation_rows", "insight_rows", "wisdom_rows")
            for c in ("visibility", "author_owner", "author_agent")
        ),
        "ALTER TABLE collective_rows ADD COLUMN IF NOT EXISTS author_owner VARCHAR",
        "ALTER TABLE collective_rows ADD COLUMN IF NOT EXISTS author_agent VARCHAR",
    ],
    # 4: an application count is kept apart for each collective its reports named (only
    # the experience's own counts), so the key takes the collective in
    3: [
        """CREATE TABLE application_rows_4 (
               experience_id UUID, instance_id UUID, applications UBIGINT NOT NULL,
               last_hlc UBIGINT NOT NULL, updated_seq BIGINT, collective_id UUID,
               PRIMARY KEY (experience_id, instance_id, collective_id))""",
        """INSERT INTO application_rows_4
           SELECT experience_id, instance_id, applications, last_hlc, updated_seq,
                  collective_id
           FROM application_rows WHERE collective_id IS NOT NULL""",
        "DROP VIEW IF EXISTS experiences",
        "DROP VIEW IF EXISTS applications",
        "DROP TABLE application_rows",
        "ALTER TABLE application_rows_4 RENAME TO application_rows",
        # the stream sequence of an entity's first create decides its collective (rows
        # from before hold NULL: they count as the earliest)
        "ALTER TABLE experience_rows ADD COLUMN IF NOT EXISTS create_seq BIGINT",
        "ALTER TABLE relation_rows ADD COLUMN IF NOT EXISTS create_seq BIGINT",
        "ALTER TABLE insight_rows ADD COLUMN IF NOT EXISTS create_seq BIGINT",
    ],
    # 3: a message kept aside names the instance that wrote it (when readable)
    2: ["ALTER TABLE undecodable ADD COLUMN IF NOT EXISTS instance_id UUID"],
    # 2: deletes forget. Application counts name their collective; a deleted row keeps
    # only its key, its collective (owner) and the flag; the counts of a deleted
    # experience go. (What version 1 deleted stays in its log:
    # only deletes made from version 2 on purge the stream.)
    1: [
        "ALTER TABLE application_rows ADD COLUMN IF NOT EXISTS collective_id UUID",
        """UPDATE application_rows SET collective_id = (
               SELECT e.collective_id FROM experience_rows e
               WHERE e.experience_id = application_rows.experience_id)
           WHERE collective_id IS NULL""",
        """DELETE FROM application_rows WHERE experience_id IN (
               SELECT experience_id FROM experience_rows WHERE deleted)""",
        """UPDATE collective_rows SET create_event = NULL, owner_id = NULL, name = NULL,
               embedding_dimension = NULL, embedder = NULL, created_hlc = NULL
           WHERE deleted""",
        """UPDATE experience_rows SET create_event = NULL, content = NULL, embedding = NULL,
               experience_type = NULL, type_data = NULL, source_agent = NULL,
               source_task = NULL, created_hlc = NULL, importance = NULL,
               importance_stamp = ''::BLOB, confidence = NULL, confidence_stamp = ''::BLOB,
               domain = NULL, domain_stamp = ''::BLOB, related_files = NULL,
               related_files_stamp = ''::BLOB, archived = false, archived_stamp = ''::BLOB
           WHERE deleted""",
        """UPDATE relation_rows SET create_event = NULL, source_id = NULL, target_id = NULL,
               relation_type = NULL, strength = NULL, metadata = NULL, created_hlc = NULL
           WHERE deleted""",
        """UPDATE insight_rows SET create_event = NULL, content = NULL, embedding = NULL,
               source_experiences = NULL, confidence = NULL, domain = NULL, created_hlc = NULL
           WHERE deleted""",
        """UPDATE wisdom_rows SET create_event = NULL, category = NULL, pattern = NULL,
               confidence = NULL, embedding = NULL, source_collectives = NULL,
               source_experience_count = NULL, applicable_domains = NULL, created_hlc = NULL
           WHERE deleted""",
    ],
}


def _auto_collectives(con: Any) -> None:
    """The collectives whose created event reads as "auto" since schema 9 (the upcaster
    of ``eventlog.codec``: a language equal to the one the name's script chose) say so in
    their rows too, as a rebuild would."""
    from eventlog.languages import AUTO, ENGLISH, of_name

    found = con.execute(
        "SELECT collective_id, name, language FROM collective_rows WHERE name IS NOT NULL"
    ).fetchall()
    chosen = [(cid,) for cid, name, language in found if (language or ENGLISH) == of_name(name)]
    if chosen:
        con.executemany(
            f"UPDATE collective_rows SET language = '{AUTO}' WHERE collective_id = ?", chosen
        )
