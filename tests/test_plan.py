"""Capacity planning (aisim plan serve / plan train): properties that must hold of any answer, and the plots."""
import functools
import json
import math

import pytest
from typer.testing import CliRunner

from aisim.cli import app
from aisim.scenario import scenario
from aisim.step import step_cost
from aisim.studies.plan_serve import plan_request, plan_serve
from aisim.studies.plan_train import plan_train, plan_train_request
from aisim.workload import StepShape

SERVE = dict(model="opt-125m", devices=["h100", "l4"], input_len="256", output_len="32", num_requests=30,
             max_gpus=8, max_num_seqs=[None, 8])


@functools.cache
def served(rate: float, ttft_ms: float = 150.0):
    return plan_serve(plan_request(rate_per_s=rate, slo={"median_tpot_ms": 70.0, "p90_ttft_ms": ttft_ms}, **SERVE))


@functools.cache
def trained(gpus: tuple[int, ...] = (8, 16)):
    return plan_train(plan_train_request(model="opt-125m", tokens=1e9, seq=512, global_batch=64, devices=["h100"],
                                         gpus=list(gpus), tp=[1, 2], pp=[1, 2], zero=[0, 1, 3],
                                         recompute=["none", "full"], micro_batch=[1, 2]))


def test_more_load_never_needs_fewer_gpus():
    low, high = served(2.0), served(12.0)
    assert high.min_gpus_per_device
    for device, gpus in high.min_gpus_per_device.items():
        assert low.min_gpus_per_device.get(device, math.inf) <= gpus, device
    assert set(high.min_gpus_per_device) <= set(low.min_gpus_per_device)


def test_a_looser_slo_never_costs_more():
    tight, loose = served(6.0, 100.0), served(6.0, 400.0)
    assert tight.cheapest_per_device
    for device, c in tight.cheapest_per_device.items():
        assert loose.cheapest_per_device[device].usd_per_million_output_tokens <= c.usd_per_million_output_tokens


def test_replica_counts_below_a_saturated_replica_are_named_not_silently_dropped():
    """A configuration whose one replica cannot carry the rate is not simulated at fewer replicas: plan serve says
    why those counts are missing from the ranking."""
    r = plan_serve(plan_request(rate_per_s=12.0, slo={"median_tpot_ms": 70.0, "p90_ttft_ms": 150.0},
                                **{**SERVE, "devices": ["l4"], "max_num_seqs": [8]}))
    ranked = {(c.device, c.tp, c.replicas) for c in r.ranked}
    saturated = [a for a in r.assumptions if "saturates at" in a and "are not simulated" in a]
    assert saturated
    for note in saturated:
        device, tp = note.split("/")[0], int(note.split(" tp ")[1].split(":")[0])
        low = int(note.split("at least ")[1].split(" replicas")[0])
        assert not any(d.startswith(device) and t == tp and n < low for d, t, n in ranked), note


def test_usd_per_million_tokens_is_price_times_gpus_over_tokens_per_hour():
    r = served(6.0, 400.0)
    assert r.ranked
    for c in r.ranked:
        tokens_per_hour = c.output_tokens_per_s_per_gpu * c.gpus * 3600
        assert c.usd_per_hour == pytest.approx(c.price_usd_per_gpu_hour * c.gpus)
        assert c.usd_per_million_output_tokens == pytest.approx(c.usd_per_hour / tokens_per_hour * 1e6)


def test_deployment_throughput_is_the_offered_load_not_a_finite_run_with_its_drain():
    """A stable queue serves what arrives: rate x output tokens per request (output_len 32 here), not the finite
    run's tokens over a duration that includes the drain after the last arrival."""
    r = served(6.0, 400.0)
    assert r.ranked and 0 < r.simulated <= r.considered   # configurations, not simulation runs (it said 3 of 6)
    for c in r.ranked:
        assert c.output_tokens_per_s_per_gpu * c.gpus == pytest.approx(6.0 * 32)
        assert c.metrics["output_throughput"] * c.replicas < 6.0 * 32   # the finite run's, drain included
        # the replicas were chosen from one replica's saturated throughput: together they carry the load
        assert c.max_output_tokens_per_s_per_gpu * c.gpus >= 6.0 * 32 * (1 - 1e-9)
    h100 = [c for c in r.ranked if c.device == "h100-sxm" and c.tp == 1]
    l4 = [c for c in r.ranked if c.device == "l4" and c.tp == 1 and c.max_num_seqs == h100[0].max_num_seqs]
    assert l4 and h100[0].max_output_tokens_per_s_per_gpu > l4[0].max_output_tokens_per_s_per_gpu


