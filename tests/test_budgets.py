"""The thresholds YAML: the shipped file loads, and every bad input names file, line and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from guard.config.budgets import RequestMix, resolve_model
from guard.config.loading import load_thresholds
from guard.errors import ConfigError, ExitCode
from guard.model.environment import has_amx
from guard.measure.fit import engine_on_cpu, on_cpu, ttft_binding_fits
from tests.conftest import SHIPPED_THRESHOLDS, run_guard

GOOD = """\
schema_version: 1
model: m
profiles:
  cpu:
    match: {cuda: false}
    engine:
      model: guard:tiny-deepseek-ocr2
      max_model_len: 2048
    workload:
      requests: 3
      image_sizes: [[640, 480]]
      prompt: "<image>\\nFree OCR."
    budgets:
      ttft_ms: {p50: 9000, p99: 10000}
      ops:
        mask_path:
          scope: {file: vllm/model_executor/models/deepencoder2.py, function: _update_causal_mask}
          ops:
            aten::_index_put_impl_: {max: 0}
          total_ops: {exact: 2}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "budget.yaml"
    p.write_text(text)
    return p


def test_shipped_thresholds_load_with_both_profiles() -> None:
    t = load_thresholds(SHIPPED_THRESHOLDS)
    assert set(t.profiles) == {"a10", "cpu"}
    a10, cpu = t.profiles["a10"], t.profiles["cpu"]
    assert a10.engine.model == "deepseek-ai/DeepSeek-OCR-2" and a10.workload.requests == 100
    assert a10.workload.concurrency == 10 and a10.workload.max_tokens == 1
    assert a10.match.cuda and not cpu.match.cuda
    assert cpu.engine.load_format == "dummy" and cpu.workload.concurrency == 1
    # the CPU engine keeps freed memory (docs/ab.md); the A10's host side is left as vLLM runs it
    assert cpu.engine.retain_freed_memory and not a10.engine.retain_freed_memory
    # the CPU skips vLLM's memory-sizing pass (its KV cache is fixed); the A10 needs it to size its cache
    assert cpu.engine.skip_mm_profiling and not a10.engine.skip_mm_profiling
    for p in (a10, cpu):
        mask = {sb.name: sb for sb in p.ops}["mask_path"]
        assert mask.ops["aten::_index_put_impl_"].count == 0
        assert mask.total_ops is not None
    assert {"cuda::memcpy_htod", "cuda::sync"} <= set({sb.name: sb for sb in a10.ops}["mask_path"].ops)
    assert Path(resolve_model(cpu.engine.model), "config.json").is_file()


def test_good_file_gives_typed_records(tmp_path: Path) -> None:
    t = load_thresholds(write(tmp_path, GOOD))
    p = t.profile("cpu")
    assert p.ttft_ms == {"p50": 9000.0, "p99": 10000.0}
    assert p.workload.image_sizes == ((640, 480),) and p.workload.profile_image_sizes == ((640, 480),)
    assert p.workload.warmup_requests == 1 and p.engine.enable_prefix_caching is False
    assert p.ops[0].total_ops.rule == "exact" and p.ops[0].total_ops.fails(3) and not p.ops[0].total_ops.fails(2)


