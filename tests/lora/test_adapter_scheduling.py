"""Adapter-aware scheduling and the runtime adapter API, step by step on ``LLMEngine`` (tiny random Llama).

A request whose adapter is loading never blocks others; a failed load fails every request waiting on it at once;
resident adapters go first but a request passed over for too long gets a slot; pins follow admission, finish,
abort and preemption; ``load_adapter`` / ``unload_adapter`` / ``list_adapters``.
"""

import threading

import pytest

from engine import SamplingParams
from tests.lora.engine_support import GREEDY, PeftOracle, lora_request, make_adapters, make_llm, prompts_of_lengths
from tests.support.tiny_llama import make_tiny_llama

SPECS = {
    "a": dict(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
    "b": dict(rank=4, alpha=4, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj"]),
}
PROMPT = prompts_of_lengths([9])[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("scheduling-model"))


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    return make_adapters(model_dir, tmp_path_factory.mktemp("scheduling-adapters"), SPECS)


@pytest.fixture(scope="module")
def oracle(model_dir, adapters):
    return PeftOracle(model_dir, adapters)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def step(engine, finals: dict) -> list:
    """One engine step; its outputs, the final ones also kept in ``finals`` (a request may finish in any step)."""
    outputs = engine.step()
    finals.update({o.request_id: o for o in outputs if o.finished})
    return outputs


def step_until(engine, done, finals: dict, limit: int = 1000) -> dict:
    """Step until ``done()``, keeping in ``finals`` the final output of every request that finishes meanwhile."""
    for _ in range(limit):
        if done():
            return finals
        step(engine, finals)
    raise AssertionError("the engine did not get there")


def drain(engine, limit: int = 500) -> dict:
    """Step until idle; the final output of every request."""
    return step_until(engine, lambda: not engine.has_unfinished_requests(), {}, limit)


def state(engine, request_id: str) -> str:
    return engine.requests[request_id].seqs[0].status.value if request_id in engine.requests else "done"


def wait_loaded(engine, future):
    """Step until the load ``future`` is done (no request is running yet); its result."""
    step_until(engine, future.done, {})
    return future.result()


def test_a_request_waiting_for_its_adapter_load_does_not_block_others(model_dir, adapters, oracle):
    engine = make_llm(model_dir).llm_engine
    gate = threading.Event()
    load = engine.adapters.loader.load
    engine.adapters.loader.load = lambda request: (gate.wait(30), load(request))[1]
    engine.add_request("lora", PROMPT, GREEDY, lora_request=lora_request("a", adapters["a"]))
    engine.add_request("base", PROMPT, GREEDY)
    finals = {}
    for _ in range(GREEDY.max_tokens + 2):
        step(engine, finals)
    assert "base" in finals and state(engine, "lora") == "waiting"
    assert engine.stats()["adapter_loads"]["loading"] == 1 and engine.has_pending_loads()
    gate.set()
    finals.update(drain(engine))
    assert finals["base"].outputs[0].token_ids == oracle.greedy(None, PROMPT)
    assert finals["lora"].outputs[0].token_ids == oracle.greedy("a", PROMPT)


def test_a_failed_load_fails_every_request_waiting_on_it_in_one_step(model_dir, adapters, tmp_path):
    engine = make_llm(model_dir).llm_engine
    missing = lora_request("gone", tmp_path / "gone")
    for i in range(3):
        engine.add_request(f"gone-{i}", PROMPT, GREEDY, lora_request=missing)
    engine.add_request("base", PROMPT, GREEDY)
    finals, failed = {}, []
    while not failed:  # the base request may finish meanwhile
        failed = [o for o in step(engine, finals) if o.error is not None]
    assert sorted(o.request_id for o in failed) == ["gone-0", "gone-1", "gone-2"]
    assert all(o.finished and o.error.code == "not_found" and o.outputs[0].finish_reason == "error" for o in failed)
    assert set(engine.requests) <= {"base"}
    finals.update(drain(engine))
    assert finals["base"].error is None


def test_a_failed_load_fails_only_the_requests_that_asked_for_its_source(model_dir, adapters, oracle, tmp_path):
    """Requests naming one adapter id with other sources (a wrong digest, a bad path) each get their own answer:
    the load that failed fails its own requests only, and the others' source is loaded next."""
    from tests.lora.engine_support import sha256_of

    engine = make_llm(model_dir).llm_engine
    folder = adapters["a"]
    wrong_digest = lora_request("a", folder, sha256="0" * 64)
    bad_path = lora_request("a", tmp_path / "nowhere")
    engine.add_request("wrong", PROMPT, params(4), lora_request=wrong_digest)
    engine.add_request("nowhere", PROMPT, params(4), lora_request=bad_path)
    engine.add_request("plain", PROMPT, params(4), lora_request=lora_request("a", folder))
    engine.add_request("right", PROMPT, params(4), lora_request=lora_request("a", folder, sha256=sha256_of(folder)))
    finals = drain(engine)
    assert finals["wrong"].error.code == "sha256_mismatch" and "0" * 64 in finals["wrong"].error.message
    assert finals["nowhere"].error.code == "not_found"
    for ok in ("plain", "right"):
        assert finals[ok].error is None and finals[ok].outputs[0].token_ids == oracle.greedy("a", PROMPT)[:4]


def test_resident_adapters_go_first_until_a_passed_over_request_is_due(model_dir, adapters, oracle):
    engine = make_llm(model_dir, max_loras=1, max_adapter_wait_steps=3).llm_engine
    a, b = lora_request("a", adapters["a"]), lora_request("b", adapters["b"])
    for request in (a, b):
        wait_loaded(engine, engine.load_adapter(request))
    engine.add_request("a1", PROMPT, params(8), lora_request=a)
    engine.step()
    engine.add_request("b1", PROMPT, params(3), lora_request=b)
    engine.add_request("a2", PROMPT, params(6), lora_request=a)
    engine.step()
    assert (state(engine, "a2"), state(engine, "b1")) == ("running", "waiting")  # younger, but its slot is there
    for _ in range(3):
        engine.step()
    engine.add_request("a3", PROMPT, params(2), lora_request=a)  # b1 is due: a is drained, a3 waits
    order, running = [], {"a1", "a2"}
    while engine.has_unfinished_requests():
        finished = {o.request_id for o in engine.step() if o.finished}
        now = {rid for rid in ("a1", "a2", "a3", "b1") if state(engine, rid) == "running"}
        order += sorted(now - running)
        running = now - finished
        adapters_running = {s.lora_request.id for s in engine.scheduler.running}
        assert len(adapters_running) <= 1
    assert order == ["b1", "a3"]
    assert engine.stats()["adapters"]["evictions"] == 2  # a -> b -> a


def test_a_group_split_by_the_token_budget_is_not_drained_of_its_overdue_rest(model_dir, adapters, tmp_path):
    """Adapter a's three requests are admitted over steps (a budget of one prompt a step beside d's decodes); b1,
    older than a3 and needing a slot, is overdue when both slots are pinned (d by three, a by two). The least used
    adapter is a, but its own overdue a3 waits: d is drained instead and a3 joins a1 and a2. Drained, a would have
    left a3 for a slot of its own after b1 (a whole extra turn of a slot for one request)."""
    d = lora_request("d", make_adapters(model_dir, tmp_path, {"d": dict(rank=4, alpha=8,
                                                                        target_modules=["q_proj"])})["d"])
    a, b = lora_request("a", adapters["a"]), lora_request("b", adapters["b"])
    engine = make_llm(model_dir, max_loras=2, max_adapter_wait_steps=1, max_num_batched_tokens=12).llm_engine
    for request in (a, b, d):
        wait_loaded(engine, engine.load_adapter(request))
    prompts = prompts_of_lengths([9] * 7)  # each its own: no prefix-cache hit shortens a prompt's chunk
    for i in range(3):
        engine.add_request(f"d{i}", prompts[i], params(40), lora_request=d)
    step_until(engine, lambda: all(state(engine, f"d{i}") == "running" for i in range(3)), {})
    while any(seq.num_computed_tokens < 9 for seq in engine.scheduler.running):
        engine.step()  # d's prompts computed: from here each step has 3 decodes and room for one prompt (9 tokens)
    for prompt, (rid, request) in zip(prompts[3:], (("a1", a), ("a2", a), ("b1", b), ("a3", a)), strict=True):
        engine.add_request(rid, prompt, params(8 if rid != "b1" else 4), lora_request=request)
    order, running = [], set()
    while engine.has_unfinished_requests():
        finished = {o.request_id for o in engine.step() if o.finished}
        now = {rid for rid in ("a1", "a2", "a3", "b1") if state(engine, rid) == "running"}
        order += sorted(now - running)
        running = now - finished
        assert len({s.lora_request.id for s in engine.scheduler.running}) <= 2
    assert order == ["a1", "a2", "a3", "b1"]


def test_pins_follow_admission_abort_and_preemption(model_dir, adapters, oracle):
    engine = make_llm(model_dir, num_kv_blocks=14, max_loras=2).llm_engine  # 14 blocks of 4: preemption
    requests = {"a": lora_request("a", adapters["a"]), "b": lora_request("b", adapters["b"])}
    for request in requests.values():  # loaded first: how long a load takes changes who runs beside whom
        wait_loaded(engine, engine.load_adapter(request))
    names = ["a", "b", None, "a"]
    for i, name in enumerate(names):
        engine.add_request(f"r{i}", PROMPT, params(16), lora_request=requests.get(name))
    engine.add_request("aborted", PROMPT, params(16), lora_request=requests["b"])
    finals = step_until(engine, lambda: state(engine, "aborted") == "running", {})
    pinned = {r["id"]: r["pinned_by"] for r in engine.stats()["adapters"]["resident"]}
    engine.abort_request("aborted")
    after = {r["id"]: r["pinned_by"] for r in engine.stats()["adapters"]["resident"]}
    assert after["id-b"] == pinned["id-b"] - 1
    finals.update(drain(engine))
    assert engine.stats()["preemptions"] > 0  # the scheduler's invariant check compared pins every step
    for i, name in enumerate(names):
        assert finals[f"r{i}"].outputs[0].token_ids == oracle.greedy(name, PROMPT, 16)
    assert all(r["pinned_by"] == 0 for r in engine.stats()["adapters"]["resident"])


def test_runtime_load_list_and_unload(model_dir, adapters, oracle, tmp_path):
    engine = make_llm(model_dir).llm_engine
    info = wait_loaded(engine, engine.load_adapter(lora_request("a", adapters["a"])))
    assert (info["id"], info["rank"], info["slot"], info["in_host_tier"]) == ("id-a", 8, None, True)
    assert info["target_modules"] == ["q_proj", "v_proj", "down_proj"] and info["scaling"] == 2.0
    assert [a["id"] for a in engine.list_adapters()] == ["id-a"]
    bad = engine.load_adapter(lora_request("bad", tmp_path))  # no adapter files there
    with pytest.raises(Exception) as refused:
        wait_loaded(engine, bad)
    assert refused.value.code == "missing_config"
    engine.add_request("using", PROMPT, params(10), lora_request=lora_request("a", adapters["a"]))
    engine.step()
    assert engine.unload_adapter("id-a") == {"id": "id-a", "known": True, "unloaded": False}  # in use
    assert [a["id"] for a in engine.list_adapters()] == ["id-a"]  # keeps its slot until the request ends
    final = drain(engine)["using"]
    assert final.outputs[0].token_ids == oracle.greedy("a", PROMPT, 10) and engine.list_adapters() == []
    assert engine.unload_adapter("id-a")["known"] is False
    again = drain_one(engine, lora_request("a", adapters["a"]))  # loaded again from its source
    assert again == oracle.greedy("a", PROMPT) and engine.stats()["adapter_loads"]["loads"] == 2


def drain_one(engine, request) -> list[int]:
    engine.add_request("again", PROMPT, GREEDY, lora_request=request)
    return drain(engine)["again"].outputs[0].token_ids


def test_loading_an_adapter_being_unloaded_keeps_it(model_dir, adapters):
    engine = make_llm(model_dir).llm_engine
    request = lora_request("b", adapters["b"])
    engine.add_request("using", PROMPT, params(6), lora_request=request)
    while state(engine, "using") != "running":
        engine.step()
    assert engine.unload_adapter("id-b")["unloaded"] is False
    again = engine.load_adapter(request)
    assert again.done() and again.result()["slot"] == 0  # answered at once: its slot still holds it
    drain(engine)
    assert [a["id"] for a in engine.list_adapters()] == ["id-b"] and not engine.has_pending_loads()


def started_at(engine, names, steps: int, finals: dict, arrivals=None) -> dict[str, int]:
    """Step ``steps`` times (adding ``arrivals[number]`` before step ``number``, collecting final outputs into
    ``finals``); the step at which each of ``names`` started running."""
    started = {}
    for number in range(steps):
        for name, request_params, request in (arrivals or {}).get(number, []):
            engine.add_request(name, PROMPT, request_params, lora_request=request)
        step(engine, finals)
        for name in names:
            if name not in started and state(engine, name) in ("running", "done"):
                started[name] = number
    return started


def test_an_adapter_takes_a_slot_as_a_group_when_the_batch_has_seats_for_it(model_dir, adapters, oracle):
    # 4 seats, 2 slots: a slot's group asks for min(its waiting sequences, 4 // 2) seats.
    engine = make_llm(model_dir, max_loras=2, max_num_seqs=4).llm_engine
    a, b = lora_request("a", adapters["a"]), lora_request("b", adapters["b"])
    for request in (a, b):
        wait_loaded(engine, engine.load_adapter(request))
    lengths = {"a1": 6, "b1": 3, "a2": 6, "b2": 3, "a3": 6}  # arrival order interleaves the adapters
    for name, length in lengths.items():
        engine.add_request(name, PROMPT, params(length), lora_request=a if name[0] == "a" else b)
    finals = {o.request_id: o for o in engine.step() if o.finished}
    # Arrival order would run a1 b1 a2 b2 and leave a3 alone in a's slot after the others; as groups, a's three
    # run together, and b waits for two seats rather than taking its slot for one sequence.
    assert [state(engine, n) for n in lengths] == ["running", "waiting", "running", "waiting", "running"]
    starts = started_at(engine, ["b1", "b2"], 12, finals)
    assert starts["b1"] == starts["b2"]
    finals.update(drain(engine))
    for name, length in lengths.items():
        assert finals[name].outputs[0].token_ids == oracle.greedy(name[0], PROMPT, length)


def test_an_overdue_group_short_of_seats_stops_younger_admissions_until_it_fits(model_dir, adapters, oracle):
    engine = make_llm(model_dir, max_loras=2, max_num_seqs=4, max_adapter_wait_steps=2).llm_engine
    a, b = lora_request("a", adapters["a"]), lora_request("b", adapters["b"])
    for request in (a, b):
        wait_loaded(engine, engine.load_adapter(request))
    for i, length in enumerate((3, 4, 5, 6)):
        engine.add_request(f"a{i}", PROMPT, params(length), lora_request=a)
    # b's two arrive while a's fill every seat, and a new request of resident a arrives at every step: each takes
    # the one seat a finishing sequence frees, unless b's overdue group holds the seats until two are free.
    arrivals = {0: [("b1", params(3), b), ("b2", params(3), b)]}
    for step in range(1, 30):
        arrivals[step] = [(f"late{step}", params(8), a)]
    finals = {}
    starts = started_at(engine, ["b1", "b2"], 30, finals, arrivals)
    assert set(starts) == {"b1", "b2"} and starts["b1"] == starts["b2"]
    finals.update(drain(engine, 2000))
    assert finals["b1"].outputs[0].token_ids == oracle.greedy("b", PROMPT, 3)
    assert finals["late29"].outputs[0].token_ids == oracle.greedy("a", PROMPT, 8)