def test_every_reported_serving_configuration_fits():
    r = served(6.0, 400.0)
    for c in r.ranked:
        sc = scenario("opt-125m", f"{c.device}x{c.tp}" if c.tp > 1 else c.device, dtype="bf16", tp=c.tp)
        mem = step_cost(sc, StepShape(phase="prefill", batch=1, seq=256)).memory
        assert mem.total_gb <= mem.usable_gb
        assert c.meets_slo and c.metrics["median_tpot_ms"] <= 70.0 and c.metrics["p90_ttft_ms"] <= 400.0


def test_every_reported_training_plan_fits_and_is_ranked():
    r = trained()
    assert r.ranked and r.considered == sum(r.pruned.values()) + r.evaluated
    assert r.considered == 2 * 2 * 2 * 3 * 2 * 2   # gpus x tp x pp x zero x recompute x micro-batch
    assert r.pruned.get("dominated", 0) > 0
    for c in r.ranked:
        assert c.memory_per_gpu_gb <= c.usable_gb < c.capacity_gb   # the CUDA context and NCCL's buffers held
        assert c.tp * c.pp * c.dp == c.gpus and 64 % (c.dp * c.micro_batch) == 0
        assert c.usd == pytest.approx(c.gpus * c.time_to_train_s / 3600 * c.price_usd_per_gpu_hour)
        assert c.energy_mwh > 0 and 0 < c.mfu < 1
    times = [c.time_to_train_s for c in r.ranked]
    assert times == sorted(times)


def test_more_gpus_never_slow_the_best_training_plan_much():
    """With a fixed global batch, twice the GPUs can run every plan of the smaller count at twice the DP; only the
    longer data-parallel collectives can slow it: the best plan gets no more than 10 % slower."""
    best = {c.gpus: c.time_to_train_s for c in trained().best_per_gpus}
    assert best[16] <= 1.10 * best[8]


def test_the_pareto_front_is_not_dominated():
    r = trained()
    for c in r.pareto:
        assert not any(o.time_to_train_s < c.time_to_train_s and o.usd < c.usd for o in r.ranked)


def test_recompute_never_makes_a_step_faster():
    """The planner prunes a heavier recompute where a lighter one fits; this is why that is sound."""
    from aisim.studies.train import TrainRequest, train
    from aisim.workload import TrainPlan

    sc = scenario("opt-125m", "h100x8", dtype="bf16", tp=1, pp=1, dp=8)
    step = {rc: train(sc, TrainRequest(batch=16, seq=512, plan=TrainPlan(recompute=rc, micro_batch=2))).step_ms
            for rc in ("none", "full")}
    assert step["full"] >= step["none"]


def test_plan_train_cli_json_csv_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = CliRunner().invoke(app, ["plan", "train", "-m", "opt-125m", "--tokens", "1e9", "--seq", "512",
                                   "--global-batch", "32", "--devices", "h100", "--gpus", "8", "--tp", "1,2",
                                   "--pp", "1", "--zero", "0,3", "--micro-batch", "1", "--json",
                                   "--csv", str(tmp_path / "p.csv"), "--plot", str(tmp_path / "p.png")])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["considered"] == 8 and data["ranked"][0]["time_to_train_s"] > 0
    assert (tmp_path / "p.csv").read_text().startswith("device,gpus,tp,pp,dp,ep,zero")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plots_write_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from aisim import plots
    from aisim.api import estimate
    from aisim.catalog import resolve_gpu

    est = estimate(model="opt-125m", device="h100", workload="prefill", batch=4, seq=256, dtype="bf16")
    paths = [plots.pareto_png(served(6.0, 400.0), tmp_path / "pareto.png"),
             plots.roofline_png(est, resolve_gpu("h100"), tmp_path / "roof.png", "bf16"),
             plots.latency_throughput_png({"h100": [(1, 5.0, 200.0), (8, 9.0, 900.0)]}, tmp_path / "lt.png"),
             plots.estimated_vs_measured_png([("prefill", 1.0, 1.1), ("decode", 2.0, 1.8)], tmp_path / "evm.png"),
             plots.train_plan_png(trained(), tmp_path / "train.png")]
    for p in paths:
        assert p.read_bytes()[:4] == b"\x89PNG"


