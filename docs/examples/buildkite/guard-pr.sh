#!/bin/bash
# .buildkite/guard/guard-pr.sh in the vLLM repository: guard pr --only ops inside the per-commit
# CPU image (called by guard-pr.yml). Base: the merge base of this commit and the base branch, so
# commits that reached main after the branch point are on both sides and never blamed on the PR
# (Buildkite builds the PR head, not GitHub's merge ref).
set -euo pipefail
cd /workdir
git config --global --add safe.directory /workdir
git fetch --quiet --no-tags origin "+refs/heads/${BUILDKITE_PULL_REQUEST_BASE_BRANCH:-main}:refs/remotes/origin/guard-base"
base=$(git merge-base HEAD refs/remotes/origin/guard-base)
uv pip install --python /opt/venv/bin/python --no-deps "guard @ git+https://github.com/OWNER/guard@${GUARD_SHA}"
uv pip install --python /opt/venv/bin/python "pyyaml>=6" "jsonschema>=4.18" "github3.py>=4.0.1" "pytest-benchmark>=5.1" "ruptures>=1.1.10" "matplotlib>=3.9"
mkdir -p guard-pr
printf '%s\n' "$BUILDKITE_PULL_REQUEST" > guard-pr/pr_number.txt
printf '%s\n' "$BUILDKITE_COMMIT" > guard-pr/head_sha.txt
set +e
/opt/venv/bin/guard pr --vllm-repo /workdir --base "$base" --head "$BUILDKITE_COMMIT" --only ops --profile cpu --output guard-results
rc=$?
set -e
[ "$rc" -eq 6 ] && rc=0  # not measurable here: a result the status states
exit "$rc"
