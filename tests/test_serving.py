"""aisim serve-bench: the TGI-shaped serving report, and its comparison with the published TGI rows."""
import json

import pytest
from typer.testing import CliRunner

from aisim.cli import app
from aisim.api import serve_bench


def test_serve_bench_rows_follow_tgi_definitions():
    bench = serve_bench("opt-125m", "h100", shards=[1, 2], batches=[1, 4], seq=64, decode_len=4)
    assert [s.shards for s in bench.shards] == [1, 2] and bench.shards[1].device == "h100x2"
    for shard in bench.shards:
        for r in shard.rows:
            assert r.fits
            assert r.decode_total_ms == pytest.approx(3 * r.decode_token_ms)  # decode_len 4 = prefill + 3 steps
            assert r.prefill_throughput_requests_per_s == pytest.approx(r.batch / (r.prefill_ms / 1e3))
            assert r.decode_throughput_tokens_per_s == pytest.approx(r.batch / (r.decode_token_ms / 1e3))


def test_serve_bench_reports_what_does_not_fit_with_numbers():
    bench = serve_bench("opt-125m", "h100", shards=[1], batches=[2, 64], seq=64, decode_len=4,
                        max_batch_total_tokens=1000)
    small, big = bench.shards[0].rows
    assert small.fits and not big.fits
    assert "4352 tokens > max_batch_total_tokens 1000" in big.not_fit_reason  # 64 x (64 + 4)


def test_serve_bench_cli_json_and_bad_shards():
    runner = CliRunner()
    r = runner.invoke(app, ["serve-bench", "--model", "opt-125m", "--device", "h100", "--shards", "1",
                            "--batch", "1", "--seq", "32", "--decode-len", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["shards"][0]["rows"][0]["fits"] is True
    r = runner.invoke(app, ["serve-bench", "--model", "opt-125m", "--device", "h100", "--shards", "1,x"])
    assert r.exit_code == 2 and "comma-separated integers" in r.output


def test_tgi_reference_rows_cover_every_seed_row():
    from aisim.studies.serve_bench import ServeBench, ServeRow, ServeShard
    from aisim.validation.published import TGI_DEVICES, tgi_rows

    def fake_bench(model, device, shards, batches, seq, decode_len, quant, runtime):
        assert runtime == "tgi-2023"
        rows = [ServeRow(batch=b, fits=True, prefill_ms=100.0, decode_token_ms=20.0) for b in batches]
        return ServeBench(model=model, device=device, seq=seq, decode_len=decode_len, dtype="fp16", quant=quant,
                          runtime=runtime, max_batch_total_tokens=None,
                          shards=[ServeShard(shards=shards[0], device=device, rows=rows)], assumptions=[])

    rows = tgi_rows(fake_bench)
    assert len(rows) == 36  # 6 runs x 6 batch sizes
    first = rows[0]  # 1 shard, batch 1: measured prefill 139.82 ms, decode 28.75 ms per token
    assert first.errors[f"{TGI_DEVICES[0]}_prefill"] == pytest.approx((100.0 - 139.82) / 139.82)
    assert first.errors[f"{TGI_DEVICES[0]}_decode"] == pytest.approx((20.0 - 28.75) / 28.75)
    assert all(r.errors[f"{TGI_DEVICES[0]}_prefill"] is None for r in rows if r.label[4] != "ok"
               and r.values["prefill_measured"] is None)


def test_full_vocabulary_prompt_logits_are_not_reported_as_kv_cache():
    """tgi-2023 keeps every prompt position's logits: they count in the step's peak as activations, not as KV
    cache (Llama-3-8B, 64 x 2048: the cache is 64 x 2048 x 131 kB = 17.2 GB at tp 1, half at tp 2)."""
    from aisim.api import estimate

    for tp, kv_gb in ((1, 17.18), (2, 8.59)):
        e = estimate("Meta-Llama-3-8B", f"l4x{tp}", workload="prefill", batch=64, seq=2048, dtype="fp16",
                     runtime="tgi-2023", tp=tp)
        assert abs(e.memory.kv_cache_gb - kv_gb) < 0.05 and e.memory.activations_gb > 30


def test_a_vllm_prefill_that_does_not_fit_in_one_forward_says_the_engine_chunks_it():
    """New-user test: under vllm, estimate's generate of 64 x 4096 tokens on h100x4 was 'does not fit' (one
    forward's activations) with no word that vLLM chunks prefills at max_num_batched_tokens, as `aisim serve` runs."""
    import aisim

    e = aisim.estimate("Meta-Llama-3-70B", "h100x4", workload="generate", batch=64, seq=4096, gen=8, dtype="bf16",
                       runtime="vllm")
    assert not e.fits and "chunks prefills at max_num_batched_tokens, 8,192" in e.not_fit_reason
    assert "aisim serve" in e.not_fit_reason
    small = aisim.estimate("Meta-Llama-3-70B", "h100", workload="generate", batch=1, seq=1024, gen=8, dtype="bf16",
                           runtime="vllm")
    assert not small.fits and "chunks prefills" not in small.not_fit_reason
