-- pgque bootstrap: objects every module needs, created before anything else.
-- The schema `pgque` itself is created by CREATE EXTENSION (pgque.control: schema = pgque).

-- pgque needs a UTF8 database. Its functions take and return text as Rust
-- strings, which are UTF-8: in a LATIN1 (or SQL_ASCII, ...) database their
-- bytes are not, and the results would differ from the SQL they stand for
-- (a jsonb payload's "café" stored as "caf\ufffd"). Converting at every
-- boundary would put a conversion on every hot path for a kind of database
-- few create today, so the extension refuses them, before it creates
-- anything (docs/operations.md, "Databases pgque runs in").
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'pgque needs a database with encoding UTF8, and this one is %',
                        pg_catalog.getdatabaseencoding()
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Create the database with ENCODING ''UTF8'' (any locale and collation provider will do) and install pgque there.';
    END IF;
END
$encoding$;

-- Install-time trust (docs/operations.md, "Threat model"): CREATE EXTENSION
-- reuses a schema `pgque` that exists already, and whoever owns that schema,
-- or may create in it, can replace pgque's objects (the worker runs them as
-- superuser) or plant overloads that its functions would resolve to. So
-- the schema must be one only superusers control: owned by a superuser, no
-- privilege on it for anyone else but pgque's own USAGE grants, and every
-- object in it owned by a superuser (the leftovers of an earlier pgque that
-- DROP EXTENSION leaves, such as event tables). This runs first, before
-- anything of the schema is used; every name is qualified.
-- The same for the cluster-wide roles pgque adopts when they exist: one that
-- can log in, or that a role other than a superuser administers, would hand
-- pgque's rights to whoever controls it, so it is refused; the members it
-- already has are reported.
DO $trust$
DECLARE
    ns pg_catalog.oid := pg_catalog.to_regnamespace('pgque')::pg_catalog.oid;
    owner pg_catalog.name;
    bad pg_catalog.text;
    r pg_catalog.text;
