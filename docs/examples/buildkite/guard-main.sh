#!/bin/bash
# .buildkite/guard/guard-main.sh: guard pr --only ops of a commit of main against its first parent,
# inside the per-commit CPU image; exit 0 for a pass, a regression (1) or "not measurable" (6):
# all three are history. guard record --skip-unmeasured then records it (or nothing, for a commit
# that changed nothing under vllm/).
set -euo pipefail
cd /workdir
git config --global --add safe.directory /workdir
git fetch --quiet --no-tags --depth=2 origin "$BUILDKITE_COMMIT"
uv pip install --python /opt/venv/bin/python --no-deps "guard @ git+https://github.com/OWNER/guard@${GUARD_SHA}"
uv pip install --python /opt/venv/bin/python "pyyaml>=6" "jsonschema>=4.18" "github3.py>=4.0.1" "pytest-benchmark>=5.1" "ruptures>=1.1.10" "matplotlib>=3.9"
set +e
/opt/venv/bin/guard pr --vllm-repo /workdir --base "$BUILDKITE_COMMIT^1" --head "$BUILDKITE_COMMIT" --only ops --profile cpu --output guard-results
rc=$?
set -e
if [ "$rc" -le 1 ] || [ "$rc" -eq 6 ]; then exit 0; fi
exit "$rc"
