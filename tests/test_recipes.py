"""Every command guard prints for a person, run where a person would paste it (issue #43).

A run is judged in one checkout ("the runner", as a CI job measures it), the poster renders its
comment and job summary in another (the default branch's checkout, the artifact downloaded to a
folder of its own), and each command found in the comment, the job summary and the terminal output
is then run, as printed, in a third checkout at another path with the artifact unpacked into
``guard-results/`` at its root, as the comment says. Each must do what its text says.

The runs are real `guard check` and `guard pr` records (tests/fixtures/runs, tests/fixtures/pr),
re-judged as the poster re-judges them. ``guard update-thresholds`` and ``cp`` run for real;
``guard check`` and ``guard pr`` would start the engine, so their command lines are parsed by
guard's own parser and the files and profile they name are loaded in that checkout (the engine
test ``test_the_local_budget_recipe_guard_prints_works_when_followed_exactly`` runs one for real).
"""

from __future__ import annotations

import html as htmllib
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from guard import cli
from guard.config.loading import load_thresholds
from guard.measure.fit import ttft_not_judged
from guard.judge.rejudge import rejudge
from guard.report.output import write_report
from guard.model.jsonfiles import load_results
from guard.report.terminal import render_terminal
from tests.conftest import REPO, engine_as_recorded, thresholds_for_recorded_runs

FIXTURES = REPO / "tests" / "fixtures"
BUDGETS = "thresholds/deepseek-ocr-2.yaml"


def checkout(root: Path, budgets: Path) -> Path:
    """A git work tree at ``root`` with the thresholds folder ``budgets`` holds."""
    root.mkdir(parents=True)
    shutil.copytree(budgets, root / "thresholds")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def shown(markdown: str) -> str:
    """The text a person sees of a comment on GitHub, to copy from."""
    import markdown_it

    rendered = markdown_it.MarkdownIt("commonmark").enable(["table"]).render(markdown)
    return htmllib.unescape(re.sub(r"<[^>]+>", "", rendered))


