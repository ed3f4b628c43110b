-- Identity resolution: records that share an identity key (userProfileId = CL userId, real
-- e-mail, document with its type, E.164 phone) are one customer, transitively: A-B through
-- an e-mail and B-C through a phone make A, B and C one customer.
--
-- Connected components, by minimum-label propagation over the links between records (two
-- records sharing a key). A first round, plain SQL, gives each record the smallest id among
-- itself and the records linked to it: that settles nearly every customer (all of them on the
-- seed benchmark's data). Where linked records still disagree, a recursive CTE goes on from
-- them: each round, the records linked to those whose label changed take the smallest label
-- among them, until the component's smallest id has reached all of it. The work follows the
-- number of links, not the squared component sizes of walking every path from every record.
-- Records and key values are numbered first, so the joins, sorts and aggregates of the walk
-- handle integers, not text ids under the database's collation.
--
-- customer_key = md5(tenant_id || '|' || smallest record_id of the component): it changes
-- only when the component itself changes (two customers merge, or a record with a smaller
-- id joins), never because unrelated data moved.
--
-- Incremental: a run resolves again only the customers a changed record can touch (the
-- pre-hook identity_resolution_scope finds them; see there). The other customers keep their
-- rows. A change to var identity_max_records_per_key takes a --full-refresh. The post-hook
-- deletes the rows of records that are gone.
{{ config(
    pre_hook="{{ identity_resolution_scope() }}",
    post_hook=[
        "{{ delete_rows_gone(ref('int_identity__records'), 'record_id') }}",
        "{{ key_index(['tenant_id', 'record_id'], unique=true) }}",
    ],
) }}
-- Records numbered in byte order of their ids (collate "C", so the order does not depend on
-- the database's locale): the smallest number of a component is its smallest id. Numbers are
-- unique across tenants, and key values are numbered per tenant, so no link crosses tenants.
with recursive numbered_records as (
    select
        records.tenant_id,
        records.record_id,
        {{ identity_key_columns('records') }},
        row_number() over (
            order by records.tenant_id collate "C", records.record_id collate "C"
        ) as record_number
    from {{ ref('int_identity__records') }} as records
    {% if is_incremental() %}
    inner join identity_resolution_scope as scope
        on records.tenant_id = scope.tenant_id
        and records.record_id = scope.record_id
    {% endif %}
    where {{ tenant_filter('records.tenant_id') }}
),

-- One row per (record, key). Masked Conversation Tracker aliases are already NULL in
-- email_normalized, so they never become keys. UNION ALL: a record is one row and each kind
-- of key has its own prefix, so no row can repeat.
record_keys as (
    {{ identity_keys('numbered_records', 'record_number') }}
),

-- A value shared by many records (a call-center e-mail, a placeholder phone or document) is
-- not a person: it would chain strangers into one giant customer, so it is not a key. A
-- value only one record has links nothing: left out, the joins below have less to do.
-- Records are counted over the whole tenant, not only those being resolved.
linking_key_values as (
    {% if is_incremental() %}
    select tenant_id, identity_key, row_number() over () as key_number
    from identity_key_counts
    where records between 2 and {{ var('identity_max_records_per_key') | int }}
    {% else %}
        select
            tenant_id,
            identity_key,
            row_number() over () as key_number
        from record_keys
        group by tenant_id, identity_key
        having count(*) between 2 and {{ var('identity_max_records_per_key') | int }}
    {% endif %}
),

linking_keys as (
    select
        record_keys.record_number,
        linking_key_values.key_number
    from record_keys
    inner join linking_key_values
        on record_keys.tenant_id = linking_key_values.tenant_id
        and record_keys.identity_key = linking_key_values.identity_key
),

-- Records linked by a shared key, both ways, once per pair however many keys they share.
-- Materialized: read three times, and by the recursive step every round.
record_links as materialized (
    select distinct
        linking_keys.record_number as from_record,
        linked.record_number as to_record
    from linking_keys
    inner join linking_keys as linked
        on linking_keys.key_number = linked.key_number
        and linking_keys.record_number <> linked.record_number
),

-- One round without recursion settles most customers: each record takes the smallest number
-- among itself and the records linked to it.
first_labels as (
    select
        numbered_records.record_number,
        least(numbered_records.record_number, min(record_links.to_record)) as label
    from numbered_records
    left join record_links on numbered_records.record_number = record_links.from_record
    group by numbered_records.record_number
),

-- Linked records that still disagree: only their components need more rounds. Where all the
-- records of a component agree, they hold its smallest number (the smallest keeps its own).
unsettled as (
    select distinct
        from_labels.record_number,
        from_labels.label
    from record_links
    inner join first_labels as from_labels on record_links.from_record = from_labels.record_number
    inner join first_labels as to_labels on record_links.to_record = to_labels.record_number
    where from_labels.label <> to_labels.label
),

-- (record, label): from the unsettled records, each label a record was offered as the
-- smallest of its changed linked records' in some round; UNION drops pairs seen before,
-- which ends the walk.
labels (record_number, label) as (
    select
        record_number,
        label
    from unsettled
    union
    select distinct
        record_links.to_record,
        min(labels.label) over (partition by record_links.to_record)
    from labels
    inner join record_links on labels.record_number = record_links.from_record
),

components as (
    select
        record_number,
        min(label) as anchor_record_number
    from (
        select
            record_number,
            label
        from first_labels
        union all
        select
            record_number,
            label
        from labels
    ) as offered_labels
    group by record_number
)

select
    numbered_records.tenant_id,
    numbered_records.record_id,
    md5(numbered_records.tenant_id || '|' || anchors.record_id) as customer_key,
    {{ identity_key_columns('numbered_records') }},
    -- When this run resolved the record: int_customers__profiles rebuilds its customer's profile.
    now() as built_at
from components
inner join numbered_records on components.record_number = numbered_records.record_number
inner join numbered_records as anchors on components.anchor_record_number = anchors.record_number
