-- Identity resolution: records that share an identity key (userProfileId = CL userId, real
-- e-mail, document with its type, E.164 phone) are one customer, transitively: A-B through
-- an e-mail and B-C through a phone make A, B and C one customer.
--
-- Connected components of the bipartite record-key graph, by minimum-label propagation in a
-- recursive CTE: every record starts labelled with its own id; each round, the nodes next
-- to those whose label changed in the previous round take the smallest label among them.
-- The smallest record id of a component reaches every node of it in as many rounds as the
-- component is wide. A node only gets the smallest label of its changed neighbours in a
-- round (one or two over the whole walk in practice), so the work follows the number of
-- edges, not the squared component sizes of walking every path from every record.
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

-- Both directions of every record-key edge. Record ids ('cl:', 'profile:', 'order:') and
-- keys ('email:', 'phone:', ...) never share a prefix, so one text column holds both.
graph_edges as (
    select tenant_id, record_id as from_node, identity_key as to_node
    from linking_keys
    union all
    select tenant_id, identity_key, record_id
    from linking_keys
),

-- (node, label): each label a node was offered as the smallest of its changed neighbours'
-- in some round; UNION drops pairs seen before, which ends the walk. collate "C": byte
-- order, so the smallest id does not depend on the database's locale.
labels (tenant_id, node, label) as (
    select tenant_id, record_id, record_id collate "C"
    from records
    union
    select distinct
        graph_edges.tenant_id,
        graph_edges.to_node,
        min(labels.label) over (partition by graph_edges.tenant_id, graph_edges.to_node)
    from labels
    inner join graph_edges
        on labels.tenant_id = graph_edges.tenant_id
        and labels.node = graph_edges.from_node
),

components as (
    select
        records.tenant_id,
        records.record_id,
        min(labels.label) as anchor_record_id
    from records
    inner join labels
        on records.tenant_id = labels.tenant_id
        and records.record_id = labels.node
    group by records.tenant_id, records.record_id
)

select
    tenant_id,
    record_id,
    md5(tenant_id || '|' || anchor_record_id) as customer_key
from components