def test_ttft_hardware_and_validity_records(tmp_path: Path) -> None:
    p = load_thresholds(write(tmp_path, GOOD)).profile("cpu")
    assert p.ttft_hardware is None and p.validity.max_other_cpu_pct == 5.0  # defaults: unbound, 5 %
    assert p.validity.max_slowdown_pct == 10.0
    text = GOOD.replace("  cpu:", "  cpu:\n    validity: {max_other_cpu_pct: 25, max_slowdown_pct: 12.5}").replace(
        "      ttft_ms: {p50: 9000, p99: 10000}",
        "      ttft_ms: {p50: 9000, p99: 10000}\n      ttft_hardware: {cpu_model_regex: '^AMD EPYC', cpu_count: [2, 4]}")
    p = load_thresholds(write(tmp_path, text)).profile("cpu")
    assert p.validity.max_other_cpu_pct == 25.0 and p.validity.max_slowdown_pct == 12.5
    hw = p.ttft_hardware
    assert hw.cpu_model_regex == "^AMD EPYC" and hw.cpu_count == (2, 4) and hw.line == 16
    assert hw.speed_reference_ms is None  # not measured: the speed gate has nothing to compare with
    sped = load_thresholds(write(tmp_path, text.replace("cpu_count: [2, 4]}", "cpu_count: [2, 4], speed_reference_ms: 79.5}")))
    assert sped.profile("cpu").ttft_hardware.speed_reference_ms == 79.5
    assert ttft_binding_fits(hw, "AMD EPYC 7B13", 2, None) and ttft_binding_fits(hw, "AMD EPYC", 4, ("avx2",))  # no cpu_isa: any extensions
    assert not ttft_binding_fits(hw, "AMD EPYC", 8, None) and not ttft_binding_fits(hw, "Intel(R) Xeon(R) Platinum 8375C", 2, None)
    assert hw.describe() == "a CPU matching /^AMD EPYC/ with 2-4 cores"
    exact = load_thresholds(write(tmp_path, text.replace("cpu_count: [2, 4]", "cpu_count: 2"))).profile("cpu")
    assert exact.ttft_hardware.cpu_count == (2, 2) and exact.ttft_hardware.describe().endswith("with 2 cores")
    isa = load_thresholds(write(tmp_path, text.replace("cpu_count: [2, 4]", "cpu_isa: [avx512_bf16, avx2, avx512f]")))
    bound = isa.profile("cpu").ttft_hardware
    assert bound.cpu_isa == ("avx2", "avx512f", "avx512_bf16")  # order as written does not matter
    assert ttft_binding_fits(bound, "AMD EPYC", 2, ("avx2", "avx512f", "avx512_bf16")) and not ttft_binding_fits(bound, "AMD EPYC", 2, ("avx2",))
    assert not ttft_binding_fits(bound, "AMD EPYC", 2, None)  # an unrecorded CPU cannot be shown to be that one
    assert bound.describe() == "a CPU matching /^AMD EPYC/ and ISA avx2+avx512f+avx512_bf16"


def test_dtype_without_native_bf16() -> None:
    engine = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu").engine
    assert engine.dtype == "bfloat16" and engine.dtype_without_native_bf16 == "float32"
    assert engine_on_cpu(engine, native_bf16=True) is engine and engine_on_cpu(engine, native_bf16=False).dtype == "float32"
    plain = dataclasses.replace(engine, dtype_without_native_bf16=None)
    assert engine_on_cpu(plain, native_bf16=False).dtype == "bfloat16"  # not asked for: the YAML's dtype everywhere


def test_shipped_cpu_budget_is_bound_to_this_projects_cpu() -> None:
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    assert not cpu.match.cuda  # still selected on any machine without CUDA: op counts run everywhere
    assert cpu.ttft_hardware is not None and ttft_binding_fits(cpu.ttft_hardware, "AMD EPYC", 2, ("avx2", "avx512f", "avx512_bf16"))
    assert not ttft_binding_fits(cpu.ttft_hardware, "Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", 8, ("avx2",))
    assert not ttft_binding_fits(cpu.ttft_hardware, "AMD EPYC", 2, ("avx2",))  # the AVX2-only EPYC the VM names alike
    assert load_thresholds(SHIPPED_THRESHOLDS).profile("a10").ttft_hardware is None


