#!/bin/bash
# .buildkite/guard/guard-main.sh in the vLLM repository: guard's census of a commit of main against
# its first parent, run by the step of guard.yaml inside vLLM's per-commit CPU image on builds that
# are not pull requests (the image and the fetch as in guard-pr.sh, whose header says what they
# assume). Builds of other branches exit 0 at once. Exit 0 for a pass, a regression (1) or "not
# measurable" (6): all three are history. The results go up as an artifact; the history job
# (.github/workflows/guard-main.yml's record job, or the same commands on a trusted queue) appends
# them with guard record --skip-unmeasured (nothing for a commit that changed nothing under vllm/).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${GUARD_IMAGE_PYTHON:-/opt/venv/bin/python}
remote=${GUARD_VLLM_REMOTE:-https://github.com/vllm-project/vllm.git}
guard_repository=${GUARD_REPOSITORY:-https://github.com/OWNER/guard}
head=$BUILDKITE_COMMIT
work=$(mktemp -d)
cd "$work"

if [ "${BUILDKITE_PULL_REQUEST:-false}" != false ] || [ "${BUILDKITE_BRANCH:-}" != main ]; then
  echo "not a build of main: nothing to record"
  exit 0
fi
[[ ${GUARD_SHA:-} =~ ^[0-9a-f]{40}$ ]] || { echo "GUARD_SHA must be one full guard commit id" >&2; exit 2; }

# The commit and its parents, whole (the image has no .git): base is the first parent.
git init -q vllm
git -C vllm fetch -q --no-tags --depth=2 "$remote" "$head"
base=$(git -C vllm rev-parse "$head^1")

uv pip install --python "$python" --require-hashes --no-deps -r "$here/guard-requirements.txt"
uv pip install --python "$python" --no-deps --build-constraints "$here/guard-build-requirements.txt" \
  --require-build-hashes "guard @ git+${guard_repository}@${GUARD_SHA}"

set +e
"$(dirname "$python")/guard" pr --vllm-repo vllm --base "$base" --head "$head" --only ops --profile cpu \
  --head-python "$python" --stack-python "$python" --output guard-results
rc=$?
set -e
if [ -f guard-results/results.json ]; then buildkite-agent artifact upload guard-results/results.json; fi
if [ "$rc" -le 1 ] || [ "$rc" -eq 6 ]; then exit 0; fi
exit "$rc"
