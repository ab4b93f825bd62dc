"""The vision benchmark's arithmetic and parsing (benchmarks/vision.py, benchmarks/vision_client.py):
server-sent events read into a reply, a burst's figures, ratios paired within a round, mixed over the
mean of the two bursts alone, py-spy stacks sorted into stages."""

from __future__ import annotations

import asyncio
import json

from benchmarks.vision import _identical, burst_row, stage_of, stage_shares, summary
from benchmarks.vision_client import Burst, ChatReply, _burst, _event, chat_body


def _sse(**data: object) -> bytes:
    return b"data: " + json.dumps(data).encode()


def test_events_give_ttft_text_and_usage() -> None:
    reply, parts = ChatReply(), list[str]()
    _event(reply, _sse(choices=[{"delta": {"role": "assistant", "content": ""}}]), 0.0, parts)
    assert reply.ttft is not None
    first = reply.ttft
    _event(reply, _sse(choices=[{"delta": {"content": " a"}}]), 0.0, parts)
    _event(reply, _sse(choices=[], usage={"prompt_tokens": 591, "completion_tokens": 2}), 0.0, parts)
    _event(reply, b"data: [DONE]", 0.0, parts)
    assert reply.ttft == first and "".join(parts) == " a"
    assert (reply.prompt_tokens, reply.completion_tokens) == (591, 2)


def test_an_event_without_choices_is_no_first_token() -> None:
    reply, parts = ChatReply(), list[str]()
    _event(reply, _sse(choices=[], usage={"completion_tokens": 0}), 0.0, parts)
    _event(reply, _sse(error={"message": "bad"}), 0.0, parts)
    assert reply.ttft is None and "bad" in reply.error


def test_body_asks_for_exact_greedy_tokens() -> None:
    body = json.loads(chat_body("m", {"role": "user", "content": "hi"}, 64))
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (64, 0, True, True)
    assert body["stream_options"] == {"include_usage": True}


def test_burst_reads_a_chunked_stream_from_a_local_server() -> None:
    events = [_sse(choices=[{"delta": {"content": "x"}}]), _sse(choices=[], usage={"completion_tokens": 1,
                                                                                    "prompt_tokens": 3})]
    payload = b"".join(e + b"\n\n" for e in [*events, b"data: [DONE]"])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (payload[:7], payload[7:]):  # an event split across chunks
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> Burst:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await _burst(f"http://127.0.0.1:{port}", [b"{}", b"{}"], 10)

    burst = asyncio.run(run())
    assert burst.tokens == 2 and burst.failed == 0
    assert [r.text for r in burst.replies] == ["x", "x"] and all(r.ttft is not None for r in burst.replies)


def test_burst_row_counts_tokens_over_wall_and_ttft_per_kind() -> None:
    replies = [ChatReply(200, ttft=t, completion_tokens=64, prompt_tokens=591) for t in (0.1, 0.3, 0.2, 0.4)]
    row = burst_row(Burst(replies, 2.0), ["image", "text", "image", "text"])
    assert row["tok_s"] == 128.0 and row["failed"] == 0
    assert row["ttft_mean_s"] == 0.25 and row["prompt_tokens"] == [591]
    assert (row["image_ttft_p50_s"], row["text_ttft_p50_s"]) == (0.1, 0.3)  # nearest rank, low of two


def _round(ours: float, vllm: float, text: float, mixed: float, failed: int = 0) -> dict[str, object]:
    run = {"failed": 0, "ttft_mean_s": 1.0, "ttft_p50_s": 1.0, "host_cpu_s": {}}
    return {"runs": {"ours": {**run, "tok_s": ours, "failed": failed}, "vllm": {**run, "tok_s": vllm},
                     "ours-text": {**run, "tok_s": text}, "ours-mixed": {**run, "tok_s": mixed},
                     "generate": {**run, "tok_s": ours / 4}}}


def test_summary_pairs_runs_of_a_round_and_skips_failed_ones() -> None:
    got = summary([_round(120, 100, 200, 160), _round(90, 100, 100, 95), _round(50, 100, 50, 50, failed=1)])
    assert got["ours_over_vllm_tok_s"]["per_round"] == [1.2, 0.9, None]
    assert got["ours_over_vllm_tok_s"]["median"] == 1.05
    assert got["ours_over_generate_tok_s"]["per_round"] == [4.0, 4.0, None]
    # mixed over the mean of image alone and text alone
    assert got["ours_mixed_over_mean_alone"]["per_round"] == [1.0, 1.0, None]
    assert got["vllm_mixed_over_mean_alone"]["per_round"] == [None, None, None]


def test_identical_counts_equal_greedy_texts_and_drops_them() -> None:
    runs = {"ours": {"texts": ["a", "b "]}, "vllm": {"texts": ["a", "c"]}, "generate": {"texts": ["a", "b"]}}
    got = _identical(runs)
    assert got == {"identical_ours_vllm": "1/2", "identical_ours_generate": "2/2", "identical_vllm_generate": "1/2"}
    assert all("texts" not in run for run in runs.values())


def test_stacks_sort_into_stages_innermost_stage_first() -> None:
    step = "main (process.py:1);Stepper.step (stepping.py:2)"
    prefill = f"{step};HFEngine._prefill (engine.py:3)"
    assert stage_of(f"{prefill};VisionSupport.features (vision.py:4);conv (x.py:5)") == "vision encoder"
    assert stage_of(f"{prefill};forward (m.py:6)") == "text prefill"
    assert stage_of(f"{step};tokenize_media (media.py:7);load_images (images.py:8)").startswith("image load")
    assert stage_of(f"{step};HFEngine.encode_media (engine.py:9)").startswith("processor")
    assert stage_of(f"{step};HFEngine._decode (engine.py:10)") == "decode steps"
    assert stage_of(f"{step};emit (x.py:11)").startswith("scheduling")
    assert stage_of("thread (1);select (selectors.py:1)") == "other"
    assert stage_of("main (p.py:1);NotHFEngine._decode_x (e.py:1)") == "other"  # whole names only
    raw = f"{prefill};VisionSupport.features (v.py:1) 3\n{step};HFEngine._decode (e.py:1) 1\nnot a sample\n"
    assert stage_shares(raw) == {"vision encoder": 75.0, "decode steps": 25.0}
