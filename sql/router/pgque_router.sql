-- pgque router: pgque's producer API as PL/Proxy functions, in a database of
-- its own (without the pgque extension), routing each call to one of N pgque
-- servers ("shards"). docs/scale-out.md is the design and the recipe;
-- scripts/cluster.sh builds a router and two shards on one machine.
--
-- Install (as a superuser, in the router database):
--   psql -d pgque -f sql/router/pgque_router.sql
--   psql -d pgque -c "SELECT pgque.configure_cluster(ARRAY['host=... dbname=pgque', 'host=... dbname=pgque'])"
-- Running it again replaces every function (the cluster config is kept).
--
-- Routing: a call goes to shard route_hash(queue_name, partition_key) & (N-1),
-- N a power of 2 (PL/Proxy's rule). route_hash is hashtextextended(key, 0),
-- the hash pgque.partition_slot uses on the shards, so for a key K and any
-- power-of-2 slot count n >= N: shard(K) = partition_slot(K, N) and
-- partition_slot(K, n) mod N = shard(K): a key's shard and its slot agree.
-- An event without a key goes where its queue's name hashes (all keyless
-- events of a queue on one shard, in order). Jobs go by actor, else by queue.
--
-- Each shard call commits on its own (PL/Proxy runs remote statements in
-- autocommit): a send_batch or enqueue_ready_rows spanning shards is one
-- transaction per shard, not one for the batch (docs/scale-out.md).
--
-- Functions are SECURITY INVOKER: PL/Proxy connects to the shards as the
-- calling role, so the shards' own grants (pgque_writer, ...) decide; the
-- role must exist on the router and on every shard.

-- Install-time trust, as the extension's (sql/00_bootstrap.sql): this script
-- reuses a schema pgque that exists already, and CREATE OR REPLACE keeps the
-- owner of a function that exists already. Whoever owns that schema, may
-- create in it or owns an object in it could replace the functions that
-- every router user (superusers included) then runs, so it is refused
-- unless only superusers control it; so are pgque's roles when they can log
-- in or are administered by a role that is not a superuser. A schema left
-- by an earlier run of this script (all owned by the superuser who ran it)
-- passes.
--
-- This file runs as plain SQL under the installing superuser's search_path,
-- which the database's owner can set (ALTER DATABASE ... SET search_path =
-- public, pg_catalog) and whose schemas that owner can fill. So every
-- statement below that runs here, not inside a function with a pinned
-- search_path, names every function, type and operator schema-qualified:
-- an unqualified `oid = 0` found a planted public.=(oid, int4) (pg_catalog
-- has no exact match for it) and ran it as the superuser, in exactly the
-- pre-created-schema case this check is for. (Casts to pg_catalog types and
-- OPERATOR(pg_catalog.x) leave nothing to resolve through the path.)
DO $trust$
DECLARE
    ns pg_catalog.oid := pg_catalog.to_regnamespace('pgque')::pg_catalog.oid;
    bad pg_catalog.text;
    r pg_catalog.text;
