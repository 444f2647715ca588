#!/bin/sh
# Run once by the postgres image when it initializes an empty data directory, as its superuser
# (docker-compose.yml mounts this folder at /docker-entrypoint-initdb.d). The roles of
# docs/OPERATIONS.md ("Postgres roles"): `ledger db upgrade` runs as ledger_owner, `ledger serve`
# as ledger_app, which cannot disable the append-only triggers (only a table's owner or a
# superuser can). ledger_auditor has no password: set one (ALTER ROLE) to audit over TCP.
set -eu
: "${LEDGER_OWNER_PASSWORD:?set LEDGER_OWNER_PASSWORD}"
: "${LEDGER_APP_PASSWORD:?set LEDGER_APP_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner_password="$LEDGER_OWNER_PASSWORD" -v app_password="$LEDGER_APP_PASSWORD" <<'SQL'
CREATE ROLE ledger_owner LOGIN PASSWORD :'owner_password';
CREATE ROLE ledger_app LOGIN PASSWORD :'app_password';
CREATE ROLE ledger_auditor LOGIN;
CREATE DATABASE ledger OWNER ledger_owner;
\c ledger
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO ledger_app, ledger_auditor;
ALTER DEFAULT PRIVILEGES FOR ROLE ledger_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO ledger_app;
ALTER DEFAULT PRIVILEGES FOR ROLE ledger_owner IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO ledger_app;
ALTER DEFAULT PRIVILEGES FOR ROLE ledger_owner IN SCHEMA public
  GRANT SELECT ON TABLES TO ledger_auditor;
SQL
