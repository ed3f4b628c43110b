{#-
    The names dbt gives a relation's replacement while it builds it (`<name>__dbt_tmp`) and the
    old relation while it swaps them (`<name>__dbt_backup`, dropped after the commit), made
    unique per dbt command. Two commands replacing one view at once (two tenants' refreshes, an
    analyst's prod build beside the platform's) both created `<name>__dbt_tmp`, and the second
    renamed the view onto a backup name the first had not dropped yet. With names of their own,
    the second's swap waits for the first's lock on the view, then replaces the first's view.
    A command killed between its commit and the backup's drop leaves that backup behind.
-#}
{% macro postgres__make_intermediate_relation(base_relation, suffix) %}
    {{ return(postgres__make_relation_with_suffix(base_relation, command_suffix(suffix), dstring=False)) }}
{% endmacro %}


{% macro postgres__make_backup_relation(base_relation, backup_relation_type, suffix) %}
    {%- set backup_relation = postgres__make_relation_with_suffix(base_relation, command_suffix(suffix), dstring=False) -%}
    {{ return(backup_relation.incorporate(type=backup_relation_type)) }}
{% endmacro %}


{% macro command_suffix(suffix) %}
    {{ return(suffix ~ '_' ~ invocation_id[:8]) }}
{% endmacro %}