# (replace this, with that) -> expected line, key and words of the problem
T = "      ttft_ms: {p50: 9000, p99: 10000}"
P = '      prompt: "<image>\\nFree OCR."'
M = "profiles.cpu.workload.profile_mixes"
BAD = [
    ("      requests: 3", "      requests: 3\n      reqests: 4", 11, "profiles.cpu.workload.reqests", "unknown key"),
    ("      requests: 3", "      requests: three", 10, "profiles.cpu.workload.requests", "expected an integer"),
    ("p50: 9000", "p50: -5", 14, "profiles.cpu.budgets.ttft_ms.p50", "greater than 0"),
    ("p50: 9000", "p50: 0", 14, "profiles.cpu.budgets.ttft_ms.p50", "greater than 0"),
    ("p50: 9000", "median: 9000", 14, "profiles.cpu.budgets.ttft_ms.median", "unknown percentile"),
    ("p50: 9000", "p100: 9000", 14, "profiles.cpu.budgets.ttft_ms.p100", "unknown percentile"),
    ("schema_version: 1", "schema_version: 7", 1, "schema_version", "unsupported schema version"),
    ("      max_model_len: 2048\n", "", 7, "profiles.cpu.engine.max_model_len", "missing required key"),
    ("{max: 0}", "{max: -1}", 19, "aten::_index_put_impl_.max", "must be >= 0"),
    ("{max: 0}", "{max: 1.5}", 19, "aten::_index_put_impl_.max", "expected an integer"),
    ("{max: 0}", "{max: 0, exact: 0}", 19, "aten::_index_put_impl_", "exactly one of"),
    ("{max: 0}", "{atmost: 0}", 19, "aten::_index_put_impl_.atmost", "unknown key"),
    ("scope: {file: vllm/model_executor/models/deepencoder2.py, function: _update_causal_mask}",
     "scope: everything", 17, "mask_path.scope", "unknown scope form"),
    ("scope: {file: vllm/model_executor/models/deepencoder2.py, function: _update_causal_mask}",
     "scope: {file: x.py}", 17, "mask_path.scope.function", "missing required key"),
    ("    match: {cuda: false}", "    match: {cuda: nope}", 5, "profiles.cpu.match.cuda", "expected true or false"),
    ("      max_model_len: 2048\n", "      max_model_len: 2048\n      retain_freed_memory: sometimes\n", 9,
     "profiles.cpu.engine.retain_freed_memory", "expected true or false"),
    ("      max_model_len: 2048\n", "      max_model_len: 2048\n      skip_mm_profiling: 1\n", 9,
     "profiles.cpu.engine.skip_mm_profiling", "expected true or false"),
    ("      image_sizes: [[640, 480]]", "      image_sizes: [[640]]", 11, "image_sizes[0]", "expected [width, height]"),
    ("  cpu:", "  cpu:\n    headroom_pct: 5\n    headroom_pct: 6", 6, "profiles.cpu.headroom_pct", "duplicate key"),
    (T, T + "\n      ttft_hardware: {cpu_model_regex: '(EPYC'}", 15, "budgets.ttft_hardware.cpu_model_regex",
     "not a valid regular expression"),
    (T, T + "\n      ttft_hardware: {cpu_count: 0}", 15, "budgets.ttft_hardware.cpu_count", "must be >= 1"),
    (T, T + "\n      ttft_hardware: {cpu_count: [8, 4]}", 15, "budgets.ttft_hardware.cpu_count", "min is above max"),
    (T, T + "\n      ttft_hardware: {cpu_count: [2, 4, 8]}", 15, "budgets.ttft_hardware.cpu_count", "range [min, max]"),
    (T, T + "\n      ttft_hardware: {cpu_modle_regex: EPYC}", 15, "budgets.ttft_hardware.cpu_modle_regex", "unknown key"),
    (T, T + "\n      ttft_hardware: {}", 15, "budgets.ttft_hardware", "empty"),
    (T, T + "\n      ttft_hardware: {speed_reference_ms: 0}", 15, "budgets.ttft_hardware.speed_reference_ms",
     "greater than 0"),
    (T, T + "\n      ttft_hardware: {speed_reference_ms: fast}", 15, "budgets.ttft_hardware.speed_reference_ms",
     "expected a number"),
    (T + "\n", "      ttft_hardware: {cpu_count: 2}\n", 14, "budgets.ttft_hardware", "there are none"),
    (T, T + "\n      ttft_hardware: {cpu_isa: [avx2, avx512bf16]}", 15, "budgets.ttft_hardware.cpu_isa[1]",
     "unknown CPU extension 'avx512bf16'"),
    (T, T + "\n      ttft_hardware: {cpu_isa: avx2}", 15, "budgets.ttft_hardware.cpu_isa", "list of strings"),
    ("      max_model_len: 2048\n", "      max_model_len: 2048\n      dtype_without_native_bf16: float32\n", 9,
     "profiles.cpu.engine.dtype_without_native_bf16", "only meaningful with dtype: bfloat16"),
    ("  cpu:", "  cpu:\n    validity: {max_other_cpu_pct: 150}", 5, "profiles.cpu.validity.max_other_cpu_pct", "0-100"),
    ("  cpu:", "  cpu:\n    validity: {max_other_cpu_pct: -1}", 5, "profiles.cpu.validity.max_other_cpu_pct", "must be >= 0"),
    ("  cpu:", "  cpu:\n    validity: {max_other_cores: 1}", 5, "profiles.cpu.validity.max_other_cores", "unknown key"),
    ("  cpu:", "  cpu:\n    validity: {max_slowdown_pct: -5}", 5, "profiles.cpu.validity.max_slowdown_pct", "must be >= 0"),
    ("      image_sizes: [[640, 480]]", "      image_sizes: [[640, 480], [100000, 100000]]", 11, "image_sizes[1]",
     "a side over 16384 pixels"),
    # YAML 1.1 reads these as numbers: octal, hexadecimal, base 60; nobody writes a budget so on purpose
    ("      requests: 3", "      requests: 03", 10, "workload.requests", "'03' is not a decimal number"),
    ("      max_model_len: 2048", "      max_model_len: 0x800", 8, "engine.max_model_len", "not a decimal number"),
    ("      requests: 3", "      requests: 1:30", 10, "workload.requests", "(YAML reads it as 90)"),
    ("  cpu:", "  cpu:\n    validity: {max_slowdown_pct: 1:30}", 5, "profiles.cpu.validity.max_slowdown_pct",
     "not a decimal number"),
    # request mixes of the profile pass (workload.profile_mixes)
    (P, P + "\n      profile_mixes:\n        seeded: {temprature: 1.0}", 14, f"{M}.seeded.temprature", "unknown key"),
    (P, P + "\n      profile_mixes:\n        seeded: {seed: 3}", 14, f"{M}.seeded.seed", "only meaningful with temperature > 0"),
    (P, P + "\n      profile_mixes:\n        short: {output_tokens: 1}", 14, f"{M}.short.output_tokens", "must be >= 2"),
    (P, P + "\n      profile_mixes:\n        long: {output_tokens: 100000}", 14, f"{M}.long.output_tokens", "more than 256"),
    (P, P + "\n      profile_mixes:\n        two: {images: 2}", 14, f"{M}.two.images", "2 is more than 1"),
    (P, P + "\n      profile_mixes:\n        m: {min_tokens: 9}", 14, f"{M}.m.min_tokens", "more than output_tokens (8)"),
    (P, P + "\n      profile_mixes:\n        Seeded Mix: {}", 14, f"{M}.Seeded Mix", "expected a name"),
    (P, P + "\n      profile_mixes:\n        p: {temperature: 1, top_p: 1.5}", 14, f"{M}.p.top_p", "fraction"),
    (P, P + "\n      profile_mixes: [greedy]", 13, M, "expected a mapping"),
]


