-- What staging reads of an order, kept beside the document as it lands.
--
-- An order document (6 KiB in the sandbox, more in real stores) is stored compressed out of
-- line (TOAST), so every staging read decompresses and walks all of it: a million orders took
-- 18 s to parse for stg_vtex__orders and as long again for stg_vtex__order_items. The
-- summary keeps the document's own shape but only the fields staging reads (status, value,
-- the currency, the client profile's identity fields, and per item its ids, quantity and
-- prices); it is a few hundred bytes, stored inline, and computed once per landed version
-- while the document is already in memory. Keys absent from the document stay absent.
-- Adding the column computes it for the orders already landed (80 s for a million).
CREATE FUNCTION raw_vtex.order_summary(document jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'status', document -> 'status',
        'value', document -> 'value',
        'storePreferencesData', jsonb_build_object(
            'currencyCode', document -> 'storePreferencesData' -> 'currencyCode'
        ),
        'clientProfileData', jsonb_build_object(
            'userProfileId', document -> 'clientProfileData' -> 'userProfileId',
            'email', document -> 'clientProfileData' -> 'email',
            'document', document -> 'clientProfileData' -> 'document',
            'documentType', document -> 'clientProfileData' -> 'documentType',
            'phone', document -> 'clientProfileData' -> 'phone',
            'firstName', document -> 'clientProfileData' -> 'firstName',
            'lastName', document -> 'clientProfileData' -> 'lastName'
        ),
        'items', CASE WHEN jsonb_typeof(document -> 'items') = 'array' THEN (
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                'id', item.value -> 'id',
                'productId', item.value -> 'productId',
                'quantity', item.value -> 'quantity',
                'price', item.value -> 'price',
                'sellingPrice', item.value -> 'sellingPrice'
            ) ORDER BY item.ordinality), '[]'::jsonb)
            FROM jsonb_array_elements(document -> 'items') WITH ORDINALITY AS item (value, ordinality)
        ) END
    ))
$$;

ALTER TABLE raw_vtex.orders
    ADD COLUMN summary jsonb GENERATED ALWAYS AS (raw_vtex.order_summary(payload)) STORED;
