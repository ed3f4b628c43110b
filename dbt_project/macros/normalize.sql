{#-
    Normalization of identity keys. Each macro renders one SQL expression over `col`
    (a column or any expression), NULL when nothing usable is left.
-#}

{#-
    E-mail: trim (any whitespace, tabs and Unicode spaces too) and lower-case. VTEX Conversation Tracker replaces the buyer's address on
    orders with an alias:
    - hard mask `<32 hex>@ct.vtex.com.br`: the real address cannot be recovered -> NULL
      (a masked alias is never an identity key: it would link nobody or, worse, strangers);
    - soft mask `real@x.com-<hex>b.ct.vtex.com.br`: the suffix is stripped with a regex
      anchored at the end to recover `real@x.com`. Splitting on '-' instead would cut
      addresses such as `ana-maria@my-shop.com.br`. What still ends in ct.vtex.com.br after
      that (an alias masked twice) is an alias too -> NULL, as the activation step has it.
    Anything that is not shaped like local@domain.tld afterwards is NULL.
-#}
{% macro normalize_email(col) -%}
    {%- set space = whitespace_chars() -%}
    (
        select
            case
                when stripped ~ '[@.]ct\.vtex\.com\.br$' then null
                when stripped ~ '^[^@{{ space }}]+@[^@{{ space }}]+\.[^@{{ space }}]+$' then stripped
            end
        from (
            select regexp_replace(
                regexp_replace(lower({{ col }}), '^[{{ space }}]+|[{{ space }}]+$', '', 'g'),
                '-[0-9a-f]+b\.ct\.vtex\.com\.br$', ''
            ) as stripped
            {{ computed_once() }}
        ) as email
    )
{%- endmacro %}


{#-
    Ends a subquery that computes a regular expression's result the expression around it
    reads more than once. Without it the planner folds the subquery into that expression, one
    copy per reference, and runs the regular expression that often (a phone's digits five
    times). A subquery with OFFSET 0 is left as it is; the levels above it, plain string
    functions, may be folded. (LIMIT ALL is no limit: it is there for SQL linters, which
    read an OFFSET only after a LIMIT.)
-#}
{% macro computed_once() -%}
    limit all offset 0
{%- endmacro %}


{#-
    Whitespace as the activation step (Python's str.split) knows it, for bracket expressions:
    POSIX [:space:] alone misses the no-break and other Unicode spaces a copy-pasted address
    or name often carries ("ana@x.com" + U+00A0 would be another identity key, and its hash
    would match nobody).
-#}
{% macro whitespace_chars() -%}
    [:space:]\u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000
{%- endmacro %}


{#- Document (CPF/CNPJ...): digits only; empty or all zeros (a placeholder) is NULL. -#}
{% macro normalize_document(col) -%}
    (
        select case when digits !~ '^0*$' then digits end
        from (select regexp_replace({{ col }}, '[^0-9]', '', 'g') as digits {{ computed_once() }}) as document
    )
{%- endmacro %}


{#-
    Phone to E.164, best effort for Brazil, where numbers are 10 (landline) or 11 (mobile)
    digits with the area code:
      '+55 21 95127-2727', '(21) 95127-2727', '21951272727', '5521951272727',
      '0055 21 95127-2727', '021 95127-2727'  ->  '+5521951272727'
    A number typed with '+' or '00' is taken as international. Otherwise trunk zeros are
    dropped; a number that then starts with the default country code and has 10-11 more
    digits already carries it; a 10-11 digit number gets it prepended. Anything else, or a
    result outside E.164 (8-15 digits after '+'), is NULL.
    This is deliberately simple: the activation step re-normalizes with the `phonenumbers`
    library (per-country lengths and validity) before sending anything to an ad platform.
    `default_country_calling_code` is a SQL expression giving digits, e.g. '55' or a column.
-#}
{% macro normalize_phone_e164(col, default_country_calling_code="'55'") -%}
    (
        select case when candidate ~ '^\+[1-9][0-9]{7,14}$' then candidate end
        from (
            select
                case
                    when ltrim({{ col }}) like '+%' then '+' || digits
                    when digits like '00%' then '+' || substr(digits, 3)
                    when left(national, length(cc)) = cc and length(national) - length(cc) between 10 and 11
                        then '+' || national
                    when length(national) between 10 and 11 then '+' || cc || national
                end as candidate
            from (
                select digits, ltrim(digits, '0') as national, ({{ default_country_calling_code }}) as cc
                from (select regexp_replace({{ col }}, '[^0-9]', '', 'g') as digits {{ computed_once() }}) as typed
            ) as parts
        ) as phone
    )
{%- endmacro %}


{#-
    ITU calling code (digits) of an ISO 3166-1 alpha-2 country, for the stores' markets;
    NULL for others (their national numbers then stay NULL unless typed with '+').
-#}
{% macro country_calling_code(country_col) -%}
    case upper({{ country_col }})
        when 'BR' then '55' when 'AR' then '54' when 'CL' then '56' when 'CO' then '57'
        when 'MX' then '52' when 'PE' then '51' when 'UY' then '598' when 'PY' then '595'
        when 'BO' then '591' when 'EC' then '593' when 'VE' then '58' when 'CR' then '506'
        when 'PA' then '507' when 'GT' then '502' when 'DO' then '1' when 'US' then '1'
        when 'CA' then '1' when 'PT' then '351' when 'ES' then '34' when 'IT' then '39'
        when 'FR' then '33' when 'DE' then '49' when 'GB' then '44'
    end
{%- endmacro %}


{#-
    A first or last name as ad platforms want it before hashing: lower-case, punctuation
    removed, accents kept (Meta and Google both accept UTF-8 names; transliterating would
    change the hash), whitespace trimmed and collapsed. [[:punct:]] and lower() follow the
    database's ctype: with a UTF-8 ctype (C.UTF-8, pt_BR.UTF-8) they cover non-ASCII text.
-#}
{% macro normalize_name(col) -%}
    {#- Collapse, then trim: trim() alone only strips spaces, so a tab or newline at either
        end would stay as a space (" ana", not "ana") and change the hash. -#}
    nullif(
        trim(regexp_replace(
            regexp_replace(lower({{ col }}), '[[:punct:]]', '', 'g'), '[{{ whitespace_chars() }}]+', ' ', 'g'
        )),
        ''
    )
{%- endmacro %}


{#- Lower-case hex SHA-256 of the UTF-8 bytes of an expression (NULL stays NULL). -#}
{% macro sha256_hex(col) -%}
    encode(sha256(convert_to({{ col }}, 'UTF8')), 'hex')
{%- endmacro %}