@pytest.mark.parametrize(("old", "new", "line", "key", "problem"), BAD, ids=[b[3] + ":" + b[4] for b in BAD])
def test_bad_input_names_file_line_and_key(tmp_path: Path, old, new, line, key, problem) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_thresholds(path)
    e = err.value
    assert e.exit_code == ExitCode.CONFIG
    assert e.path == str(path) and e.line == line, str(e)
    assert key in e.key and problem in e.problem, str(e)
    assert str(e).startswith(f"{path}:{line}: ")


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_thresholds(write(tmp_path, GOOD.replace("      requests: 3", "      requests: 3\n      warmup_request: 1")))
    assert "did you mean `warmup_requests`" in str(err.value)


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_thresholds(write(tmp_path, GOOD.replace("    budgets:", "    budgets: [unclosed")))
    assert err.value.line is not None and "not valid YAML" in err.value.problem


def test_missing_profile_is_a_config_error(tmp_path: Path) -> None:
    t = load_thresholds(write(tmp_path, GOOD))
    with pytest.raises(ConfigError) as err:
        t.profile("h100")
    assert "profiles.h100" in str(err.value) and "profiles in this file: cpu" in str(err.value)


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such thresholds file"):
        load_thresholds(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="empty thresholds file"):
        load_thresholds(write(tmp_path, "# nothing\n"))
    with pytest.raises(ConfigError, match="the thresholds path is empty"):  # not "." read as a folder
        load_thresholds("")


