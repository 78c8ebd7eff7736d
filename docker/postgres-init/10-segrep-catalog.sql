-- Runs once, when the postgres volume is first initialised (as POSTGRES_USER, in POSTGRES_DB = airflow).
-- The same server holds Airflow's metadata (database airflow) and segrep's catalog (database segrep, its
-- own role), which segrep tasks use through SEGREP_CATALOG_URL; they never touch Airflow's database.
-- Local credentials only.
CREATE ROLE segrep LOGIN PASSWORD 'segrep';
CREATE DATABASE segrep OWNER segrep;
