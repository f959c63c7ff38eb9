"""Choosing a replica: rendezvous affinity for adapters, spill when the choice is saturated or down, least load
for the base model; health and load read from /health and /stats in the background."""

import asyncio
import json

import httpx
import pytest

from gateway.replicas import Replica, ReplicaPool, rank_replicas, rendezvous_score

URLS = [f"http://engine-{i}:8000" for i in range(3)]


def replicas(**states) -> list[Replica]:
    made = [Replica(url) for url in URLS]
    for index, fields in states.items():
        for name, value in fields.items():
            setattr(made[int(index[1:])], name, value)
    return made


def preferred_url(key: str, urls=URLS) -> str:
    return max(urls, key=lambda url: rendezvous_score(key, url))


def test_an_adapter_goes_to_its_rendezvous_replica_every_time_and_adapters_spread():
    pool = replicas()
    for key in ("adp_a_v1", "adp_b_v3", "adp_c_v2"):
        firsts = {rank_replicas(pool, key)[0].url for _ in range(20)}
        assert firsts == {preferred_url(key)}
    counts = {url: 0 for url in URLS}
    for i in range(600):
        counts[rank_replicas(pool, f"adp_{i}_v1")[0].url] += 1
    assert all(150 < count < 250 for count in counts.values()), counts


def test_losing_a_replica_moves_only_the_adapters_it_had():
    keys = [f"adp_{i}_v1" for i in range(300)]
    before = {key: preferred_url(key) for key in keys}
    after = {key: preferred_url(key, URLS[:2]) for key in keys}
    moved = [key for key in keys if before[key] != after[key]]
    assert moved and all(before[key] == URLS[2] for key in moved)


def test_a_saturated_or_down_choice_spills_to_the_least_loaded_healthy_replica():
    key = "adp_spill_v1"
    home = URLS.index(preferred_url(key))
    others = [i for i in range(3) if i != home]
    light, heavy = others
    states = {f"r{home}": {"saturated": True, "engine_load": 0}, f"r{light}": {"engine_load": 2},
              f"r{heavy}": {"engine_load": 9}}
    assert rank_replicas(replicas(**states), key)[0].url == URLS[light]
    states[f"r{light}"] = {"engine_load": 2, "saturated": True}
    assert rank_replicas(replicas(**states), key)[0].url == URLS[heavy]  # unsaturated before less loaded


def test_a_down_home_sends_its_adapter_to_its_next_ranked_replica_whatever_the_loads():
    keys = [f"adp_{i}_v1" for i in range(60)]
    for key in keys:
        order = [URLS.index(url) for url in sorted(URLS, key=lambda u: rendezvous_score(key, u), reverse=True)]
        states = {f"r{order[0]}": {"healthy": False}, f"r{order[1]}": {"engine_load": 50},
                  f"r{order[2]}": {"engine_load": 0}}
        ranked = rank_replicas(replicas(**states), key)
        assert [r.url for r in ranked] == [URLS[order[1]], URLS[order[2]], URLS[order[0]]]  # the down one last


def test_the_base_model_goes_to_the_least_loaded_and_in_flight_requests_count():
    pool = replicas(r0={"engine_load": 3}, r1={"engine_load": 1}, r2={"engine_load": 2})
    assert rank_replicas(pool, None)[0].url == URLS[1]
    pool[1].in_flight = 5  # sent since the last /stats
    assert rank_replicas(pool, None)[0].url == URLS[2]
    all_saturated = replicas(r0={"saturated": True, "engine_load": 4}, r1={"saturated": True, "engine_load": 1},
                             r2={"healthy": False})
    assert [r.url for r in rank_replicas(all_saturated, None)] == [URLS[1], URLS[0], URLS[2]]


class FakeEngines:
    """/health and /stats of three engines, as a MockTransport."""

    def __init__(self):
        self.stats = {url: {"requests": {"running": 0, "waiting": 0}, "saturated": False} for url in URLS}
        self.down: set[str] = set()
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.down:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        assert request.headers["authorization"] == "Bearer key"
        return httpx.Response(200, content=json.dumps(self.stats[base]).encode())


def run_with_pool(scenario, engines: FakeEngines, clock):
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(engines)) as http:
            pool = ReplicaPool(URLS, http, "key", ttl_s=1.0, clock=clock)
            return await scenario(pool)

    return asyncio.run(main())


