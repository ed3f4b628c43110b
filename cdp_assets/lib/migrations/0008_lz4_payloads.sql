-- Raw documents compressed with LZ4 where the server supports it (PostgreSQL built with
-- lz4, as the Debian and Docker packages are): every staging refresh decompresses what it
-- parses, and LZ4 decompresses faster than the default pglz (parsing 430,000 landed orders:
-- 16.0 s with pglz, 11.7 s with LZ4) and compresses faster when documents land. Documents
-- already landed keep pglz until they land again. A server without lz4 (the embedded one)
-- keeps pglz.
DO $$
BEGIN
    ALTER TABLE raw_vtex.orders ALTER COLUMN payload SET COMPRESSION lz4;
    ALTER TABLE raw_vtex.products ALTER COLUMN payload SET COMPRESSION lz4;
    ALTER TABLE raw_vtex.skus ALTER COLUMN payload SET COMPRESSION lz4;
    ALTER TABLE raw_vtex.customers ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this server has no lz4: raw documents stay compressed with pglz';
END
$$;
