//! Install-time trust (docs/operations.md, "Threat model"), as attacks: a
//! schema `pgque` prepared before the install by a role that is not a
//! superuser, and pgque roles that can log in or that others administer.
mod sec_util;
use pgque_pg_test::*;
use sec_util::*;

#[test]
fn security_install_refuses_a_pgque_schema_others_control() {
    let _g = serial();
    ensure_role(&mut connect_to("postgres"), "sec_dbowner", "LOGIN");
    let db = TestDb::without_extension("sec_schema");
    let mut su = db.connect();
    su.batch_execute("ALTER DATABASE sec_schema OWNER TO sec_dbowner")
        .unwrap();
    let mut o = db.connect_as("sec_dbowner");

    // The database owner prepares the schema before the superuser installs.
    o.batch_execute("CREATE SCHEMA pgque").unwrap();
    let (st, msg) = failure(su.batch_execute("CREATE EXTENSION pgque"));
    assert_eq!(st, "42501", "{msg}");
    assert!(msg.contains("owned by sec_dbowner"), "{msg}");
    assert!(!extension_installed(&mut su));
    su.batch_execute("DROP SCHEMA pgque CASCADE").unwrap();

    // A superuser's schema that lets the owner create in it.
    su.batch_execute("CREATE SCHEMA pgque; GRANT CREATE ON SCHEMA pgque TO sec_dbowner")
        .unwrap();
    let (st, msg) = failure(su.batch_execute("CREATE EXTENSION pgque"));
    assert_eq!(st, "42501", "{msg}");
    assert!(msg.contains("sec_dbowner (CREATE)"), "{msg}");

    // ... which planted an overload pgque's calls would resolve to, and the
    // grant revoked afterwards: the object stays the owner's.
    o.batch_execute(
        "CREATE FUNCTION pgque.nextval(text) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'",
    )
    .unwrap();
    su.batch_execute("REVOKE CREATE ON SCHEMA pgque FROM sec_dbowner")
        .unwrap();
    let (st, msg) = failure(su.batch_execute("CREATE EXTENSION pgque"));
    assert_eq!(st, "42501", "{msg}");
    assert!(msg.contains("function nextval"), "{msg}");
    assert!(!extension_installed(&mut su));
    su.batch_execute("DROP SCHEMA pgque CASCADE").unwrap();

    // A grant to PUBLIC (grantee 0, no role row) is refused like any other.
    su.batch_execute("CREATE SCHEMA pgque; GRANT USAGE ON SCHEMA pgque TO PUBLIC")
        .unwrap();
    let (st, msg) = failure(su.batch_execute("CREATE EXTENSION pgque"));
    assert_eq!(st, "42501", "{msg}");
    assert!(msg.contains("PUBLIC (USAGE)"), "{msg}");
    assert!(!extension_installed(&mut su));
    su.batch_execute("DROP SCHEMA pgque CASCADE").unwrap();

    // The owner, allowed to create in a superuser's schema, plants the
    // operator that the check of that very grant would have resolved its
    // `grantee = 0` (oid = integer) to: the check runs pg_catalog's, so the
    // planted one never runs as the installing superuser (it would leave a
    // NOTICE behind, and flip the verdict).
    su.batch_execute("CREATE SCHEMA pgque; GRANT CREATE, USAGE ON SCHEMA pgque TO sec_dbowner")
        .unwrap();
    o.batch_execute(
        "CREATE FUNCTION pgque.planted_eq(oid, integer) RETURNS boolean LANGUAGE plpgsql AS \
         $$BEGIN RAISE NOTICE 'planted operator ran as %', current_user; RETURN false; END$$; \
         CREATE OPERATOR pgque.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = pgque.planted_eq); \
         CREATE FUNCTION pgque.planted_cat(text, name) RETURNS text LANGUAGE plpgsql AS \
         $$BEGIN RAISE NOTICE 'planted operator ran as %', current_user; RETURN 'x'; END$$; \
         CREATE OPERATOR pgque.|| (LEFTARG = text, RIGHTARG = name, FUNCTION = pgque.planted_cat)",
    )
    .unwrap();
    let out = db.psql("CREATE EXTENSION pgque;", &[]);
    assert!(!out.contains("planted operator ran"), "{out}");
    assert!(out.contains("sec_dbowner (CREATE)"), "{out}");
    su.batch_execute("REVOKE CREATE, USAGE ON SCHEMA pgque FROM sec_dbowner")
        .unwrap();
    let out = db.psql("CREATE EXTENSION pgque;", &[]);
    assert!(!out.contains("planted operator ran"), "{out}");
    assert!(
        out.contains("owned by roles that are not superusers"),
        "{out}"
    );
    assert!(!extension_installed(&mut su));
    su.batch_execute("DROP SCHEMA pgque CASCADE").unwrap();

    // What only superusers control is accepted: an empty schema of theirs
    // (as pg_restore creates it), and what DROP EXTENSION leaves behind
    // (the schema with pgque's grants, the event tables of a queue).
    su.batch_execute("CREATE SCHEMA pgque; CREATE EXTENSION pgque; SELECT pgque.stop()")
        .unwrap();
    su.batch_execute(
        "SELECT pgque.create_queue('left'); DROP EXTENSION pgque; CREATE EXTENSION pgque; \
         SELECT pgque.stop()",
    )
    .unwrap();
    assert!(extension_installed(&mut su));
}

/// On a private cluster: the roles are the cluster's, and while this test
/// lets one log in, an install in any database of that server is refused.
#[test]
fn security_install_refuses_pgque_roles_that_log_in_or_others_administer() {
    let cl = Cluster::start_new("sec_roles", "");
    // the roles exist (created by the first install of the cluster)
    drop(cl.create_db("sec_roles_first"));
    cl.connect("postgres")
        .batch_execute("CREATE DATABASE sec_roles")
        .unwrap();
    let mut su = cl.connect("sec_roles");
    ensure_role(&mut su, "sec_lead", "LOGIN");

    su.batch_execute("ALTER ROLE pgque_writer LOGIN").unwrap();
    let login = failure(su.batch_execute("CREATE EXTENSION pgque"));
    su.batch_execute("ALTER ROLE pgque_writer NOLOGIN").unwrap();
    su.batch_execute("GRANT pgque_reader TO sec_lead WITH ADMIN OPTION")
        .unwrap();
    let admin = failure(su.batch_execute("CREATE EXTENSION pgque"));
    su.batch_execute("REVOKE pgque_reader FROM sec_lead")
        .unwrap();

    assert_eq!(login.0, "42501", "{}", login.1);
    assert!(
        login.1.contains("pgque_writer") && login.1.contains("can log in"),
        "{}",
        login.1
    );
    assert_eq!(admin.0, "42501", "{}", admin.1);
    assert!(
        admin.1.contains("pgque_reader") && admin.1.contains("sec_lead"),
        "{}",
        admin.1
    );
    assert!(!extension_installed(&mut su));
    // and with the roles as pgque made them, the install goes through
    su.batch_execute("CREATE EXTENSION pgque").unwrap();
}
