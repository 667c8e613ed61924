"""guard bisect's search, pure over a probe (no engine): the culprit in <= ceil(log2 n) probes when
no commit is skipped, skipped commits probed around, a compiled-only commit never blamed, a range
when a skipped commit with Python could be the culprit, and no culprit when bad is not bad.
tests/test_e2e_bisect.py runs the command on the real engine."""

from __future__ import annotations

import math

import pytest

from guard.revisions.bisect import Commit, State, Step, culprits, search


def line(n: int, compiled: set[int] = frozenset(), compiled_only: set[int] = frozenset()) -> list[Commit]:
    return [Commit(sha=f"{i:040x}", subject=f"c{i}", author_date="2026-12-01T00:00:00+00:00",
                   unmeasurable=("csrc/x.cu",) if i in compiled | compiled_only else (),
                   python_changed=i not in compiled_only) for i in range(n)]


def prober(commits: list[Commit], first_bad: int, unimportable: set[int] = frozenset()):
    probed: list[int] = []

    def probe(i: int) -> Step:
        probed.append(i)
        c = commits[i]
        if c.unmeasurable or i in unimportable:
            return Step(i, c, State.SKIP, "cannot be measured", measured=False)
        return Step(i, c, State.BAD if i >= first_bad else State.GOOD, "")
    return probe, probed


@pytest.mark.parametrize("n", [1, 2, 3, 16, 17, 33])
def test_every_culprit_is_found_within_log2_n_probes_plus_one(n: int) -> None:
    for first_bad in range(n):
        commits = line(n)
        probe, probed = prober(commits, first_bad)
        steps, lo, hi = search(commits, probe)
        assert culprits(commits, steps, lo, hi) == (commits[first_bad],)
        assert len(probed) <= math.ceil(math.log2(n)) + 1, (first_bad, probed)
        assert len(probed) == len(set(probed))  # each commit measured once: the census needs no repeats
        if first_bad < n - 1:
            assert len(probed) <= max(1, math.ceil(math.log2(n)))


def test_a_skipped_commit_is_probed_around_and_a_compiled_only_one_never_blamed() -> None:
    commits = line(16, compiled_only={7})
    probe, probed = prober(commits, first_bad=8)
    steps, lo, hi = search(commits, probe)
    assert probed[0] == 7 and steps[0].state == State.SKIP  # the middle first: skipped, a neighbour next
    assert culprits(commits, steps, lo, hi) == (commits[8],)  # 7 has its parent's Python: not a suspect


def test_a_skipped_commit_with_python_beside_the_boundary_leaves_a_range() -> None:
    commits = line(16)
    probe, probed = prober(commits, first_bad=8, unimportable={7})
    steps, lo, hi = search(commits, probe)
    assert culprits(commits, steps, lo, hi) == (commits[7], commits[8])


def test_bad_that_does_not_differ_names_no_culprit() -> None:
    commits = line(8)
    probe, probed = prober(commits, first_bad=99)
    steps, lo, hi = search(commits, probe)
    assert hi == -1 and culprits(commits, steps, lo, hi) == ()
    assert probed[-1] == 7  # bad itself was measured to confirm