BEGIN
    SELECT pg_catalog.string_agg(w.what, ', ') INTO bad FROM (
        SELECT 'the schema''s owner ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.rolname) AS what
          FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) n.nspowner
         WHERE n.oid OPERATOR(pg_catalog.=) ns AND NOT a.rolsuper
        UNION ALL
        SELECT 'a grant of ' OPERATOR(pg_catalog.||) x.privilege_type OPERATOR(pg_catalog.||) ' to '
               OPERATOR(pg_catalog.||) CASE WHEN x.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                            ELSE pg_catalog.quote_ident(a.rolname) END
          FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) x
          LEFT JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) x.grantee
         WHERE n.oid OPERATOR(pg_catalog.=) ns AND NOT coalesce(a.rolsuper, false)
           AND NOT (x.privilege_type OPERATOR(pg_catalog.=) 'USAGE'::pg_catalog.text
                    AND a.rolname OPERATOR(pg_catalog.=) ANY
                        (ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin']::pg_catalog.name[]))
        UNION ALL
        SELECT o.kind OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) o.name
               OPERATOR(pg_catalog.||) ' owned by ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.rolname)
          FROM (SELECT 'relation'::pg_catalog.text AS kind, c.relname::pg_catalog.text AS name, c.relowner AS own
                  FROM pg_catalog.pg_class c WHERE c.relnamespace OPERATOR(pg_catalog.=) ns
                UNION ALL SELECT 'function', p.proname::pg_catalog.text, p.proowner
                            FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) ns
                UNION ALL SELECT 'type', t.typname::pg_catalog.text, t.typowner
                            FROM pg_catalog.pg_type t WHERE t.typnamespace OPERATOR(pg_catalog.=) ns
                UNION ALL SELECT 'operator', o.oprname::pg_catalog.text, o.oprowner
                            FROM pg_catalog.pg_operator o WHERE o.oprnamespace OPERATOR(pg_catalog.=) ns
               ) o JOIN pg_catalog.pg_authid a ON a.oid OPERATOR(pg_catalog.=) o.own
         WHERE NOT a.rolsuper
        UNION ALL
        SELECT 'role ' OPERATOR(pg_catalog.||) a.rolname::pg_catalog.text OPERATOR(pg_catalog.||) ' can log in'
          FROM pg_catalog.pg_authid a
         WHERE a.rolname OPERATOR(pg_catalog.=) ANY
                   (ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin']::pg_catalog.name[])
           AND a.rolcanlogin
        UNION ALL
        SELECT 'role ' OPERATOR(pg_catalog.||) g.rolname::pg_catalog.text
               OPERATOR(pg_catalog.||) ' is administered by ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(m.rolname)
          FROM pg_catalog.pg_auth_members am
          JOIN pg_catalog.pg_authid g ON g.oid OPERATOR(pg_catalog.=) am.roleid
          JOIN pg_catalog.pg_authid m ON m.oid OPERATOR(pg_catalog.=) am.member
         WHERE g.rolname OPERATOR(pg_catalog.=) ANY
                   (ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin']::pg_catalog.name[])
           AND am.admin_option AND NOT m.rolsuper
    ) w;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'pgque router: refusing to install over objects a role that is not a superuser controls: %', bad
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Whoever controls schema pgque or pgque''s roles controls what router users run. Check them, then drop that schema (or give it to a superuser) and fix the roles before running this script.';
    END IF;
END
$trust$;

CREATE EXTENSION IF NOT EXISTS plproxy;
CREATE SCHEMA IF NOT EXISTS pgque;

DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'pgque_reader'::pg_catalog.name) THEN
        CREATE ROLE pgque_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'pgque_writer'::pg_catalog.name) THEN
        CREATE ROLE pgque_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles
                    WHERE rolname OPERATOR(pg_catalog.=) 'pgque_admin'::pg_catalog.name) THEN
        CREATE ROLE pgque_admin NOLOGIN IN ROLE pgque_reader, pgque_writer;
    END IF;
END
$roles$;
GRANT USAGE ON SCHEMA pgque TO pgque_reader, pgque_writer, pgque_admin;

-- ---- cluster configuration ------------------------------------------------

-- configure_cluster(dsns) → the number of shards. (Re)defines the SQL/MED
-- server pgque_cluster with shard i at dsns[i+1] (libpq connection strings)
-- and a PUBLIC user mapping (PL/Proxy then connects as the calling role).
-- Replacing the list moves keys: see docs/scale-out.md before adding a shard.
-- Superuser (it runs DDL); 22004 for NULL, 22023 for a count that is not a
-- power of 2 or a NULL/empty DSN.
CREATE OR REPLACE FUNCTION pgque.configure_cluster(dsns text[]) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pgque, pg_temp AS $$
DECLARE
    n int := pg_catalog.cardinality(dsns);
    opts text;
BEGIN
    IF dsns IS NULL THEN
        RAISE EXCEPTION 'dsns must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF n < 1 OR n > 1024 OR (n & (n - 1)) <> 0 THEN
        RAISE EXCEPTION 'a cluster needs a power of 2 of shards (1..1024), got %', n
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(dsns) d WHERE d IS NULL OR d = '') THEN
        RAISE EXCEPTION 'dsns must not contain NULL or empty strings' USING ERRCODE = '22023';
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.format('p%s %L', i - 1, d), ', ' ORDER BY i)
      INTO opts FROM pg_catalog.unnest(dsns) WITH ORDINALITY AS t(d, i);
    DROP SERVER IF EXISTS pgque_cluster CASCADE;
    EXECUTE 'CREATE SERVER pgque_cluster FOREIGN DATA WRAPPER plproxy OPTIONS ('
            || 'connection_lifetime ''1800'', ' || opts || ')';
    CREATE USER MAPPING FOR PUBLIC SERVER pgque_cluster;
    GRANT USAGE ON FOREIGN SERVER pgque_cluster TO pgque_reader, pgque_writer, pgque_admin;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION pgque.configure_cluster(text[]) FROM PUBLIC;

