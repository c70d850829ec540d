#!/usr/bin/env bash
# The demo (the README's `make demo`: vlgrpo demo with its defaults) on seeds 0-4, one after the other, then the seed
# table with issue #16's targets in docs/demo-seeds.md. 45-80 minutes on 2 CPU cores; nothing else should run
# beside it (wall_seconds is one of the figures).
#   dev/demo_seeds.sh                 # seeds 0-4 into runs/demo-seeds/seed<S>, table into docs/demo-seeds.md
#   SEEDS="0 1" dev/demo_seeds.sh     # a subset (the table covers the seeds found under runs/demo-seeds)
# The doc's hand-written notes, from its NOTES_MARK line (dev/seeds_table.py) on, are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ROOT=${ROOT:-runs/demo-seeds}
for seed in ${SEEDS:-0 1 2 3 4}; do
  echo "== seed $seed"
  "$PY" -m vlgrpo.cli demo --seed "$seed" --out "$ROOT/seed$seed" "$@"
done
"$PY" -c "import sys; sys.path.insert(0, 'dev'); from seeds_table import write_seeds_doc; print(write_seeds_doc(sys.argv[1], sys.argv[2]))" \
  "$ROOT" "${DOC:-docs/demo-seeds.md}"