BEGIN
    SELECT a.rolname INTO owner FROM pg_catalog.pg_namespace n
      JOIN pg_catalog.pg_authid a ON a.oid = n.nspowner
     WHERE n.oid = ns AND NOT a.rolsuper;
    IF owner IS NOT NULL THEN
        RAISE EXCEPTION 'schema pgque exists already and is owned by %, who is not a superuser', owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Whoever controls schema pgque controls pgque. Check what it holds, then DROP SCHEMA pgque CASCADE (or ALTER SCHEMA pgque OWNER TO a superuser) before CREATE EXTENSION pgque.';
    END IF;
    -- Every operator here is pg_catalog's by name: a role that may create in
    -- the schema could plant one (say pgque.=(oid, integer)) that an
    -- unqualified comparison would resolve to, run as this superuser. A
    -- grant to PUBLIC (grantee 0, no pg_authid row) is refused like any other.
    SELECT pg_catalog.string_agg(DISTINCT CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                    ELSE pg_catalog.quote_ident(a.rolname) END
                                 OPERATOR(pg_catalog.||) ' (' OPERATOR(pg_catalog.||) x.privilege_type
                                 OPERATOR(pg_catalog.||) ')', ', ')
      INTO bad
      FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) x
      LEFT JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) x.grantee
     WHERE n.oid OPERATOR(pg_catalog.=) ns AND NOT coalesce(a.rolsuper, false)
       AND NOT coalesce(x.privilege_type OPERATOR(pg_catalog.=) 'USAGE'::pg_catalog.text
                        AND a.rolname OPERATOR(pg_catalog.=) ANY (ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin']::pg_catalog.name[]),
                        false);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema pgque exists already and grants privileges to roles that are not superusers: %', bad
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Check what schema pgque holds, then DROP SCHEMA pgque CASCADE (or REVOKE those privileges) before CREATE EXTENSION pgque.';
    END IF;
    SELECT pg_catalog.string_agg(o.what, ', ') INTO bad FROM (
        SELECT 'relation ' OPERATOR(pg_catalog.||) c.relname AS what, c.relowner AS own FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'function ' OPERATOR(pg_catalog.||) p.proname, p.proowner FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'type ' OPERATOR(pg_catalog.||) t.typname, t.typowner FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'operator ' OPERATOR(pg_catalog.||) o.oprname, o.oprowner FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'collation ' OPERATOR(pg_catalog.||) c.collname, c.collowner FROM pg_catalog.pg_collation c WHERE c.collnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'conversion ' OPERATOR(pg_catalog.||) c.conname, c.conowner FROM pg_catalog.pg_conversion c WHERE c.connamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'operator family ' OPERATOR(pg_catalog.||) f.opfname, f.opfowner FROM pg_catalog.pg_opfamily f WHERE f.opfnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'operator class ' OPERATOR(pg_catalog.||) c.opcname, c.opcowner FROM pg_catalog.pg_opclass c WHERE c.opcnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'text search configuration ' OPERATOR(pg_catalog.||) c.cfgname, c.cfgowner FROM pg_catalog.pg_ts_config c WHERE c.cfgnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'text search dictionary ' OPERATOR(pg_catalog.||) d.dictname, d.dictowner FROM pg_catalog.pg_ts_dict d WHERE d.dictnamespace OPERATOR(pg_catalog.=) ns
        UNION ALL SELECT 'statistics ' OPERATOR(pg_catalog.||) s.stxname, s.stxowner FROM pg_catalog.pg_statistic_ext s WHERE s.stxnamespace OPERATOR(pg_catalog.=) ns
    ) o JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) o.own
     WHERE NOT a.rolsuper;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'schema pgque exists already and holds objects owned by roles that are not superusers: %', bad
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Check what schema pgque holds, then DROP SCHEMA pgque CASCADE before CREATE EXTENSION pgque.';
    END IF;

    FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin'] LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_authid a WHERE a.rolname OPERATOR(pg_catalog.=) r AND a.rolcanlogin) THEN
            RAISE EXCEPTION 'role % exists already and can log in', r
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'pgque''s roles are groups: ALTER ROLE ' || r || ' NOLOGIN (or drop it) before CREATE EXTENSION pgque.';
        END IF;
        SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname), ', ') INTO bad
          FROM pg_catalog.pg_auth_members am
          JOIN pg_catalog.pg_authid g ON g.oid OPERATOR(pg_catalog.=) am.roleid
          JOIN pg_catalog.pg_authid m ON m.oid OPERATOR(pg_catalog.=) am.member
         WHERE g.rolname OPERATOR(pg_catalog.=) r AND am.admin_option AND NOT m.rolsuper;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'role % exists already and is administered by roles that are not superusers: %', r, bad
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'They could grant pgque''s rights to anyone: REVOKE ADMIN OPTION FOR ' || r || ' FROM them (or drop the role) before CREATE EXTENSION pgque.';
        END IF;
        SELECT pg_catalog.string_agg(pg_catalog.quote_ident(m.rolname), ', ') INTO bad
          FROM pg_catalog.pg_auth_members am
          JOIN pg_catalog.pg_authid g ON g.oid OPERATOR(pg_catalog.=) am.roleid
          JOIN pg_catalog.pg_authid m ON m.oid OPERATOR(pg_catalog.=) am.member
         WHERE g.rolname OPERATOR(pg_catalog.=) r
           AND m.rolname OPERATOR(pg_catalog.<>) ALL (ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin']::pg_catalog.name[]);
        IF bad IS NOT NULL THEN
            RAISE NOTICE 'role % exists already; its members get its pgque rights: %', r, bad;
        END IF;
    END LOOP;
END
$trust$;

-- Roles. Created if missing (they are cluster-wide and outlive the extension).
-- pgque_admin is a member of both others, so it can do all they can.
-- When they are all there (every install but a cluster's first) this block
-- only reads: GRANT takes locks on the roles it names, and installs in other
-- databases (or an application granting pgque's roles) taking those locks in
-- another order deadlocked. A cluster's first installs, which must create,
-- take turns on a lock of pg_authid (held to commit; it also holds off other
-- role DDL for that moment): the next one then finds what the first made.
DO $roles$
DECLARE r text;
BEGIN
    IF (SELECT pg_catalog.count(*) FROM pg_catalog.pg_roles
         WHERE rolname IN ('pgque_reader', 'pgque_writer', 'pgque_admin')) = 3
       AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_auth_members am
              JOIN pg_catalog.pg_roles g ON g.oid = am.roleid
              JOIN pg_catalog.pg_roles m ON m.oid = am.member
             WHERE m.rolname = 'pgque_admin' AND g.rolname IN ('pgque_reader', 'pgque_writer')) = 2
    THEN
        RETURN;
    END IF;
    LOCK TABLE pg_catalog.pg_authid IN SHARE ROW EXCLUSIVE MODE;
    FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
    FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer'] LOOP
        IF NOT pg_catalog.pg_has_role('pgque_admin', r, 'MEMBER') THEN
            EXECUTE pg_catalog.format('GRANT %I TO pgque_admin', r);
        END IF;
    END LOOP;
END
$roles$;
GRANT USAGE ON SCHEMA pgque TO pgque_reader, pgque_writer, pgque_admin;

-- What receive() returns: PgQue's message type, column for column.
CREATE TYPE pgque.message AS (
    msg_id      bigint,
    batch_id    bigint,
    type        text,
    payload     text,
    retry_count int4,        -- NULL on first delivery
    created_at  timestamptz,
    extra1      text,
    extra2      text,
    extra3      text,
    extra4      text
);

-- Per-database switch of the background worker (start() / stop()).
-- One row; the worker reads it each loop and exits when it is off.
CREATE TABLE pgque.worker_config (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    worker_enabled boolean NOT NULL DEFAULT true,
    changed_at     timestamptz NOT NULL DEFAULT now(),
    -- set_tick_period_ms(): this database's tick period (NULL: pgque.tick_period_ms)
    tick_period_ms int4 CHECK (tick_period_ms BETWEEN 1 AND 1000)
);
INSERT INTO pgque.worker_config DEFAULT VALUES;