-- shard_count() → N, the number of shards configured (0 if none).
CREATE OR REPLACE FUNCTION pgque.shard_count() RETURNS int
LANGUAGE sql STABLE SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT pg_catalog.count(*)::int
      FROM pg_catalog.pg_foreign_server s,
           LATERAL pg_catalog.pg_options_to_table(s.srvoptions) o
     WHERE s.srvname = 'pgque_cluster' AND o.option_name ~ '^p[0-9]+$'
$$;

-- shard_dsns() → (shard, dsn) of every shard, in shard order.
CREATE OR REPLACE FUNCTION pgque.shard_dsns() RETURNS TABLE (shard int, dsn text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT pg_catalog.substr(o.option_name, 2)::int, o.option_value
      FROM pg_catalog.pg_foreign_server s,
           LATERAL pg_catalog.pg_options_to_table(s.srvoptions) o
     WHERE s.srvname = 'pgque_cluster' AND o.option_name ~ '^p[0-9]+$'
     ORDER BY 1
$$;

-- route_hash(queue_name, partition_key) → the 64-bit routing hash:
-- hashtextextended(partition_key, 0) as pgque.partition_slot computes it,
-- the queue name's hash for a NULL key, 0 when both are NULL (the shard then
-- refuses the NULL queue name with its own error). PL/Proxy keeps the low
-- bits: shard = hash & (N-1).
CREATE OR REPLACE FUNCTION pgque.route_hash(queue_name text, partition_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(pg_catalog.hashtextextended(coalesce(partition_key, queue_name), 0), 0);

-- shard_of(queue_name, partition_key) → the shard (0..N-1) a send with that
-- queue and key goes to (NULL when no cluster is configured).
CREATE OR REPLACE FUNCTION pgque.shard_of(queue_name text, partition_key text) RETURNS int
LANGUAGE sql STABLE SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT (pgque.route_hash(queue_name, partition_key) & (n - 1))::int
      FROM (SELECT pgque.shard_count() AS n) c WHERE n > 0
$$;

-- ---- sending events: one shard per call ------------------------------------
-- PL/Proxy generates the remote call from the signature: SELECT pgque.send(...)
-- with typed parameters, so each overload reaches the same overload on the shard.

CREATE OR REPLACE FUNCTION pgque.send(queue_name text, payload jsonb) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send;
$$;
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, payload text) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send;
$$;
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload jsonb) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send;
$$;
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload text) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send;
$$;
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload jsonb,
                                      partition_key text) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send;
$$;
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload text,
                                      partition_key text) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send;
$$;

CREATE OR REPLACE FUNCTION pgque.send_at(queue_name text, type_name text, payload jsonb,
        deliver_at timestamptz, partition_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send_at;
$$;
CREATE OR REPLACE FUNCTION pgque.send_at(queue_name text, type_name text, payload text,
        deliver_at timestamptz, partition_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send_at;
$$;

-- send_idem goes where a send with the same partition key goes (its queue's
-- shard without a key): a retry of the same call reaches the shard that holds
-- the idempotency key, so a duplicate is found cluster-wide. The key ledger is
-- per shard: the same idem_key with a different partition key is a new event.
CREATE OR REPLACE FUNCTION pgque.send_idem(queue_name text, type_name text, payload jsonb,
        idem_key text, ttl interval DEFAULT '1 hour', partition_key text DEFAULT NULL)
RETURNS TABLE (event_id bigint, deduped boolean)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send_idem;
$$;
CREATE OR REPLACE FUNCTION pgque.send_idem(queue_name text, type_name text, payload text,
        idem_key text, ttl interval DEFAULT '1 hour', partition_key text DEFAULT NULL)
RETURNS TABLE (event_id bigint, deduped boolean)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, partition_key);
    TARGET pgque.send_idem;
$$;

-- Keyless batches: the queue's shard, one transaction.
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, payloads jsonb[]) RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, payloads text[]) RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads jsonb[])
RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads text[])
RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;

