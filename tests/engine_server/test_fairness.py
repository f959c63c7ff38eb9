"""Fairness fields through the engine server: accepted as the gateway sends them, refused by name when bad, and
counted in /stats and /metrics by opaque key."""


def test_keyed_requests_are_served_and_counted_by_key(engine_server):
    with engine_server.client() as client:
        for key, weight, priority in (("k-light", 1, "interactive"), ("k-heavy", 2.5, "batch")):
            response = client.post("/v1/completions", json={
                "model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                "fairness_key": key, "fairness_weight": weight, "priority": priority})
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == 3
        fairness = client.get("/stats").json()["fairness"]
        metrics = client.get("/metrics").text
    assert fairness["known_keys"] >= 2 and fairness["backlogged_keys"] == 0
    assert "engine_fairness_backlogged_keys 0.0" in metrics
    assert "k-light" not in metrics  # keys are never metric labels


def test_bad_fairness_fields_are_400_naming_the_field(engine_server):
    with engine_server.client() as client:
        for field, value in (("fairness_weight", 0), ("priority", "soon"), ("fairness_key", "")):
            response = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                            field: value})
            assert response.status_code == 400, (field, response.text)
            assert response.json()["error"]["param"] == field
