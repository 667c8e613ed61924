#!/bin/bash
# .buildkite/guard/guard-pr.sh in the vLLM repository: guard pr --only ops of a pull request, run by
# the step of guard.yaml (.buildkite/test_areas/guard.yaml) inside vLLM's per-commit CPU image.
#
# What it assumes of that image (docker/Dockerfile.cpu, target vllm-test):
# - /opt/venv holds this commit's vLLM wheel, its torch and triton-cpu; Python 3.12 (PYTHON_VERSION's
#   default; guard needs 3.11 or 3.12); uv and git are on PATH.
# - /vllm-workspace has tests/, .buildkite/ and a few other folders copied in, but no vllm/ and no
#   .git. The agent's checkout that the docker plugin may mount at /workdir is not relied on either
#   (the generator's commands run in /vllm-workspace/tests). So the script fetches the two commits it
#   needs from GitHub itself, anonymously: vllm-project/vllm serves any commit reachable from its refs
#   by id, a fork's pull request head included (refs/pull/N/head).
# - the job may reach github.com and PyPI (guard and its hashed dependencies are downloaded).
# - buildkite-agent is mounted (the step's mount_buildkite_agent): it uploads the artifacts and the
#   poster's trigger, which the generator's step schema cannot express.
#
# The two sides: head is this commit as the image installed it (--head-python /opt/venv/bin/python:
# its own Python and compiled code); base is the merge base of head and the base branch, its vllm/
# laid over the image's compiled files (--stack-python, the overlay). report.md's side lines say so.
# No GitHub token is used or needed here.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${GUARD_IMAGE_PYTHON:-/opt/venv/bin/python}  # the image's venv; the variables let tests stub it
remote=${GUARD_VLLM_REMOTE:-https://github.com/vllm-project/vllm.git}
guard_repository=${GUARD_REPOSITORY:-https://github.com/OWNER/guard}
head=$BUILDKITE_COMMIT
work=$(mktemp -d)
cd "$work"

if [ "${BUILDKITE_PULL_REQUEST:-false}" = false ]; then
  echo "not a pull request build: nothing to judge"
  exit 0
fi
# After whatever happens below: the results (if any) as artifacts, then the poster's trigger, so a
# regression, a broken run or a failed setup all get their status. The trigger carries nothing: the
# poster reads this build from Buildkite's API (its triggered_from) and checks it against GitHub.
post() {
  local rc=$?
  mkdir -p guard-pr
  printf '%s\n' "$BUILDKITE_PULL_REQUEST" > guard-pr/pr_number.txt
  printf '%s\n' "$head" > guard-pr/head_sha.txt
  local found=(guard-pr/pr_number.txt guard-pr/head_sha.txt)
  # --model auto: each model's folder (results.json, report.md, or not-run.txt), and the summary
  for f in guard-results/matrix.md guard-results/*/results.json guard-results/*/report.md guard-results/*/not-run.txt; do
    [ -f "$f" ] && found+=("$f")
  done
  buildkite-agent artifact upload "$(IFS=';'; echo "${found[*]}")" || echo "the artifacts were not uploaded" >&2
  buildkite-agent pipeline upload --no-interpolation <<EOF || echo "the poster's trigger was not uploaded" >&2
steps:
  - label: ":speech_balloon: guard status"
    trigger: vllm-guard-post
    async: true
EOF
  exit "$rc"
}
trap post EXIT
[[ ${GUARD_SHA:-} =~ ^[0-9a-f]{40}$ ]] || { echo "GUARD_SHA must be one full guard commit id" >&2; exit 2; }

# Base: the branch point, not the base branch's tip, so commits that reached main after it are on
# both sides and never blamed on the pull request (Buildkite builds the pull request's head, not
# GitHub's merge ref). Found in a commits-only fetch of both histories (--filter=tree:0: no trees or
# files), then both commits are fetched whole, one deep, into the repository guard pr reads. It has
# no tags, so the report labels the sides by commit, not by `git describe`.
git init -q history
git -C history fetch -q --no-tags --filter=tree:0 "$remote" \
  "$head" "+refs/heads/${BUILDKITE_PULL_REQUEST_BASE_BRANCH:-main}:refs/remotes/origin/base"
base=$(git -C history merge-base "$head" refs/remotes/origin/base)
git init -q vllm
git -C vllm fetch -q --no-tags --depth=1 "$remote" "$base" "$head"

# guard into the image's /opt/venv without touching its vLLM or torch: --no-deps throughout, its
# dependencies from guard's lock with hashes (less what the engine stack installs: the image's stay),
# and guard itself from its commit, built by the hashed build backend.
uv pip install --python "$python" --require-hashes --no-deps -r "$here/guard-requirements.txt"
uv pip install --python "$python" --no-deps --build-constraints "$here/guard-build-requirements.txt" \
  --require-build-hashes "guard @ git+${guard_repository}@${GUARD_SHA}"

set +e
"$(dirname "$python")/guard" pr --vllm-repo vllm --base "$base" --head "$head" --only ops --profile cpu --model auto \
  --head-python "$python" --stack-python "$python" --output guard-results
rc=$?
set -e
[ "$rc" -eq 6 ] && rc=0  # not measurable here (compiled code, dependencies): a result the status states
exit "$rc"