def test_the_pool_reads_health_and_load_and_refreshes_in_the_background():
    engines, now = FakeEngines(), [100.0]
    engines.stats[URLS[0]] = {"requests": {"running": 4, "waiting": 3}, "saturated": True}
    engines.down.add(URLS[2])

    async def scenario(pool):
        first = await pool.candidates(None)  # nothing known: waits for the probes
        states = [(r.healthy, r.saturated, r.engine_load) for r in pool.replicas]
        engines.down.clear()
        calls = engines.calls
        now[0] += 0.5
        await pool.candidates(None)
        fresh_enough = engines.calls == calls
        now[0] += 1.0
        stale = await pool.candidates(None)  # answered from the old state; the refresh runs meanwhile
        await pool._refreshing
        return first, states, fresh_enough, stale, [r.healthy for r in pool.replicas]

    first, states, fresh_enough, stale, healthy_after = run_with_pool(scenario, engines, lambda: now[0])
    assert states == [(True, True, 7), (True, False, 0), (False, False, 0)]
    assert first[0].url == URLS[1] and first[-1].url == URLS[2]
    assert fresh_enough
    assert stale[-1].url == URLS[2]  # still believed down when the answer was given
    assert healthy_after == [True, True, True]


def test_a_replica_that_refuses_a_connection_is_marked_down_until_a_probe_finds_it_up():
    engines, now = FakeEngines(), [0.0]

    async def scenario(pool):
        await pool.candidates(None)
        pool.mark_down(pool.replicas[0])
        ranked = await pool.candidates(None)
        now[0] += 2
        await pool.candidates(None)
        await pool._refreshing
        return ranked, pool.replicas[0].healthy

    ranked, healthy_again = run_with_pool(scenario, engines, lambda: now[0])
    assert ranked[-1].url == URLS[0] and healthy_again


def test_a_pool_needs_engines():
    with pytest.raises(ValueError, match="ENGINE_URLS"):
        ReplicaPool([], None, "key", ttl_s=1)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def spread_pool(seats: int = 4) -> tuple[ReplicaPool, Clock]:
    clock = Clock()
    pool = ReplicaPool(URLS, http=None, api_key="k", ttl_s=1e9, clock=clock)
    for replica in pool.replicas:
        replica.seats, replica.checked_at = seats, 0.0  # fresh: no probe runs
    return pool, clock


def ranking_urls(key: str) -> list[str]:
    return sorted(URLS, key=lambda url: rendezvous_score(key, url), reverse=True)


def first_candidate(pool: ReplicaPool, key: str) -> Replica:
    return asyncio.run(pool.candidates(key))[0]


def open_requests(pool: ReplicaPool, key: str, count: int) -> list[Replica]:
    chosen = []
    for _ in range(count):
        replica = first_candidate(pool, key)
        pool.opened(replica, key)
        chosen.append(replica)
    return chosen


def test_a_hot_adapter_spreads_over_its_ranking_and_narrows_back_when_it_cools():
    pool, clock = spread_pool(seats=4)
    key, order = "adp_hot_v1", ranking_urls("adp_hot_v1")
    first = open_requests(pool, key, 4)
    assert {r.url for r in first} == {order[0]} and pool.spread_of(key) == 1  # what one replica seats
    clock.now = 10.0
    more = open_requests(pool, key, 4)  # past one replica's seats: the second of its ranking joins
    assert pool.spread_of(key) == 2
    assert {r.url for r in more} == {order[1]}  # the least loaded of the set
    grown = open_requests(pool, key, 4)  # within SPREAD_HOLD_S of the last change: no third yet
    assert pool.spread_of(key) == 2 and {r.url for r in grown} == {order[0], order[1]}
    for replica in first + more + grown:
        pool.closed(replica, key)
    clock.now = 20.0
    open_requests(pool, key, 1)  # cool: the shrink timer starts, the set holds
    assert pool.spread_of(key) == 2
    clock.now = 20.0 + 29.0
    first_candidate(pool, key)
    assert pool.spread_of(key) == 2
    clock.now = 20.0 + 31.0
    first_candidate(pool, key)
    assert pool.spread_of(key) == 1


def test_cold_adapters_stay_on_their_one_rendezvous_replica():
    pool, _ = spread_pool(seats=4)
    for i in range(30):
        key = f"adp_cold{i}_v1"
        for replica in open_requests(pool, key, 2):
            assert replica.url == ranking_urls(key)[0]
        assert pool.spread_of(key) == 1


def test_a_spread_set_still_spills_when_all_of_it_is_saturated():
    pool, clock = spread_pool(seats=1)
    key, order = "adp_x_v1", ranking_urls("adp_x_v1")
    open_requests(pool, key, 1)
    clock.now = 5.0
    open_requests(pool, key, 1)
    assert pool.spread_of(key) == 2
    for replica in pool.replicas:
        replica.saturated = replica.url in order[:2]
    assert first_candidate(pool, key).url == order[2]
