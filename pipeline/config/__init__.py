"""What the user sets and what each stage reads of it.

    params.py, params.schema.yaml  params.yaml loaded, presets resolved, validated with remedies
    stages.py                      which config sections and source files each workflow stage reads
    cli.py                         every stage's command line: arguments, config, logging, one-line errors
"""