-- Keyed batches are split by shard (PL/Proxy's SPLIT: each shard gets the
-- elements whose key routes to it, in input order, in parallel). i_ords
-- carries each element's input position so the router can put the ids back
-- in input order. The shard_* functions are the split calls; send_batch is
-- the wrapper with the shards' own signature and result.
CREATE OR REPLACE FUNCTION pgque.shard_send_batch(queue_name text, type_name text,
        i_payloads jsonb[], i_keys text[], i_ords int[])
RETURNS TABLE (ord int, event_id bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    SPLIT i_payloads, i_keys, i_ords;
    RUN ON pgque.route_hash(queue_name, i_keys);
    SELECT u.o AS ord, u.e AS event_id
      FROM ROWS FROM (pg_catalog.unnest(i_ords),
                     pg_catalog.unnest(pgque.send_batch(queue_name, type_name, i_payloads, i_keys))) AS u(o, e);
$$;
CREATE OR REPLACE FUNCTION pgque.shard_send_batch(queue_name text, type_name text,
        i_payloads text[], i_keys text[], i_ords int[])
RETURNS TABLE (ord int, event_id bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    SPLIT i_payloads, i_keys, i_ords;
    RUN ON pgque.route_hash(queue_name, i_keys);
    SELECT u.o AS ord, u.e AS event_id
      FROM ROWS FROM (pg_catalog.unnest(i_ords),
                     pg_catalog.unnest(pgque.send_batch(queue_name, type_name, i_payloads, i_keys))) AS u(o, e);
$$;
-- The unsplit call, for input the shard must refuse itself (NULL or
-- misaligned arrays, an empty batch): its error, not PL/Proxy's.
CREATE OR REPLACE FUNCTION pgque.shard_send_batch_one(queue_name text, type_name text,
        payloads jsonb[], partition_keys text[]) RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;
CREATE OR REPLACE FUNCTION pgque.shard_send_batch_one(queue_name text, type_name text,
        payloads text[], partition_keys text[]) RETURNS bigint[]
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.send_batch;
$$;

-- send_batch(queue_name, type_name, payloads, partition_keys) → the event
-- ids in input order, each event on its key's shard.
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads jsonb[],
        partition_keys text[]) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pgque, pg_temp AS $$
DECLARE
    n int := pg_catalog.cardinality(payloads);
BEGIN
    IF n IS NULL OR n = 0 OR partition_keys IS NULL
       OR pg_catalog.cardinality(partition_keys) <> n
       OR pg_catalog.array_ndims(payloads) > 1 OR pg_catalog.array_ndims(partition_keys) > 1 THEN
        RETURN pgque.shard_send_batch_one(queue_name, type_name, payloads, partition_keys);
    END IF;
    RETURN (SELECT pg_catalog.array_agg(s.event_id ORDER BY s.ord)
              FROM pgque.shard_send_batch(queue_name, type_name, payloads, partition_keys,
                       (SELECT pg_catalog.array_agg(g) FROM pg_catalog.generate_series(1, n) g)) s);
END
$$;
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads text[],
        partition_keys text[]) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pgque, pg_temp AS $$
DECLARE
    n int := pg_catalog.cardinality(payloads);
BEGIN
    IF n IS NULL OR n = 0 OR partition_keys IS NULL
       OR pg_catalog.cardinality(partition_keys) <> n
       OR pg_catalog.array_ndims(payloads) > 1 OR pg_catalog.array_ndims(partition_keys) > 1 THEN
        RETURN pgque.shard_send_batch_one(queue_name, type_name, payloads, partition_keys);
    END IF;
    RETURN (SELECT pg_catalog.array_agg(s.event_id ORDER BY s.ord)
              FROM pgque.shard_send_batch(queue_name, type_name, payloads, partition_keys,
                       (SELECT pg_catalog.array_agg(g) FROM pg_catalog.generate_series(1, n) g)) s);
END
$$;

-- ---- job queues ------------------------------------------------------------

