-- Audiences became tables refreshed one tenant at a time (dbt_project.yml, audiences): a
-- database that holds them as materialized views drops those views here, once, so dbt's next
-- build creates the tables (the all-tenant `audiences_refresh` does it for every tenant). Until
-- that build, the dropped audiences are not there to be sent.
DO $$
DECLARE
    audience record;
BEGIN
    FOR audience IN SELECT schemaname, matviewname FROM pg_matviews
                    WHERE schemaname = 'audiences'
    LOOP
        EXECUTE format('DROP MATERIALIZED VIEW %I.%I CASCADE',
                       audience.schemaname, audience.matviewname);
    END LOOP;
END $$;