def commands(text: str) -> list[list[str]]:
    """The commands in ``text``: each notice's backticked steps in order, and each shell block line."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if re.match(rf"guard ({'|'.join(cli.COMMANDS)}) ", line):
            found.append([line])
        spans = [s for s in re.findall(r"`([^`]+)`", line) if s.startswith(("guard ", "cp "))]
        if spans:
            found.append(spans)
    return found


@dataclass
class Scenario:
    fixture: str
    edit: str | None = None  # how the repository's budgets differ from the shipped ones
    expect: frozenset[str] = frozenset()  # the commands it must print (kind(), below)


def kind(step: str) -> str:
    argv = shlex.split(step)
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    return " ".join([*argv[:2], *(["--only", only] if only else [])]) if argv[0] == "guard" else argv[0]


def edited_budgets(tmp: Path, edit: str | None, fixture: str) -> Path:
    """The thresholds folder the repository holds in this scenario (the same in every checkout), with
    the workload the recorded run was measured under."""
    folder = thresholds_for_recorded_runs(tmp / "budgets")
    yml = folder / "deepseek-ocr-2.yaml"
    engine_as_recorded(yml, FIXTURES / fixture)
    if edit == "loose-ttft":  # a TTFT budget far above what the run measured, on any CPU: stale
        data = yaml.safe_load(yml.read_text())
        data["profiles"]["cpu"]["budgets"].pop("ttft_hardware")
        data["profiles"]["cpu"]["budgets"]["ttft_ms"] = {"p50": 100000}
        data["profiles"]["cpu"]["validity"]["max_other_cpu_pct"] = 100  # the recorded run shared its machine
        yml.write_text(yaml.safe_dump(data, sort_keys=False))
    if edit == "census-above":  # the committed census counts more than the run: ratchet it down
        census = folder / "deepseek-ocr-2.cpu.float32.census.json"
        data = json.loads(census.read_text())
        size = next(iter(data["census"]))
        fn = next(iter(data["census"][size]))
        op = next(iter(data["census"][size][fn]))
        data["census"][size][fn][op] += 5
        census.write_text(json.dumps(data, indent=2) + "\n")
    return folder


ACCEPT, CHECK = "guard update-thresholds", "guard check"
SCENARIOS = [
    Scenario("runs/cpu-float32-clean.json", None, frozenset({"cp", "guard update-thresholds --only ttft", ACCEPT, CHECK})),
    Scenario("runs/cpu-float32-clean.json", "loose-ttft", frozenset({"guard update-thresholds --only ttft", ACCEPT, CHECK})),
    Scenario("runs/cpu-float32-clean.json", "census-above", frozenset({"guard update-thresholds --only census", ACCEPT})),
    Scenario("runs/cpu-float32-server.json", None, frozenset({ACCEPT, CHECK})),
    Scenario("runs/cpu-bf16-ab-identical.json", None, frozenset({ACCEPT, CHECK})),
    Scenario("runs/cpu-float32-mutant-token-copies.json", None, frozenset({CHECK})),  # injected: nothing to accept
    Scenario("runs/cpu-bf16-busy.json", None, frozenset({CHECK})),  # invalid: nothing to accept
    Scenario("pr/mask-loop.results.json", None, frozenset({"guard pr --only ops"})),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{Path(s.fixture).stem}{'-' + s.edit if s.edit else ''}")
def test_every_printed_command_works_where_it_is_pasted(scenario, tmp_path, monkeypatch, capsys):
    budgets = edited_budgets(tmp_path, scenario.edit, scenario.fixture)
    # 1. the runner, as guard-cpu.yml lays it out: guard checked out into guard/ of a workspace that is
    #    no repository, run from the workspace, results in the workspace's guard-results/
    workspace = tmp_path / "runner" / "work"
    checkout(workspace / "guard", budgets)
    monkeypatch.chdir(workspace)
    stored = load_results(FIXTURES / scenario.fixture)
    judged = rejudge(stored, load_thresholds(f"guard/{BUDGETS}"), source=scenario.fixture)
    artifact = workspace / "guard-results"
    artifact.mkdir()
    write_report(judged, artifact, f"guard/{BUDGETS}")  # results.json and report.md, as guard check writes them
    terminal = render_terminal(judged)
    assert str(workspace) not in (artifact / "results.json").read_text()  # nothing recorded names the runner's folders

    # 2. the poster: the default branch's checkout, the artifact downloaded beside it
    poster = checkout(tmp_path / "poster" / "guard", budgets)
    download = tmp_path / "poster" / "artifacts" / "run-1"
    shutil.copytree(artifact, download / "guard-results")
    monkeypatch.chdir(poster)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    posted = ["--results", str(download / "guard-results" / "results.json"), "--trusted-thresholds", BUDGETS,
              "--check-pr-files", "on", "--sha", "a" * 40]
    assert cli.main(["comment", *posted, "--dry-run"]) == 0
    out = capsys.readouterr().out
    body = out.split(":\n", 1)[1].split("guard comment: dry run: would set the commit status")[0]  # the comment alone
    assert cli.main(["comment", *posted]) == 2  # no token: nothing posted, but the job summary is written first
    capsys.readouterr()

    sources = {"comment": shown(body), "poster's job summary": shown(summary.read_text()), "terminal": terminal,
               "measuring job's summary": shown((artifact / "report.md").read_text())}
    printed = [(where, steps) for where, text in sources.items() for steps in commands(text)]
    assert scenario.expect <= {kind(step) for _, steps in printed for step in steps}, (printed, sources)

    # 3. a person's checkout elsewhere, the artifact unpacked at its root: each command as printed
    for n, (where, steps) in enumerate(printed):
        person = checkout(tmp_path / "elsewhere" / f"clone-{n}", budgets)
        shutil.copytree(artifact, person / "guard-results")
        monkeypatch.chdir(person)
        for step in steps:
            assert str(workspace) not in step and str(tmp_path / "poster") not in step, (where, step)
            follow(step, person, where, judged, capsys)


def follow(step: str, person: Path, where: str, judged, capsys) -> None:
    argv = shlex.split(step)
    if argv[0] == "cp":
        assert len(argv) == 3
        subprocess.run(argv, cwd=person, check=True)
        assert (person / argv[2]).read_text() == (person / argv[1]).read_text()
        return
    assert argv[0] == "guard", step
    args = cli.build_parser().parse_args(argv[1:])  # every flag it carries is one guard knows
    assert args.profile and args.thresholds, f"{where}: {step} names no profile or thresholds file"
    if args.command == "update-thresholds":
        before = (person / args.thresholds).read_text()
        census = {p.name: p.read_text() for p in (person / args.thresholds).parent.glob("*.census.json")}
        code = cli.main(argv[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"{where}: `{step}` exited {code}: {err}{out}"
        after = (person / args.thresholds).read_text()
        if args.only == "census":  # "ratchet the baseline down"
            now = {p.name: p.read_text() for p in (person / args.thresholds).parent.glob("*.census.json")}
            assert now != census, f"{where}: `{step}` left the census baseline as it was: {out}"
        elif args.only == "ttft" and "local.yaml" in step:  # "a TTFT verdict on this machine"
            profile = load_thresholds(person / args.thresholds).profile(args.profile)
            assert ttft_not_judged(profile, judged.run.environment) is None, out
        elif args.only == "ttft":  # "to tighten it"
            old = yaml.safe_load(before)["profiles"][args.profile]["budgets"]["ttft_ms"]
            new = yaml.safe_load(after)["profiles"][args.profile]["budgets"]["ttft_ms"]
            assert all(new[k] < old[k] for k in old), out
        else:  # "re-baseline from this run's results and commit the diff"
            assert after != before and "wrote" in out or "no changes" in out, out
    else:  # guard check / guard pr start the engine: the files and profile they name are there
        assert args.command in ("check", "pr"), step
        profile = load_thresholds(person / args.thresholds).profile(args.profile)
        if args.only == "ops":
            assert profile.has_op_count_pass
        if args.command == "pr":
            assert judged.pr is not None and args.base == judged.pr.base.sha and args.head == judged.pr.head.sha


def test_an_older_record_of_the_runners_absolute_path_is_found_by_its_tail(tmp_path, monkeypatch, capsys):
    """Artifacts written before paths were recorded from the root name the runner's absolute path:
    the command still finds the file in this checkout, and says which one it used."""
    person = checkout(tmp_path / "laptop" / "guard", REPO / "thresholds")
    engine_as_recorded(person / "thresholds" / "deepseek-ocr-2.yaml", FIXTURES / "runs" / "cpu-float32-clean.json")
    (person / "guard-results").mkdir()
    data = json.loads((FIXTURES / "runs" / "cpu-float32-clean.json").read_text())
    data["run"]["thresholds_path"] = "/home/runner/_work/guard/guard/thresholds/deepseek-ocr-2.yaml"
    (person / "guard-results" / "results.json").write_text(json.dumps(data))
    monkeypatch.chdir(person)
    code = cli.main(["update-thresholds", "--from", "guard-results/results.json", "--profile", "cpu", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "another machine's path); using thresholds/deepseek-ocr-2.yaml" in out


def test_a_recorded_file_that_is_nowhere_here_is_a_clear_error(tmp_path, monkeypatch, capsys):
    person = tmp_path / "laptop"
    person.mkdir()
    data = json.loads((FIXTURES / "runs" / "cpu-float32-clean.json").read_text())
    data["run"]["thresholds_path"] = "budgets/gone.yaml"
    (person / "results.json").write_text(json.dumps(data))
    monkeypatch.chdir(person)
    assert cli.main(["update-thresholds", "--from", "results.json"]) == 2
    err = capsys.readouterr().err
    assert "budgets/gone.yaml: (file): no such thresholds file (recorded in results.json" in err
    assert "hint: run this at the root of the repository the budgets live in, or pass --thresholds PATH" in err