def test_cli_exits_2_with_file_line_before_starting_any_engine(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD.replace("p50: 9000", "p50: fast"))
    proc = run_guard("check", "--thresholds", str(bad), "--output", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}:14: profiles.cpu.budgets.ttft_ms.p50: expected a number" in proc.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_cli_unknown_profile_exits_2(tmp_path: Path) -> None:
    proc = run_guard("check", "--profile", "h100", "--output", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2 and "profiles.h100" in proc.stderr


def test_cli_profile_for_other_hardware_is_an_invalid_environment(tmp_path: Path) -> None:
    # No CUDA device on CI machines: asking for the A10 profile must not measure and compare.
    proc = run_guard("check", "--profile", "a10", "--output", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 3 and "needs a CUDA device" in proc.stderr


def test_cli_usage_error_exits_2() -> None:
    proc = run_guard("check", "--bogus", timeout=60)
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr


def test_on_cpu_swaps_in_the_float32_census() -> None:
    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    assert cpu.census.baseline.name == "deepseek-ocr-2.cpu.census.json"
    assert cpu.census.baseline_without_native_bf16.name == "deepseek-ocr-2.cpu.float32.census.json"
    assert cpu.census.baseline_without_native_bf16.exists()  # committed beside the bfloat16 one
    without = on_cpu(cpu, native_bf16=False)
    assert without.census.baseline == cpu.census.baseline_without_native_bf16 and without.engine.dtype == "float32"
    assert on_cpu(cpu, native_bf16=True) is cpu


# ----------------------------------------------------------------------------- decidable budgets (#32)
def test_a_percentile_no_run_within_the_cap_can_decide_is_refused_naming_line_key_and_need(tmp_path: Path) -> None:
    """p99 at 95 % has an upper bound only from 368 samples on: a cap of 200 makes it a budget that
    can never be shown to hold, so the file is refused (exit 2 through the CLI), not run to the cap."""
    text = GOOD.replace("    budgets:\n", "    statistics: {confidence: 0.95, max_requests: 200, batch: 50}\n    budgets:\n")
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_thresholds(path)
    msg = str(e.value)
    assert f"{path}:{text.splitlines().index('      ttft_ms: {p50: 9000, p99: 10000}') + 1}" in msg
    assert "profiles.cpu.budgets.ttft_ms.p99" in msg and ">= 368 samples" in msg and "max_requests 200" in msg
    res = run_guard("check", "--thresholds", str(path), "--profile", "cpu")
    assert res.returncode == ExitCode.CONFIG, res.stderr
    assert "368" in res.stderr


def test_a_cap_at_the_need_or_no_cap_keeps_the_percentile(tmp_path: Path) -> None:
    capped = GOOD.replace("    budgets:\n", "    statistics: {max_requests: 368}\n    budgets:\n")
    assert load_thresholds(write(tmp_path, capped)).profile("cpu").ttft_ms["p99"] == 10000
    # no max_requests: no resampling, the run's own count decides (today's behaviour, judged at run time)
    assert load_thresholds(write(tmp_path, GOOD)).profile("cpu").ttft_ms["p99"] == 10000


def test_a_server_mode_budget_is_held_to_the_same_cap(tmp_path: Path) -> None:
    text = GOOD.replace("    budgets:\n", "    statistics: {max_requests: 24}\n    budgets:\n").replace(
        "      ttft_ms: {p50: 9000, p99: 10000}\n",
        "      ttft_ms: {p50: 9000}\n      modes:\n        server:\n          ttft_ms: {p50: 9000, p90: 9500}\n")
    with pytest.raises(ConfigError) as e:
        load_thresholds(write(tmp_path, text))
    assert "profiles.cpu.budgets.modes.server.ttft_ms.p90" in str(e.value) and ">= 36 samples" in str(e.value)


def test_the_shipped_profiles_budget_only_what_they_can_decide() -> None:
    from guard.judge.rules import min_samples_for_upper_bound

    for p in load_thresholds(SHIPPED_THRESHOLDS).profiles.values():
        for budgets in (p.ttft_ms, *p.ttft_ms_by_mode.values()):
            for key in budgets:
                assert min_samples_for_upper_bound(key, p.statistics.confidence) <= p.statistics.max_requests, (p.name, key)


@pytest.mark.parametrize("percentile, need", [("p99.9", 3688), ("p99.99", 36887)])
def test_an_undecidable_percentile_is_named_whole_in_its_error_and_hint(tmp_path: Path, percentile, need) -> None:
    """The hint names the budget to drop as written (`p99.9`, not `p99.`), and the samples it needs."""
    y = tmp_path / "t.yaml"
    y.write_text(SHIPPED_THRESHOLDS.read_text().replace("        p99: 2521", f"        {percentile}: 2521", 1))
    with pytest.raises(ConfigError) as err:
        load_thresholds(y)
    assert err.value.key == f"profiles.a10.budgets.ttft_ms.{percentile}"
    assert f"an upper bound for {percentile} at 0.95 confidence needs >= {need} samples" in err.value.problem
    assert err.value.hint == (f"raise statistics.max_requests to {need} or more, or drop the {percentile} budget "
                              "(it is still measured and reported)")


def test_on_cpu_swaps_in_the_amx_census_only_for_bf16_on_an_amx_cpu() -> None:
    shipped = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    amx_file = shipped.census.baseline.with_name("deepseek-ocr-2.cpu.amx.census.json")
    cpu = dataclasses.replace(shipped, census=dataclasses.replace(shipped.census, baseline_with_amx=amx_file))
    amx = on_cpu(cpu, native_bf16=True, amx=True)
    assert amx.census.baseline == amx_file and amx.engine == cpu.engine
    assert cpu.census.baselines == (cpu.census.baseline, cpu.census.baseline_without_native_bf16, amx_file)
    float32 = dataclasses.replace(cpu, engine=dataclasses.replace(cpu.engine, dtype="float32"))
    assert on_cpu(float32, native_bf16=True, amx=True) is float32  # vLLM's AMX GEMM takes bf16/fp16 only
    without = dataclasses.replace(cpu, census=dataclasses.replace(cpu.census, baseline_with_amx=None))
    unjudged = on_cpu(without, native_bf16=True, amx=True)
    assert unjudged.census.baseline == cpu.census.baseline and "AMX" in unjudged.census.not_judged


def test_on_an_amx_cpu_without_its_census_a_scopes_total_is_shown_but_its_named_ops_are_judged() -> None:
    """The kernels that make the census inapplicable on AMX change a scope's total calls too (vLLM's AMX
    attention allocates more), so total_ops is not judged there; a watched op (an index write) still is."""
    from guard.judge.evaluate import op_checks
    from guard.model.records import TOTAL_OPS, ScopeCounts, Status

    cpu = load_thresholds(SHIPPED_THRESHOLDS).profile("cpu")
    cpu = dataclasses.replace(cpu, census=dataclasses.replace(cpu.census, baseline_with_amx=None))
    (scope,) = [sb for sb in cpu.ops if sb.total_ops is not None and "aten::_index_put_impl_" in sb.ops]
    grown = ScopeCounts(scope.name, (640, 480), entries=1, calls_by_op={"aten::_index_put_impl_": 3},
                        total_calls=scope.total_ops.count + 50)
    on_amx = {c.op: c.status for c in op_checks(on_cpu(cpu, native_bf16=True, amx=True), [grown])}
    assert on_amx[TOTAL_OPS] == Status.NOT_JUDGED and on_amx["aten::_index_put_impl_"] == Status.FAIL
    plain = {c.op: c.status for c in op_checks(on_cpu(cpu, native_bf16=True, amx=False), [grown])}
    assert plain[TOTAL_OPS] == Status.FAIL  # counted on the kernels its cap was: judged


def test_has_amx_reads_the_recorded_extensions() -> None:
    assert has_amx(("avx512f", "avx512_bf16", "amx_bf16")) and not has_amx(("avx2", "avx512f", "avx512_bf16"))
    assert not has_amx(None) and not has_amx(())


def schema_reference() -> list[str]:
    """docs/budgets.md's key reference, as the schema tables in guard.config.schema declare it:
    one row per section, its keys in order, required ones in bold, defaults in brackets."""
    from guard.config import schema as b

    def keys(table) -> str:
        table = table.keys if isinstance(table, b.Section) else table
        words = []
        for name, key in table.items():
            default = key.default
            shown = f" ({default})" if isinstance(default, (int, float, str)) and not isinstance(default, bool) \
                else f" ({str(default).lower()})" if isinstance(default, bool) else ""
            words.append(f"**`{name}`**" if key.required else f"`{name}`{shown}")
        return ", ".join(words)

    p = "profiles.NAME"
    sections = [("(top level)", b.TOP), (p, b.PROFILE), (f"{p}.match", b.MATCH), (f"{p}.engine", b.ENGINE),
                (f"{p}.workload", b.WORKLOAD), (f"{p}.workload.profile_mixes.MIX", b.PROFILE_MIX),
                (f"{p}.statistics", b.STATISTICS), (f"{p}.validity", b.VALIDITY),
                (f"{p}.ab", b.AB), (f"{p}.budgets", b.BUDGETS), (f"{p}.budgets.ttft_hardware", b.TTFT_HARDWARE),
                (f"{p}.budgets.census", b.CENSUS), (f"{p}.budgets.ops.SCOPE", b.SCOPE_BUDGET),
                (f"{p}.budgets.ops.SCOPE.scope", b.SCOPE), (f"{p}.budgets.ops.SCOPE.ops.OP", b.OP_BUDGET),
                (f"{p}.budgets.modes.MODE", b.MODE_BUDGETS)]
    return [f"| `{where}` | {keys(table)} |" for where, table in sections]


def test_the_docs_key_reference_is_the_schema() -> None:
    """The reference in docs/budgets.md lists exactly the keys the loader accepts, in its order,
    with what is required and the defaults: a key added to the schema fails here until it is documented."""
    doc = (Path(__file__).parents[1] / "docs" / "budgets.md").read_text()
    section = doc.split("## Every key", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows == schema_reference(), "\n".join(schema_reference())


def test_the_default_budget_file_is_found_from_outside_the_checkout_as_model_finds_it(tmp_path: Path) -> None:
    """Plain `guard check` in another folder read ./thresholds (missing: exit 2) while `--model
    deepseek-ocr-2` found the checkout's; both now read the same file."""
    done = run_guard("check", "--only", "ops", "--profile", "nosuch", "--output", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and f"{SHIPPED_THRESHOLDS}: profiles.nosuch: no such hardware profile" in done.stderr


def test_profile_mixes_default_to_the_samplers_main_paths_and_may_be_listed_or_dropped(tmp_path: Path) -> None:
    """No profile_mixes: the default set (greedy, random top-k/top-p, seeded, penalties and logprobs);
    a profile's own list replaces it, with vLLM's defaults for what a mix does not set; {}: none."""
    census = GOOD.replace("    budgets:\n", "    budgets:\n      census: {baseline: m.census.json}\n")
    default = load_thresholds(write(tmp_path, census)).profile("cpu").workload.profile_mixes
    assert [m.name for m in default] == ["greedy", "random-topk-topp", "seeded", "penalties-logprobs"]
    assert load_thresholds(write(tmp_path, GOOD)).profile("cpu").workload.profile_mixes == ()  # no census rule
    with pytest.raises(ConfigError, match="only meaningful with budgets.census"):
        load_thresholds(write(tmp_path, GOOD.replace(P, P + "\n      profile_mixes: {}")))
    assert default[2].sampling_kwargs() == {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "seed": 0, "min_tokens": 0,
                                            "stop": None, "max_tokens": 8, "ignore_eos": True}
    own = census.replace(P, P + "\n      profile_mixes:\n        s: {temperature: 0.5, seed: 1, output_tokens: 4, "
                             "stop: [x]}")
    (mix,) = load_thresholds(write(tmp_path, own)).profile("cpu").workload.profile_mixes
    assert (mix.name, mix.temperature, mix.seed, mix.output_tokens, mix.stop, mix.top_k) == ("s", 0.5, 1, 4, ("x",), None)
    assert mix.sampling_kwargs()["stop"] == ["x"]
    assert RequestMix.of_message(mix.message()) == mix  # what an A/B worker is told, whole
    none = census.replace(P, P + "\n      profile_mixes: {}")
    assert load_thresholds(write(tmp_path, none)).profile("cpu").workload.profile_mixes == ()
