"""What the user sets and what each stage reads of it.

schema.py   the typed config: a frozen class per section, Config (a resolved preset), a view per
            stage; params.yaml's JSON Schema generated from them
params.py   params.yaml loaded strictly (a key twice, a YAML error: file:line:column), presets
            resolved, validated with remedies, `--config set=` overrides applied
stages.py   which config sections (its view) and source files each workflow stage reads
cli.py      every stage's command line: arguments, config, logging, one-line errors
"""