-- enqueue goes to the actor's shard (so an actor's capacity, set on every
-- shard with set_actor_capacity, holds cluster-wide), else the queue's.
CREATE OR REPLACE FUNCTION pgque.enqueue(queue_name text, kind text, args jsonb DEFAULT '{}',
        priority int DEFAULT 0, run_at timestamptz DEFAULT NULL, actor text DEFAULT NULL,
        fairness_key text DEFAULT NULL, identity_key text DEFAULT NULL,
        unique_key text DEFAULT NULL, max_attempts int DEFAULT NULL,
        on_duplicate text DEFAULT 'skip') RETURNS bigint
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, actor);
    TARGET pgque.enqueue;
$$;

-- The split call of enqueue_ready_rows: rows by actor (else queue), with
-- each row's input position in i_ords; every array has one element per row.
CREATE OR REPLACE FUNCTION pgque.shard_enqueue_ready_rows(queue_name text, i_kinds text[],
        i_args jsonb[], i_priorities smallint[], i_run_at timestamptz[], i_actors text[],
        i_fairness_keys text[], i_identity_keys text[], i_unique_keys text[],
        i_max_attempts int[], on_duplicate text, i_ords int[])
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    SPLIT i_kinds, i_args, i_priorities, i_run_at, i_actors, i_fairness_keys,
          i_identity_keys, i_unique_keys, i_max_attempts, i_ords;
    RUN ON pgque.route_hash(queue_name, i_actors);
    SELECT (i_ords)[r.ord] AS ord, r.job_id AS job_id, r.state AS state
      FROM pgque.enqueue_ready_rows(queue_name, i_kinds, i_args, i_priorities, i_run_at,
               i_actors, i_fairness_keys, i_identity_keys, i_unique_keys, i_max_attempts,
               on_duplicate) r;
$$;
CREATE OR REPLACE FUNCTION pgque.shard_enqueue_ready_rows_one(queue_name text, kinds text[],
        args jsonb[], priorities smallint[], run_at timestamptz[], actors text[],
        fairness_keys text[], identity_keys text[], unique_keys text[],
        max_attempts int[], on_duplicate text)
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON pgque.route_hash(queue_name, NULL::text);
    TARGET pgque.enqueue_ready_rows;
$$;

-- enqueue_ready_rows(...) → one row per input position, as on a shard; the
-- rows go to their actor's shard (the queue's without an actor). Input a
-- shard must refuse (NULL kinds, misaligned arrays) is sent whole to the
-- queue's shard for its own error. NULL arrays take the defaults, as there.
CREATE OR REPLACE FUNCTION pgque.enqueue_ready_rows(queue_name text, kinds text[], args jsonb[],
        priorities smallint[] DEFAULT NULL, run_at timestamptz[] DEFAULT NULL,
        actors text[] DEFAULT NULL, fairness_keys text[] DEFAULT NULL,
        identity_keys text[] DEFAULT NULL, unique_keys text[] DEFAULT NULL,
        max_attempts int[] DEFAULT NULL, on_duplicate text DEFAULT 'skip')
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plpgsql SET search_path = pg_catalog, pgque, pg_temp AS $$
#variable_conflict use_column
DECLARE
    n int := pg_catalog.cardinality(kinds);
    ok boolean;
