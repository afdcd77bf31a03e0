"""lookupdec's benchmark suite (pyperf), comparisons, CI performance gate, profiles and plots.

Commands (``python -m perf COMMAND --help`` for each)::

    python -m perf run -o results/run.json [--fast] [--impl reference|fast]
    python -m perf compare A.json B.json          # or: compare --impls results/run.json
    python -m perf gate [--fast]                  # or: gate --base base.json --head head.json
    python -m perf profile [--impl reference|fast]
    python -m perf plot results/run.json [more.json ...] -o results/plots/
    python -m perf table results/run.json         # fast vs reference per static size, markdown

See perf/README.md.
"""
