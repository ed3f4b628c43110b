-- Destinations that write customer fields (segment, CLV tier, churn band) to the tenant's
-- VTEX Master Data CL documents.
ALTER TABLE cdp.destinations DROP CONSTRAINT destinations_platform_check;
ALTER TABLE cdp.destinations ADD CONSTRAINT destinations_platform_check
    CHECK (platform IN ('meta', 'google_data_manager', 'google_ads', 'vtex_collections',
                        'vtex_masterdata'));