BEGIN
    ok := n IS NOT NULL AND n > 0 AND actors IS NOT NULL
          AND pg_catalog.cardinality(actors) = n
          AND coalesce(pg_catalog.cardinality(args), -1) = n
          AND coalesce(pg_catalog.cardinality(priorities), n) = n
          AND coalesce(pg_catalog.cardinality(run_at), n) = n
          AND coalesce(pg_catalog.cardinality(fairness_keys), n) = n
          AND coalesce(pg_catalog.cardinality(identity_keys), n) = n
          AND coalesce(pg_catalog.cardinality(unique_keys), n) = n
          AND coalesce(pg_catalog.cardinality(max_attempts), n) = n;
    IF NOT ok THEN
        -- No actors (all rows on the queue's shard, one transaction) or input
        -- the shard refuses.
        RETURN QUERY SELECT * FROM pgque.shard_enqueue_ready_rows_one(queue_name, kinds, args,
            priorities, run_at, actors, fairness_keys, identity_keys, unique_keys, max_attempts,
            on_duplicate);
        RETURN;
    END IF;
    RETURN QUERY SELECT s.ord, s.job_id, s.state
      FROM pgque.shard_enqueue_ready_rows(queue_name, kinds, args,
               coalesce(priorities, pg_catalog.array_fill(NULL::smallint, ARRAY[n])),
               coalesce(run_at, pg_catalog.array_fill(NULL::timestamptz, ARRAY[n])),
               actors,
               coalesce(fairness_keys, pg_catalog.array_fill(NULL::text, ARRAY[n])),
               coalesce(identity_keys, pg_catalog.array_fill(NULL::text, ARRAY[n])),
               coalesce(unique_keys, pg_catalog.array_fill(NULL::text, ARRAY[n])),
               coalesce(max_attempts, pg_catalog.array_fill(NULL::int, ARRAY[n])),
               on_duplicate,
               (SELECT pg_catalog.array_agg(g) FROM pg_catalog.generate_series(1, n) g)) s
     ORDER BY s.ord;
END
$$;

-- ---- administration: every shard -------------------------------------------

CREATE OR REPLACE FUNCTION pgque.shard_create_queue(queue_name text) RETURNS SETOF int
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON ALL;
    TARGET pgque.create_queue;
$$;
-- create_queue(queue_name) → 1 if some shard created it, 0 if every shard had
-- it (a shard that is down fails the call; run it again once it is up).
CREATE OR REPLACE FUNCTION pgque.create_queue(queue_name text) RETURNS int
LANGUAGE sql SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT pg_catalog.max(r) FROM pgque.shard_create_queue(queue_name) r
$$;

CREATE OR REPLACE FUNCTION pgque.shard_create_job_queue(queue_name text, mode text, shards int)
RETURNS SETOF int
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON ALL;
    TARGET pgque.create_job_queue;
$$;
-- create_job_queue(queue_name, mode, shards) on every shard, as create_queue.
CREATE OR REPLACE FUNCTION pgque.create_job_queue(queue_name text, mode text DEFAULT 'strict_fifo',
        shards int DEFAULT 1) RETURNS int
LANGUAGE sql SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT pg_catalog.max(r) FROM pgque.shard_create_job_queue(queue_name, mode, shards) r
$$;

-- ---- cluster-wide status ---------------------------------------------------

-- One shard's get_queue_info (i_shard: the shard number, PL/Proxy maps it
-- to itself).
CREATE OR REPLACE FUNCTION pgque.shard_get_queue_info(i_shard int, i_queue text)
RETURNS TABLE (queue_name text, queue_ntables int, queue_cur_table int,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_external_ticker boolean, queue_ticker_paused boolean,
               queue_ticker_max_count int, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, ticker_lag interval, ev_per_sec float8,
               ev_new bigint, last_tick_id bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON i_shard;
    SELECT * FROM pgque.get_queue_info(i_queue);
$$;
CREATE OR REPLACE FUNCTION pgque.shard_get_queue_info_all(i_shard int)
RETURNS TABLE (queue_name text, queue_ntables int, queue_cur_table int,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_external_ticker boolean, queue_ticker_paused boolean,
               queue_ticker_max_count int, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, ticker_lag interval, ev_per_sec float8,
               ev_new bigint, last_tick_id bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON i_shard;
    SELECT * FROM pgque.get_queue_info();
$$;

-- get_queue_info(queue_name) → the shards' get_queue_info rows, with the
-- shard number first. Every shard must answer (a shard that is down fails
-- the call with PL/Proxy's connection error naming it).
CREATE OR REPLACE FUNCTION pgque.get_queue_info(queue_name text)
RETURNS TABLE (shard int, queue_name text, queue_ntables int, queue_cur_table int,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_external_ticker boolean, queue_ticker_paused boolean,
               queue_ticker_max_count int, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, ticker_lag interval, ev_per_sec float8,
               ev_new bigint, last_tick_id bigint)
LANGUAGE sql SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT s, i.* FROM pg_catalog.generate_series(0, pgque.shard_count() - 1) s,
                       LATERAL pgque.shard_get_queue_info(s, $1) i
     ORDER BY s
$$;
CREATE OR REPLACE FUNCTION pgque.get_queue_info()
RETURNS TABLE (shard int, queue_name text, queue_ntables int, queue_cur_table int,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_external_ticker boolean, queue_ticker_paused boolean,
               queue_ticker_max_count int, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, ticker_lag interval, ev_per_sec float8,
               ev_new bigint, last_tick_id bigint)
LANGUAGE sql SET search_path = pg_catalog, pgque, pg_temp AS $$
    SELECT s, i.* FROM pg_catalog.generate_series(0, pgque.shard_count() - 1) s,
                       LATERAL pgque.shard_get_queue_info_all(s) i
     ORDER BY s, i.queue_name
$$;

CREATE OR REPLACE FUNCTION pgque.shard_metrics(i_shard int)
RETURNS TABLE (name text, labels jsonb, value float8)
LANGUAGE plproxy AS $$
    CLUSTER 'pgque_cluster';
    RUN ON i_shard;
    SELECT * FROM pgque.metrics();
$$;

-- metrics() → every shard's pgque.metrics() rows with a "shard" label added,
-- and pgque_shard_up{shard} (1, or 0 for a shard that did not answer: its
-- figures are then missing, the others still reported).
CREATE OR REPLACE FUNCTION pgque.metrics() RETURNS TABLE (name text, labels jsonb, value float8)
LANGUAGE plpgsql SET search_path = pg_catalog, pgque, pg_temp AS $$
#variable_conflict use_column
DECLARE
    s int;
    up float8;
BEGIN
    FOR s IN 0 .. pgque.shard_count() - 1 LOOP
        BEGIN
            RETURN QUERY SELECT m.name, m.labels || pg_catalog.jsonb_build_object('shard', s::text),
                                m.value
                           FROM pgque.shard_metrics(s) m;
            up := 1;
        EXCEPTION WHEN OTHERS THEN
            up := 0;
        END;
        RETURN QUERY SELECT 'pgque_shard_up'::text, pg_catalog.jsonb_build_object('shard', s::text), up;
    END LOOP;
END
$$;

-- ---- grants: as on the shards ----------------------------------------------
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgque.route_hash(text, text), pgque.shard_of(text, text),
    pgque.shard_count(), pgque.shard_dsns()
  TO pgque_reader, pgque_writer, pgque_admin;
GRANT EXECUTE ON FUNCTION
    pgque.send(text, jsonb), pgque.send(text, text), pgque.send(text, text, jsonb),
    pgque.send(text, text, text), pgque.send(text, text, jsonb, text),
    pgque.send(text, text, text, text),
    pgque.send_at(text, text, jsonb, timestamptz, text), pgque.send_at(text, text, text, timestamptz, text),
    pgque.send_idem(text, text, jsonb, text, interval, text),
    pgque.send_idem(text, text, text, text, interval, text),
    pgque.send_batch(text, jsonb[]), pgque.send_batch(text, text[]),
    pgque.send_batch(text, text, jsonb[]), pgque.send_batch(text, text, text[]),
    pgque.send_batch(text, text, jsonb[], text[]), pgque.send_batch(text, text, text[], text[]),
    pgque.shard_send_batch(text, text, jsonb[], text[], int[]),
    pgque.shard_send_batch(text, text, text[], text[], int[]),
    pgque.shard_send_batch_one(text, text, jsonb[], text[]),
    pgque.shard_send_batch_one(text, text, text[], text[]),
    pgque.enqueue(text, text, jsonb, int, timestamptz, text, text, text, text, int, text),
    pgque.enqueue_ready_rows(text, text[], jsonb[], smallint[], timestamptz[], text[], text[],
                             text[], text[], int[], text),
    pgque.shard_enqueue_ready_rows(text, text[], jsonb[], smallint[], timestamptz[], text[],
                                   text[], text[], text[], int[], text, int[]),
    pgque.shard_enqueue_ready_rows_one(text, text[], jsonb[], smallint[], timestamptz[], text[],
                                       text[], text[], text[], int[], text)
  TO pgque_writer;
GRANT EXECUTE ON FUNCTION
    pgque.get_queue_info(), pgque.get_queue_info(text), pgque.shard_get_queue_info(int, text),
    pgque.shard_get_queue_info_all(int), pgque.metrics(), pgque.shard_metrics(int)
  TO pgque_reader, pgque_admin;
GRANT EXECUTE ON FUNCTION
    pgque.create_queue(text), pgque.shard_create_queue(text),
    pgque.create_job_queue(text, text, int), pgque.shard_create_job_queue(text, text, int)
  TO pgque_admin;
