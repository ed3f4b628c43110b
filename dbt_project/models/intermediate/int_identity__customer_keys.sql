-- Identity resolution: records that share an identity key (userProfileId = CL userId, real
-- e-mail, document with its type, E.164 phone) are one customer, transitively: A-B through
-- an e-mail and B-C through a phone make A, B and C one customer.
--
-- Connected components of the bipartite record-key graph, found with a recursive CTE: from
-- every record, walk record -> key -> record ... and collect every node reached (UNION, not
-- UNION ALL, drops nodes already reached, so the walk stops once nothing new turns up).
-- Work is the sum of squared component sizes: fine because components are a handful of
-- records, which the hub-key guard below keeps true.
--
-- customer_key = md5(tenant_id || '|' || smallest record_id of the component): it changes
-- only when the component itself changes (two customers merge, or a record with a smaller
-- id joins), never because unrelated data moved.
with recursive records as (
    select * from {{ ref('int_identity__records') }}
    where {{ tenant_filter() }}
),

-- One row per (record, key). Masked Conversation Tracker aliases are already NULL in
-- email_normalized, so they never become keys.
record_keys as (
    select tenant_id, record_id, 'user_profile_id:' || user_profile_id as identity_key
    from records
    where user_profile_id is not null
    union
    select tenant_id, record_id, 'email:' || email_normalized
    from records
    where email_normalized is not null
    union
    select tenant_id, record_id, 'document:' || document_type || ':' || document_normalized
    from records
    where document_normalized is not null
    union
    select tenant_id, record_id, 'phone:' || phone_e164
    from records
    where phone_e164 is not null
),

-- A value shared by many records (a call-center e-mail, a placeholder phone or document) is
-- not a person: it would chain strangers into one giant customer, so it is not a key.
usable_keys as (
    select tenant_id, identity_key
    from record_keys
    group by tenant_id, identity_key
    having count(*) <= {{ var('identity_max_records_per_key') | int }}
),

linking_keys as (
    select record_keys.tenant_id, record_keys.record_id, record_keys.identity_key
    from record_keys
    inner join usable_keys
        on record_keys.tenant_id = usable_keys.tenant_id
        and record_keys.identity_key = usable_keys.identity_key
),

-- Both directions of every record-key edge, so that one equi-join walks the graph.
graph_edges as (
    select tenant_id, 'record' as from_type, record_id as from_node, 'key' as to_type, identity_key as to_node
    from linking_keys
    union all
    select tenant_id, 'key', identity_key, 'record', record_id
    from linking_keys
),

reachable (tenant_id, record_id, node_type, node) as (
    select tenant_id, record_id, 'record'::text, record_id
    from records
    union
    select reachable.tenant_id, reachable.record_id, graph_edges.to_type, graph_edges.to_node
    from reachable
    inner join graph_edges
        on reachable.tenant_id = graph_edges.tenant_id
        and reachable.node_type = graph_edges.from_type
        and reachable.node = graph_edges.from_node
),

components as (
    select
        tenant_id,
        record_id,
        -- collate "C": byte order, so the anchor does not depend on the database's locale.
        min(node collate "C") filter (where node_type = 'record') as anchor_record_id
    from reachable
    group by tenant_id, record_id
)

select
    tenant_id,
    record_id,
    md5(tenant_id || '|' || anchor_record_id) as customer_key
from components
