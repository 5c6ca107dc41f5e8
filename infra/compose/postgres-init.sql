-- Run once by the postgres image on an empty data volume (docker-entrypoint-initdb.d),
-- as the superuser, connected to POSTGRES_DB (= prefect).
--
--  * database `prefect` (Prefect server): created by the image from POSTGRES_DB;
--    Prefect needs the pg_trgm extension in it.
--  * database `catalog` (the sapiens-vfx catalog), owned by its own role `svfx`; Alembic
--    creates the tables when `svfx serve` (or the first flow) starts.
--
-- The catalog password comes from SVFX_CATALOG_PASSWORD in the container's environment
-- (\getenv needs psql >= 15). Changing it later needs ALTER ROLE: this script only runs
-- on an empty volume.

\set ON_ERROR_STOP on

CREATE EXTENSION IF NOT EXISTS pg_trgm;

\getenv catalog_password SVFX_CATALOG_PASSWORD
CREATE ROLE svfx LOGIN PASSWORD :'catalog_password';
CREATE DATABASE catalog OWNER svfx;