def test_plan_serve_json_names_the_model_as_serve_does_and_counts_are_integers():
    out = CliRunner().invoke(app, ["plan", "serve", "-m", "opt-125m", "--devices", "h100", "--runtime", "vllm",
                                   "--rate", "2", "--num-requests", "20", "--max-gpus", "1", "--input-len", "100",
                                   "--output-len", "20", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    served_name = json.loads(CliRunner().invoke(app, ["serve", "-m", "opt-125m", "-d", "h100", "--num-requests",
                                                      "5", "--input-len", "10", "--output-len", "5",
                                                      "--json"]).output)["model"]
    assert data["model"] == served_name == "facebook/opt-125m"
    best = data["ranked"][0]
    assert best["runtime"] == "vllm"
    assert isinstance(best["metrics"]["completed"], int) and isinstance(best["metrics"]["num_steps"], int)
    assert "replicas" not in best["metrics"]     # the simulated one replica; the candidate's count is its own


def test_plan_serve_csv_has_a_column_for_every_slo_metric(tmp_path):
    out = CliRunner().invoke(app, ["plan", "serve", "-m", "opt-125m", "--devices", "h100", "--runtime", "vllm",
                                   "--rate", "2", "--num-requests", "20", "--max-gpus", "1", "--input-len", "100",
                                   "--output-len", "20", "--slo", "ttft_p90_ms=500,e2el_p99_ms=5000,tpot_p50_ms=80",
                                   "--csv", str(tmp_path / "p.csv")])
    assert out.exit_code == 0, out.output
    header, row = (tmp_path / "p.csv").read_text().splitlines()[:2]
    columns = dict(zip(header.split(","), row.split(",")))
    assert {"p90_ttft_ms", "p99_e2el_ms", "median_tpot_ms"} <= set(columns)
    assert header.count("tpot") == 2 and float(columns["p90_ttft_ms"]) > 0   # p50 TPOT is the median column


def test_plan_train_table_is_full_width_when_piped():
    out = CliRunner().invoke(app, ["plan", "train", "-m", "opt-125m", "--tokens", "1e9", "--seq", "512",
                                   "--global-batch", "32", "--devices", "h100", "--gpus", "8", "--tp", "1",
                                   "--pp", "1", "--zero", "0", "--micro-batch", "1"])
    assert out.exit_code == 0, out.output
    assert "h100-sxm" in out.output and "…" not in out.output


def test_plans_with_no_answer_exit_1():
    """'Nothing meets the SLOs' and 'no plan' are answers, printed, with exit status 1 (bad input is 2), so a script
    can tell them from a plan as from grep's 'no match'."""
    none_meet = CliRunner().invoke(app, ["plan", "serve", "-m", "opt-125m", "--devices", "h100", "--runtime", "vllm",
                                         "--rate", "2", "--num-requests", "20", "--max-gpus", "1", "--input-len",
                                         "100", "--output-len", "20", "--slo", "tpot_p50_ms=0.01", "--json"])
    assert none_meet.exit_code == 1, none_meet.output
    assert json.loads(none_meet.output)["ranked"] == []
    no_plan = CliRunner().invoke(app, ["plan", "train", "-m", "opt-125m", "--tokens", "1e9", "--seq", "512",
                                       "--global-batch", "64", "--devices", "h100", "--gpus", "7", "--tp", "1",
                                       "--pp", "1", "--zero", "0", "--micro-batch", "1"])
    assert no_plan.exit_code == 1 and "batch split" in no_plan.output, no_plan.output


def test_plan_train_says_why_a_gpu_count_has_no_plan():
    """A global batch that no dp x micro-batch divides prunes every candidate before a trace: the reason says so
    (it used to say 'no plan fits in memory')."""
    result = plan_train(plan_train_request(model="opt-125m", tokens=1e9, seq=512, global_batch=64, devices=["h100"],
                                           gpus=[7], micro_batch=[1, 2]))
    (reason,) = result.not_feasible.values()
    assert result.evaluated == 0 and "batch split" in reason and "--global-batch 64 must be a multiple" in reason


def test_plan_serve_says_when_no_request_fits_the_model():
    """Prompts over the model's max_model_len (opt-125m: 2048 positions) fail every request: the error names it,
    as aisim serve does (it used to report a saturation rate of 0.00 req/s, then an empty table)."""
    from aisim.errors import AisimError

    with pytest.raises(AisimError) as err:
        plan_serve(plan_request(**{**SERVE, "devices": ["h100"], "input_len": "4000", "max_num_seqs": [None]},
                                rate_per_s=1.0, slo={}))
    reason = str(err.value)
    assert "no configuration to simulate" in reason and "max_model_len 2048" in reason and "0.00 req/s" not in reason


def test_a_model_that_does_not_fit_is_the_plans_answer_with_the_plans_own_advice():
    """Llama-3-70B on L4s (24 GB) up to 2 GPUs: not an error but a per-device reason saying the weights do not fit,
    advising the plan's flags (--max-gpus), not serve's (--gpu-memory-utilization); aisim serve says the same with
    its own flags."""
    from aisim.errors import DoesNotFit
    from aisim.scenario import ScenarioRequest, resolve_scenario
    from aisim.studies.serve.run import engine_config

    result = plan_serve(plan_request(model="Meta-Llama-3-70B", devices=["l4"], input_len="256", output_len="32",
                                     num_requests=20, max_gpus=2, rate_per_s=1.0, slo={}))
    (reason,) = result.not_feasible.values()
    assert reason.startswith("does not fit: ") and "weights take" in reason and "--max-gpus" in reason
    assert "--gpu-memory-utilization" not in reason
    sc = resolve_scenario(ScenarioRequest(model="Meta-Llama-3-70B", device="l4", dtype="bf16", runtime="vllm"),
                          "prefill")
    with pytest.raises(DoesNotFit, match=r"weights take 141\.\d+ GB per GPU.*use more GPUs \(--tp, --pp\)"):
        engine_config(sc, {})
    # weights under the card's memory but over what the engine's policy lets them use: said so, not a negative KV
    # budget (Llama-3-8B on a 16 GB T4: 16.06 GB of weights, vLLM 0.9 x 16.1 GB, transformers 14.8 GB free)
    for runtime, share in (("vllm", r"14\.50 GB .*gpu_memory_utilization 0\.9 of 16\.1 GB"),
                           ("transformers-cb", r"14\.80 GB .*14\.8 GB free after the CUDA context")):
        sc = resolve_scenario(ScenarioRequest(model="Meta-Llama-3-8B", device="t4", dtype="fp16", runtime=runtime),
                              "prefill")
        with pytest.raises(DoesNotFit, match=r"weights take 16\.06 GB per GPU, more than the " + share) as err:
            engine_config(sc, {})
        assert "= -" not in str(err.value)
    # weights under that memory, reserves over it (Mistral-7B fp16 on a T4 under vllm): no negative budget either
    sc = resolve_scenario(ScenarioRequest(model="Mistral-7B-v0.1", device="t4", dtype="fp16", runtime="vllm"),
                          "prefill")
    with pytest.raises(DoesNotFit, match=r"weights \(14\.48 GB per GPU\) and the engine's reserves") as err:
        engine_config(sc, {})
    assert "-0." not in str(err.value)


def test_per_gpu_notes_that_say_the_same_are_said_once():
    from aisim.studies.plan_serve import merge_per_gpu_notes

    notes = ["--dtype auto on l4: bf16 (x)", "--dtype auto on l40: bf16 (x)", "--dtype auto on t4: fp16 (t4 has no bf16)",
             "no system spec file for b200x2: assumed A", "no system spec file for b200x4: assumed A", "other"]
    assert sorted(merge_per_gpu_notes(notes)) == [
        "--dtype auto on l4, l40: bf16 (x)", "--dtype auto on t4: fp16 (t4 has no bf16)",
        "no system spec file for b200x2, b200x4: assumed A", "other"]


def test_plans_say_which_prices_are_defaults_and_which_price_is_unused():
    from aisim.studies.common import price_notes
    from aisim.specs import all_hardware

    h100, l4 = all_hardware()["h100-sxm"], all_hardware()["l4"]
    notes = price_notes({"h100-sxm": h100, "l4": l4}, {"l4": 0.5, "h200": 3.0})
    assert any("h100-sxm $3.49" in n and "l4" not in n for n in notes)
    assert any(n.startswith("--price for h200: not among the searched devices") for n in notes)
    assert price_notes({"l4": l4}, {"l4": 0.5}) == []


def test_plan_serve_does_not_price_tensor_parallelism_past_one_nvswitch_host():
    """--tp 16 on H100s was costed as one 16-GPU NVSwitch fabric ('no system spec file for h100-sxmx16'), which no
    host is: it is two nodes of h100x8-ndr (its all-reduces cross the network), and on a GPU with no multi-node
    system file (H200) it is left out with a note."""
    from aisim.catalog import resolve_device

    result = plan_serve(plan_request(model="Meta-Llama-3-8B", devices=["h100", "h200"], input_len="128",
                                     output_len="16", num_requests=20, max_gpus=16, tp=[8, 16], rate_per_s=1.0,
                                     slo={}, runtimes=["vllm"]))   # vLLM replicates the 8 KV heads over 16
    assert {c.tp for c in result.ranked if c.device == "h100-sxm"} == {8, 16}
    assert all(c.tp <= 8 for c in result.ranked if c.device == "h200")
    assert any("--tp 16 not searched on h200" in n for n in result.assumptions)
    assert any("2 nodes of h100x8-ndr" in n for n in resolve_device("h100x16").assumptions)
    assert any("several nodes" in n for n in resolve_device("h100x12").assumptions)
    assert not any("several nodes" in n for n in resolve_device("a100x4").assumptions)


def test_plan_serve_token_rate_and_cost_do_not_move_with_the_number_of_simulated_requests():
    """tok/s and $/M are the offered load: the rate x the output distribution's mean (ShareGPT: 203.1 tokens), not
    the simulated sample's mean, which moves with --num-requests."""
    def row(n):
        res = plan_serve(plan_request(model="opt-125m", devices=["h100"], num_requests=n, max_gpus=1, rate_per_s=2.0,
                                      slo={}, max_num_seqs=[None]))
        (cand,) = [c for c in res.ranked if c.gpus == 1]
        return cand
    few, many = row(40), row(400)
    assert few.output_tokens_per_s_per_gpu == pytest.approx(2.0 * 203.1, rel=1e-3) == many.output_tokens_per_s_per_gpu
    assert few.usd_per_million_output_tokens == pytest.approx(many.usd_per_million_output_tokens, rel=1e-9)


def test_slo_text_takes_both_spellings_and_the_printed_form():
    """--slo accepts aisim's ttft_p90_ms=..., vLLM's p90_ttft_ms=... and the 'p90_ttft_ms<=...' form the plan prints;
    a name that is no latency metric or a non-positive limit is one clear error."""
    from aisim.errors import AisimError
    from aisim.studies.plan_serve import parse_slo

    want = {"p90_ttft_ms": 1000.0, "median_tpot_ms": 50.0}
    assert parse_slo("ttft_p90_ms=1000,tpot_p50_ms=50") == want
    assert parse_slo("p90_ttft_ms=1000, median_tpot_ms=50") == want
    assert parse_slo("p90_ttft_ms<=1000,median_tpot_ms <= 50") == want
    for bad in ("ttft=1000", "p90_ttft_ms<=0", "p90_ttft_ms=fast"):
        with pytest.raises(AisimError, match="--slo"):
            parse_slo(bad)


def test_a_saturated_device_reports_the_configuration_needing_the_fewest_gpus():
    """When no configuration carries the rate within --max-gpus, the bound is the best one's (the default
    max_num_seqs), not the last one tried (max_num_seqs 8 saturates far lower)."""
    result = plan_serve(plan_request(**{**SERVE, "devices": ["l4"], "max_gpus": 1}, rate_per_s=2000.0, slo={}))
    (reason,) = result.not_feasible.values()     # a capacity answer, not an error
    assert "max_num_seqs 8)" not in reason and "needs at least" in reason
    gpus = int(reason.split("replicas (")[1].split(" GPUs")[0])
    eight = plan_serve(plan_request(**{**SERVE, "devices": ["l4"], "max_gpus": 1, "max_num_seqs": [8]},
                                    rate_per_s=2000.0, slo={}))
    assert gpus < int(next(iter(eight.not_feasible.values())).split("replicas (")[1].split(" GPUs")[0])


def test_plan_serve_refuses_a_system_name_with_the_reason():
    with pytest.raises(Exception, match="is 8 x h100-sxm: plan serve takes GPU names .* give --devices h100-sxm"):
        plan_serve(plan_request(**{**SERVE, "devices": ["h100x8"]}, rate_per_s=1.0, slo={}))


def test_plan_train_refuses_a_gpu_count_in_the_device_name():
    for name in ("h100x8", "dgx-h100"):
        with pytest.raises(Exception, match="is 8 x h100-sxm: plan train takes GPU names .* count itself \\(--gpus\\)"):
            plan_train(plan_train_request(model="opt-125m", tokens=1e9, seq=512, global_batch=64, devices=[name],
                                          gpus=[8]))


def test_plan_train_refuses_an_unknown_device_before_searching():
    with pytest.raises(Exception, match="unknown device 'nonsense'"):
        plan_train(plan_train_request(model="opt-125m", tokens=1e9, seq=512, global_batch=64,
                                      devices=["h100", "nonsense"], gpus=[8]))


def test_training_longer_than_the_model_positions_is_refused_up_front():
    with pytest.raises(Exception, match="exceeds the model's 2048 positions"):
        plan_train(plan_train_request(model="opt-125m", tokens=1e9, seq=4096, global_batch=64, devices=["h100"],
                                      gpus=[8]))


def test_a_plan_that_fills_the_memory_is_flagged():
    """A reported training plan above 95% of the usable GPU memory gets a note (the allocator's cache is not
    modelled)."""
    from aisim.studies.plan_train import TIGHT_MEMORY_FRACTION, _tight_memory_notes

    result = trained()
    plans = result.ranked
    assert not _tight_memory_notes([c for c in plans if c.memory_per_gpu_gb <= 0.9 * c.usable_gb])
    full = plans[0].model_copy(update={"memory_per_gpu_gb": plans[0].usable_gb * (TIGHT_MEMORY_FRACTION + 0.01)})
    (note,) = _tight_memory_notes([full])
    assert f"{full.device} x {full.gpus}" in note and "not modelled" in note


def test_slo_keys_take_every_percentile_spelling_through_the_api_too():
    from aisim.studies.plan_serve import parse_slo

    assert parse_slo("ttft_p90.0_ms=1000,tpot_p50_ms=50") == {"p90_ttft_ms": 1000.0, "median_tpot_ms": 50.0}
    req = plan_request(**{**SERVE, "devices": ["h100"]}, rate_per_s=1.0, slo={"ttft_p90_ms": 500, "p50.0_tpot_ms": 9})
    assert req.slo == {"p90_ttft_ms": 500.0, "median_tpot_ms": 9.0}


def test_requests_over_the_context_are_rejected_and_the_plan_serves_the_rest():
    """Some prompts over opt-125m's 2048 positions: the engine rejects them whatever the plan, so the plan goes on
    for the others and says how many were rejected (it used to fail the whole device)."""
    result = plan_serve(plan_request(**{**SERVE, "devices": ["h100"], "input_len": "uniform:100:3000",
                                        "max_num_seqs": [None]}, rate_per_s=1.0, slo={}))
    assert result.ranked and not result.not_feasible
    assert any("over the model's max_model_len 2048 and rejected" in a for a in result.assumptions)


def test_bursty_arrivals_never_need_fewer_gpus():
    """gamma:4 arrivals (bursty) at the same mean rate: the cheapest configuration meeting the SLO has at least as
    many GPUs as under Poisson arrivals; a bad spec is a one-line error before any search."""
    slo = {"median_tpot_ms": 70.0, "p90_ttft_ms": 150.0}
    runs = {a: plan_serve(plan_request(**{**SERVE, "devices": ["l4"], "max_num_seqs": [None]}, rate_per_s=8.0,
                                       slo=slo, arrival=a)) for a in ("poisson", "gamma:4")}
    assert runs["gamma:4"].min_gpus_per_device.get("l4", math.inf) >= runs["poisson"].min_gpus_per_device["l4"]
    with pytest.raises(Exception, match="arrival"):
        plan_request(**SERVE, rate_per_s=1.0, arrival="gamma:x")


def test_plan_train_says_which_shape_rule_pruned_everything():
    """New-user test: 'every candidate was pruned: shape (96)' did not say which degree failed."""
    from typer.testing import CliRunner

    from aisim.cli import app

    r = CliRunner().invoke(app, ["plan", "train", "--model", "Meta-Llama-3-8B", "--tokens", "1e11", "--devices",
                                 "h100", "--gpus", "64", "--tp", "3"])
    assert "shape: tp x pp does not divide the GPUs" in " ".join(r.output.split())


def test_plan_serve_searches_the_given_tp_degrees_with_expert_parallelism_and_power_settings():
    base = dict(model="OLMoE-1B-7B-0924", devices=["h100"], runtimes=["vllm"], rate_per_s=1.0, input_len="200",
                output_len="20", num_requests=20, max_gpus=2, max_num_seqs=[None])
    r = plan_serve(plan_request(tp=[2], enable_expert_parallel=True, **base))
    assert r.ranked and {c.tp for c in r.ranked} == {2}
    assert any("64 experts spread over 2 GPUs (32 per GPU" in a for a in r.assumptions)
    split = plan_serve(plan_request(tp=[2], **base))
    assert any("intermediate dimension split over the 2" in a for a in split.assumptions)
    capped = plan_serve(plan_request(tp=[1], gpu_clock_mhz=800.0, **base))
    free = plan_serve(plan_request(tp=[1], **base))
    assert (capped.ranked[0].metrics["median_ttft_ms"] > free.ranked[0].metrics["median_ttft_ms"]
            and any("power mode" in a for a in capped.assumptions))
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="l4/vllm: power limit 300 W is above l4's board power"):
        plan_serve(plan_request(power_limit_w=300.0, **{**base, "devices": ["l4"]}))
    partly = plan_serve(plan_request(power_limit_w=300.0, **{**base, "devices": ["h100", "l4"], "tp": [1]}))
    assert partly.ranked and "above l4's board power" in partly.not_feasible["l4/vllm"]
    dense = plan_serve(plan_request(tp=[1], enable_expert_parallel=True, **{**base, "model": "opt-125m"}))
    assert dense.ranked and any("has no experts" in a for a in dense.assumptions)


def test_equal_cost_configurations_rank_the_one_further_inside_its_slos_first():
    """Every configuration serves the offered load, so the same GPUs at one price tie on $/M."""
    r = served(6.0, 400.0)
    slo = {"median_tpot_ms": 70.0, "p90_ttft_ms": 400.0}
    for a, b in zip(r.ranked, r.ranked[1:]):
        if (a.usd_per_million_output_tokens, a.gpus) == (b.usd_per_million_output_tokens, b.gpus):
            assert max(a.metrics[k] / v for k, v in slo.items()) <= max(b.metrics[k] / v for k, v in slo.items())
    assert any((a.usd_per_million_output_tokens, a.gpus) == (b.usd_per_million_output_tokens, b.gpus)
               for a, b in zip(r.ranked, r.ranked[1:]))


def test_the_replica_bound_runs_the_engine_full_whatever_the_request_count():
    """The saturated bound ran --num-requests at once: 20 requests under vLLM's 1024 sequences were all admitted
    together and the run was its drain, so Llama-3-8B at 30 req/s on H100s needed 2 replicas with 20 requests
    and 1 with 400. The bound now runs the engine full (8 x max_num_seqs requests)."""
    found = {}
    for n in (20, 200):
        r = plan_serve(plan_request(model="Meta-Llama-3-8B", devices=["h100"], runtimes=["vllm"], rate_per_s=30.0,
                                    input_len="512", output_len="128", num_requests=n, max_gpus=4,
                                    max_num_seqs=[None], tp=[1]))
        found[n] = r.cheapest_per_device["h100-sxm"].replicas
    assert found == {20: 1, 200: 1}


def test_plan_energy_is_the_steady_states_within_the_board_or_its_limit_whatever_the_request_count():
    """J/tok and kWh/day were the finite run's J/tok (its warm-up and drain included) times the offered load:
    with 100 requests Llama-3-70B on 4 H100s drew 2.2 kW per GPU, and --power-limit was exceeded. They now come from
    the steady window's steps plus idle power, and a run too short for a steady window is lengthened."""
    base = dict(model="Meta-Llama-3-8B", devices=["h100"], runtimes=["vllm"], rate_per_s=20.0, max_gpus=2,
                max_num_seqs=[None], tp=[1])
    found = {}
    for n, limit in ((40, None), (400, None), (400, 300.0)):
        c = plan_serve(plan_request(num_requests=n, power_limit_w=limit, **base)).cheapest_per_device["h100-sxm"]
        watts_per_gpu = c.kwh_per_day * 1e3 / 24 / 1.2 / c.gpus
        assert 70 < watts_per_gpu <= (limit or 700), (n, limit, watts_per_gpu)   # above idle (70 W), at most the cap
        found[(n, limit)] = c.joules_per_output_token
    assert found[(40, None)] == pytest.approx(found[(400, None)], rel=0.15)   # was 2-4x apart
    assert found[(400, 300.0)] < found[(400, None)] * 1.5


@pytest.mark.parametrize("args, message", [
    (["--input-len", "abc"], "unknown length spec 'abc'"),
    (["--tp", "5"], "no --tp degree can be searched: tp 5: tensor parallel degree 5 does not divide"),
    (["--tp", "16", "--max-gpus", "8"], "tp 16: above --max-gpus 8"),
    (["-m", "whisper-tiny"], "encoder-decoder model"),
    (["--plot", "plan.txt"], "end the name in one of .png"),
])
def test_plan_serve_input_that_rules_out_every_candidate_is_one_error_not_an_empty_table(args, message):
    base = ["plan", "serve", "-m", "opt-125m", "--devices", "h100,l4", "--runtime", "vllm", "--rate", "1",
            "--num-requests", "20"]
    out = CliRunner().invoke(app, base + args)
    assert out.exit_code == 2 and message in out.output.replace("\n", " ") and "Traceback" not in out.output


def test_plan_serve_searches_a_gpu_named_twice_once():
    r = plan_serve(plan_request(**{**SERVE, "devices": ["h100", "h100-sxm", "H100"]}, rate_per_s=2.0, slo={}))
    one = plan_serve(plan_request(**{**SERVE, "devices": ["h100"]}, rate_per_s=2.0, slo={}))
    assert (r.considered, r.simulated, len(r.ranked)) == (one.considered, one.simulated, len(one.ranked))


def test_the_steady_window_counts_the_part_of_each_step_inside_it():
    """Warm-up (the first quarter of the arrivals) and drain (after the last arrival) are left out; a step that
    straddles an edge counts pro rata, so the window's power never exceeds a step's."""
    from aisim.studies.serve.engine import RequestState
    from aisim.studies.serve.metrics import steady_window
    from aisim.studies.serve.simulate import ReplicaStats, SimRun

    requests = [RequestState(i, a, 10, 10) for i, a in enumerate([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])]
    stats = ReplicaStats(0, 100, step_end_s=[1.5, 3.0, 6.0, 9.0], step_s=[1.5, 1.5, 3.0, 3.0],
                         step_energy_j=[150.0, 150.0, 300.0, 300.0])
    w = steady_window(SimRun(requests, None, [stats], "round-robin"))
    # window [2, 7]: the step 1.5-3.0 counts 1.0 of its 1.5 s, 3.0-6.0 whole, 6.0-9.0 1.0 of its 3.0 s
    assert (w.start_s, w.end_s, w.duration_s) == (2.0, 7.0, 5.0)
    assert w.busy_s == pytest.approx(1.0 + 3.0 + 1.0)
    assert w.energy_j == pytest.approx(100.0 + 300.0 + 100.0)      # 100 W throughout, as every step
    assert steady_window(SimRun(requests[:3], None, [stats], "round-robin")) is None       # under 4 requests
    at_once = [RequestState(i, 0.0, 10, 10) for i in range(8)]
    assert steady_window(SimRun(at_once, None, [stats], "round-robin")) is None            # rate = inf


def test_plan_train_table_shows_the_fastest_plan_of_every_device_and_gpu_count():
    """--top rows: every (device, GPUs) group's fastest plan first, then the next fastest (a 15-row table of one
    group hid another group that fits)."""
    from types import SimpleNamespace as P

    from aisim.report import train_plan_rows

    ranked = [P(device="h100", gpus=16, n=i) for i in range(20)] + [P(device="h200", gpus=8, n=99)]
    rows = train_plan_rows(ranked, 5)
    assert [(r.device, r.n) for r in rows] == [("h100", 0), ("h200", 99), ("h100", 1), ("h100", 2), ("h100", 3)]
    assert len(train_plan_rows(ranked[:2], 15)) == 2


@pytest.mark.parametrize("model,device,runtime,plan", [
    ("Meta-Llama-3-70B", "h100x16", "vllm", (8, 2, 1)),      # not tp 16 across the nodes (13.6 ms against 10.0)
    ("qwen3-30b-a3b", "h100x8", "eager", (4, 2, 1)),        # was refused: tp 4 x dp 2 and batch 1
    ("qwen3-30b-a3b", "h200x8", "vllm", (8, 1, 1)),         # vLLM replicates the 4 KV heads over 8
])
def test_default_plan_for_batch_1_puts_the_rest_in_pipeline_stages(model, device, runtime, plan):
    import aisim

    e = aisim.estimate(model, device, workload="decode", batch=1, seq=1024, runtime=runtime, top_ops=None)
    assert (e.plan.tp, e.plan.pp, e.plan.dp) == plan
    assert (e.plan.pp > 1) == any("pipeline parallel" in n for n in e.assumptions)


def test_tensor_parallel_past_one_host_without_a_network_file_is_refused():
    import aisim
    from aisim.errors import AisimError

    with pytest.raises(AisimError, match="one host joins at most 8 h200 GPUs"):
        aisim.estimate("Meta-Llama-3-70B", "h200x16", workload="decode", batch=64, seq=2048, runtime="vllm", tp=16)


def test_pipeline_fallback_takes_the_fewest_stages_whose_replicas_divide_the_batch():
    """Llama-3-70B batch 2 on four 8-GPU nodes: tp 8 x pp 2 x dp 2 (the fallback put every GPU in stages, pp 4, where
    two replicas of two stages take batch 2, and faster); with --ep 8 on h100x8 the fallback that cannot hold the
    expert group is not taken (the default plan's own error stays)."""
    import aisim
    from aisim.errors import AisimError

    e = aisim.estimate("Meta-Llama-3-70B", "h100x32", workload="decode", batch=2, seq=512, top_ops=None)
    assert (e.plan.tp, e.plan.pp, e.plan.dp) == (8, 2, 2)
    with pytest.raises(AisimError, match="default plan for h100x8: tensor parallel 4 x pipeline 1 x data parallel 2"):
        aisim.estimate("Qwen3-30B-A3B", "h100x8", workload="decode", batch=1, seq=512, ep=8)
