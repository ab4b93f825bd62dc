"""vLLM in DJL's async mode against the fake ``vllm`` package in tests/fakes (its ``AsyncLLM``
mirrors vLLM's V1 asynchronous engine): the adapter over ``generate``/``abort``, and the handler
in async mode answering byte for byte as the rolling batch over the synchronous ``LLMEngine``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djl_handlers.config.models import ServingConfig
from djl_handlers.engines.base import AsyncEngine, EngineRequest, StepOutput
from djl_handlers.errors import InvalidParameter, PromptTooLong
from djl_handlers.io.wire import binary_decode
from djl_handlers.params.generation import GenerationParameters
from djl_handlers.service import InferenceService
from djl_handlers.testing.async_loop import AsyncAnswer, AsyncModeClient
from djl_handlers.testing.java_loop import RollingBatchDriver, json_request

FAKES = Path(__file__).resolve().parents[1] / "fakes"
OPTIONS = {"model_id": "toy", "rolling_batch": "vllm"}


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    _drop("vllm")
    monkeypatch.syspath_prepend(str(FAKES))
    import vllm

    assert getattr(vllm, "IS_FAKE", False), vllm.__file__
    yield vllm
    _drop("vllm")


def make_engine(options: dict[str, str] | None = None, engine: str = "vllm") -> Any:
    from djl_handlers.engines.external.vllm import LmiDistEngine, VllmEngine

    props = {**OPTIONS, "async_mode": "true", **(options or {})}
    config = ServingConfig.from_properties(props, engine=engine)
    return (LmiDistEngine if engine == "lmi-dist" else VllmEngine).from_config(config)


def request(engine: Any, rid: int, prompt: str, **kwargs: Any) -> EngineRequest:
    params = GenerationParameters.from_dict(kwargs, engine="vllm")
    return EngineRequest(rid, engine.tokenizer.encode(prompt), params, prompt)


async def collect(engine: Any, req: EngineRequest) -> list[list[StepOutput]]:
    return [items async for items in engine.generate_async(req)]


def flat(items: list[list[StepOutput]]) -> list[StepOutput]:
    return [out for group in items for out in group]


# -- the adapter -----------------------------------------------------------------------------------
def test_async_mode_builds_asyncllm_from_async_engine_args(fake_vllm: Any) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from djl_handlers.engines.external.vllm import VllmEngine
    from djl_handlers.engines.external.vllm_async import VllmAsyncEngine

    engine = make_engine({"max_rolling_batch_size": "3", "max_model_len": "64"})
    assert isinstance(engine, VllmAsyncEngine) and isinstance(engine, AsyncEngine)
    assert isinstance(engine.engine, AsyncLLM) and type(engine.engine.engine_args) is AsyncEngineArgs
    assert (engine.engine.engine_args.max_num_seqs, engine.max_model_len) == (3, 64)
    sync = make_engine({"async_mode": "false"})
    assert isinstance(sync, VllmEngine) and not isinstance(sync, AsyncEngine)


def test_outputs_are_deltas_and_concatenate_to_the_text(fake_vllm: Any) -> None:
    engine = make_engine()
    req = request(engine, 7, "Deep", max_new_tokens=5)
    outs = flat(asyncio.run(collect(engine, req)))
    assert [o.token_id for o in outs] == [2, 3, 4, 5, 6]
    assert [o.text for o in outs] == [" learning", " is", " a", " really", " cool"]
    assert [o.finish_reason for o in outs] == [None] * 4 + ["length"]
    assert all(o.request_id == 7 and o.log_prob is not None for o in outs)
    [params] = engine.engine.core.added.values()
    assert params.output_kind == fake_vllm.RequestOutputKind.DELTA  # vLLM sends only what is new


def test_eos_stop_string_and_stop_token_finish_as_in_sync_mode(fake_vllm: Any) -> None:
    engine = make_engine()

    async def main() -> list[list[StepOutput]]:
        reqs = [request(engine, 1, "many"), request(engine, 2, "Deep", stop_sequences=["cool"]),
                request(engine, 3, "Deep", stop_token_ids=[4])]
        return [flat(x) for x in await asyncio.gather(*(collect(engine, r) for r in reqs))]

    eos, stop, token = asyncio.run(main())
    assert eos[-1].finish_reason == "eos_token" and eos[-1].token_id == 0
    assert stop[-1].finish_reason == "stop_sequence"
    assert "".join(o.text or "" for o in stop) == " learning is a really "
    assert token[-1].finish_reason == "eos_token" and token[-1].token_id == 4
    assert engine.engine.get_num_unfinished_requests() == 0


def test_merged_outputs_of_a_slow_reader_still_give_one_text_per_token(fake_vllm: Any) -> None:
    engine = make_engine()
    engine.engine.burst = 3  # three engine steps before the reader runs: the collector merges them
    items = asyncio.run(collect(engine, request(engine, 1, "Deep", max_new_tokens=6)))
    assert [len(group) for group in items] == [3, 3]
    assert [o.text for o in flat(items)] == [" learning", " is", " a", " really", " cool", " field"]


def test_rejections_are_the_requests_400s(fake_vllm: Any) -> None:
    engine = make_engine({"max_model_len": "8"})
    long = EngineRequest(1, list(range(1, 10)), GenerationParameters.from_dict({}, engine="vllm"), "")
    with pytest.raises(PromptTooLong, match="vLLM rejected the prompt"):  # VLLMValidationError
        asyncio.run(collect(engine, long))
    regex = request(engine, 2, "Deep", guided_regex="[unclosed")
    with pytest.raises(InvalidParameter, match="guided_regex") as info:  # EngineGenerateError from ValueError
        asyncio.run(collect(engine, regex))
    assert info.value.field == "guided_regex"
    with pytest.raises(InvalidParameter, match="temperature"):
        asyncio.run(collect(engine, request(engine, 3, "Deep", do_sample=True, temperature=-1.0)))


def test_abort_async_ends_the_request_in_vllm(fake_vllm: Any) -> None:
    engine = make_engine()

    async def main() -> list[StepOutput]:
        stream = engine.generate_async(request(engine, 5, "Deep", max_new_tokens=200, ignore_eos_token=True))
        first = await stream.__anext__()
        await engine.abort_async(5)
        await engine.abort_async(5)  # twice, and unknown ids: nothing happens
        await engine.abort_async(99)
        rest = [out async for group in stream for out in group]
        return first + rest

    outs = asyncio.run(main())
    assert outs[-1].error is not None and "abort" in outs[-1].error  # vLLM's final abort output
    core = engine.engine.core
    assert [rid.split("-")[0] for rid in core.aborted] == ["5"]
    assert not core.has_unfinished_requests() and engine.engine.get_num_unfinished_requests() == 0


def test_closing_the_stream_aborts_the_request_in_vllm(fake_vllm: Any) -> None:
    engine = make_engine()

    async def main() -> None:
        stream = engine.generate_async(request(engine, 6, "Deep", max_new_tokens=200, ignore_eos_token=True))
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(main())
    assert [rid.split("-")[0] for rid in engine.engine.core.aborted] == ["6"]
    assert engine.engine.get_num_unfinished_requests() == 0


def test_lmi_dist_in_async_mode_is_served_by_vllm(fake_vllm: Any) -> None:
    engine = make_engine({"rolling_batch": "lmi-dist"}, engine="lmi-dist")
    assert "vLLM" in engine.name and isinstance(engine, AsyncEngine)


# -- the handler in async mode ---------------------------------------------------------------------
def _sync_answer(payload: dict[str, Any]) -> tuple[str, str]:
    service = InferenceService("vllm")
    driver = RollingBatchDriver(service.handle)
    driver.init(dict(OPTIONS))
    req = driver.submit(json_request(payload))
    driver.run()
    return req.text, req.headers.get("Content-Type", "")


async def _started(**options: str) -> tuple[AsyncModeClient, InferenceService]:
    service = InferenceService("vllm")
    client = AsyncModeClient(service.handle)
    assert await client.init({**OPTIONS, "rolling_batch": "disable", **options}) is None
    return client, service


PAYLOADS = [
    {"inputs": "Deep", "parameters": {"max_new_tokens": 9, "details": True}},
    {"inputs": "Deep", "stream": True, "parameters": {"max_new_tokens": 5, "details": True}},
    {"inputs": "many", "stream": True, "parameters": {"max_new_tokens": 9}},
    {"inputs": "Deep", "parameters": {"max_new_tokens": 9, "stop": ["cool"], "details": True}},
    {"inputs": "Deep", "stream": True, "parameters": {"max_new_tokens": 9, "stop": ["field"]}},
]


@pytest.mark.parametrize("burst", [1, 3], ids=["step-by-step", "merged-outputs"])
@pytest.mark.parametrize("payload", PAYLOADS, ids=["json", "jsonlines", "eos", "stop", "stop-stream"])
def test_async_answers_equal_the_sync_rolling_batch_byte_for_byte(fake_vllm: Any, payload: dict[str, Any],
                                                                   burst: int) -> None:
    async def main() -> tuple[AsyncAnswer, Any]:
        client, service = await _started()
        service.engine.engine.burst = burst  # type: ignore[union-attr]
        return await client.request(payload), service

    answer, service = asyncio.run(main())
    assert service.async_mode.driver is None  # awaited directly: no engine-loop thread
    text, content_type = _sync_answer(payload)
    assert (answer.code, answer.text, answer.headers["Content-Type"]) == (200, text, content_type)


def test_concurrent_requests_and_bad_neighbours(fake_vllm: Any) -> None:
    async def main() -> list[AsyncAnswer]:
        client, _ = await _started()
        return await asyncio.gather(
            client.request({"inputs": "Deep", "parameters": {"max_new_tokens": 6}}),
            client.request({"inputs": "Deep", "parameters": {"max_new_tokens": -1}}),
            client.request({"inputs": "many", "stream": True, "parameters": {"max_new_tokens": 4}}),
            client.request({"inputs": "Deep", "parameters": {"guided_regex": "[unclosed"}}),
            client.request({"inputs": "Deep", "stream": True, "parameters": {"max_new_tokens": 3}}),
        )

    good, bad, streamed, rejected, other = asyncio.run(main())
    assert json.loads(good.text)["generated_text"] == " learning is a really cool field"
    assert bad.code == 400 and "max_new_tokens" in (bad.error or "")
    assert json.loads(streamed.text.splitlines()[-1])["generated_text"] == " people"
    assert rejected.code == 400 and "guided_regex" in (rejected.error or "")  # vLLM's own rejection
    assert json.loads(rejected.text) == {"error": rejected.error, "code": 400}
    assert json.loads(other.text.splitlines()[-1])["generated_text"] == " learning is a"


def test_cancel_frame_aborts_the_request_in_vllm(fake_vllm: Any) -> None:
    async def main() -> tuple[AsyncAnswer, AsyncAnswer, Any]:
        client, service = await _started()
        answer = AsyncAnswer()
        body = {"inputs": "Deep", "stream": True, "parameters": {"max_new_tokens": 500, "ignore_eos_token": True}}
        task = asyncio.ensure_future(client.stream(body, answer, tracking_id="t-1"))
        while len(answer.records) < 2:
            await asyncio.sleep(0.001)
        neighbour = asyncio.ensure_future(client.request({"inputs": "Deep", "parameters": {"max_new_tokens": 4}}))
        await client.cancel("t-1")
        await asyncio.wait_for(task, 10)
        return answer, await neighbour, service.engine.engine  # type: ignore[union-attr]

    answer, neighbour, llm = asyncio.run(main())
    assert answer.done and len(answer.records) < 500
    assert json.loads(neighbour.text)["generated_text"] == " learning is a really"
    assert [rid.split("-")[0] for rid in llm.core.aborted] == ["1"]  # the first request's slot id
    assert llm.get_num_unfinished_requests() == 0 and not llm.core.has_unfinished_requests()


def test_init_from_a_running_loop_without_async_mode_builds_asyncllm(fake_vllm: Any) -> None:
    """DJL's async engine awaits the handler: without ``async_mode`` in the properties the service
    still runs async mode, and the engine is built for it."""
    from djl_handlers.engines.external.vllm_async import VllmAsyncEngine
    from djl_handlers.io.inputs import Input

    async def main() -> InferenceService:
        service = InferenceService("vllm")
        assert await service.handle(Input.from_parts({**OPTIONS}, [])) is None
        return service

    service = asyncio.run(main())
    assert service.config is not None and service.config.async_mode
    assert isinstance(service.engine, VllmAsyncEngine) and service.async_mode is not None


def _adapter_dir(tmp_path: Path, name: str, rank: int) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 8}))
    return str(folder)


def test_lora_in_async_mode(fake_vllm: Any, tmp_path: Path) -> None:
    """Adapters registered through DJL's adapter call reach ``AsyncLLM.add_lora``/``pin_lora``
    (scheduled on the loop); requests carry their ``LoRARequest``; a rank above max_lora_rank is
    refused at registration."""
    from djl_handlers.io.inputs import Input

    async def register(service: InferenceService, name: str, src: str, **extra: str) -> Any:
        content = [(key, value.encode()) for key, value in extra.items()]  # DJL sends pin/preload as content
        reply = await service.adapter_call("register", Input.from_parts({"name": name, "src": src}, content))
        await asyncio.sleep(0)  # the scheduled add_lora/pin_lora run
        return reply

    async def main() -> tuple[list[Any], list[AsyncAnswer], Any]:
        client, service = await _started(enable_lora="true", max_loras="2", max_lora_rank="8")
        replies = [await register(service, "a", _adapter_dir(tmp_path, "a", 4)),
                   await register(service, "b", _adapter_dir(tmp_path, "b", 8), pin="true"),
                   await register(service, "big", _adapter_dir(tmp_path, "big", 16))]
        answers = await asyncio.gather(*(
            client.request({"inputs": "Deep", "adapters": name, "parameters": {"max_new_tokens": 3}})
            for name in ("a", "", "b", "nope")))
        return replies, answers, service.engine.engine  # type: ignore[union-attr]

    replies, answers, llm = asyncio.run(main())
    records = [binary_decode(bytes(r.content.value_at(0))) for r in replies]
    assert [r.get("code", "200") for r in records] == ["200", "200", "507"]  # AdapterLimit, as DJL
    assert "max_lora_rank" in records[2]["error"]
    assert llm.core.list_loras() == {1, 2} and llm.core.pinned == {2}
    assert [a.code for a in answers] == [200, 200, 200, 404]
    chosen = {rid.split("-")[0]: getattr(lora, "lora_name", None) for rid, lora in llm.core.lora_of.items()}
    assert sorted(chosen.values(), key=str) == [None, "a", "b"]


def test_a_finished_request_is_not_aborted(fake_vllm: Any) -> None:
    engine = make_engine()
    calls: list[Any] = []

    async def main() -> None:
        real = engine.engine.abort

        async def abort(request_id: Any, internal: bool = False) -> None:
            calls.append((request_id, internal))
            await real(request_id, internal)

        engine.engine.abort = abort
        stream = engine.generate_async(request(engine, 4, "Deep", max_new_tokens=2))
        items = [await stream.__anext__(), await stream.__anext__()]  # the last item: finished
        assert items[-1][-1].finish_reason == "length"
        await engine.abort_async(4)  # what async mode does when it stops reading

    asyncio.run(main())
    assert [call for call in calls if not call[1]] == []  # only vLLM's own no-op when its stream closes
    assert engine.engine.core.aborted == []


# -- several samples (n > 1) -------------------------------------------------------------------------
def _sampled(engine: Any, sample_ids: tuple[int, ...], **kwargs: Any) -> EngineRequest:
    params = GenerationParameters.from_dict({"do_sample": True, "temperature": 1.0, "seed": 11,
                                             "n": 1 + len(sample_ids), **kwargs}, engine="vllm")
    return EngineRequest(1, engine.tokenizer.encode("Deep"), params, "Deep", sample_ids=sample_ids)


@pytest.mark.parametrize("burst", [1, 3])
def test_samples_come_under_their_own_ids_merged_or_not(fake_vllm: Any, burst: int) -> None:
    engine = make_engine()
    engine.engine.burst = burst  # 3: the collector merges several samples' outputs into one
    outs = flat(asyncio.run(collect(engine, _sampled(engine, (5, 6), max_new_tokens=6))))
    per = {rid: [o for o in outs if o.request_id == rid] for rid in (1, 5, 6)}
    assert len(outs) == 18 and all(len(samples) == 6 for samples in per.values())
    assert all(samples[-1].finish_reason == "length" for samples in per.values())
    [params] = engine.engine.core.added.values()
    assert params.n == 3
    assert engine.engine.get_num_unfinished_requests() == 0 and engine.engine.core.aborted == []


def test_released_samples_end_the_stream_and_abort_in_vllm(fake_vllm: Any) -> None:
    engine = make_engine()

    async def main() -> list[StepOutput]:
        stream = engine.generate_async(_sampled(engine, (5, 6), max_new_tokens=200, ignore_eos_token=True))
        first = await stream.__anext__()
        engine.release(5)  # a rule of ours ended sample 5: it gets nothing more
        rest = []
        async for group in stream:
            rest += group
            if len(rest) > 6:
                engine.release(1)
                engine.release(6)  # the last sample let go: the stream ends
        return first + rest

    outs = asyncio.run(main())
    assert {o.request_id for o in outs} == {1, 5, 6}
    assert all(o.request_id != 5 for o in outs[3:]) and len(outs) < 30
    assert [rid.split("-")[0] for rid in engine.engine.core.aborted] == ["1"]
    assert engine.engine.get_num_unfinished_requests() == 0
