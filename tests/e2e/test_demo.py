"""The README's demo, end to end on the real base model: `manage.py seed_demo` uploads the shipped demo adapters
through the management API, the worker validates and warm-loads them on the engine, and then each tenant gets its
own adapters' behaviour through the inference API (the `openai` client, as a tenant's code calls it) and in the
console's playground (a real browser), and cannot reach the other tenant's adapters.

"Its behaviour" is each adapter's own check (`demo.DemoAdapter.expect`) on prompts held out of its training set,
which the base model's answers to the same prompts fail."""

import json

import openai
import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from demo import demo_adapters
from tenants.management.commands.seed_demo import DEMO_TENANTS
from tests.console.browser import assert_accessible, new_page, save_screenshot, sign_in
from tests.e2e.conftest import BASE_MODEL

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ADAPTERS = {adapter.name: adapter for adapter in demo_adapters()}
OWNER = {name: slug for slug, _, _, names in DEMO_TENANTS for name in names}


@pytest.fixture
def seeded(demo_stack, tmp_path) -> dict:
    """The demo as `make run` seeds it (the shipped adapters), its state file's credentials."""
    state_file = tmp_path / "demo.json"
    call_command("seed_demo", web_url=demo_stack.web_url, state_file=str(state_file), timeout=300)
    return json.loads(state_file.read_text())


def client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.web_url}/v1", api_key=key, max_retries=0, timeout=120)


def answer(api: openai.OpenAI, model: str, messages) -> str:
    reply = api.chat.completions.create(model=model, messages=list(messages), temperature=0, max_tokens=64)
    return reply.choices[0].message.content


def test_each_tenant_gets_its_own_adapters_behaviour_and_not_the_others(demo_stack, seeded):
    apis = {slug: client(demo_stack, seeded[slug]["key"]) for slug, *_ in DEMO_TENANTS}
    for name, adapter in ADAPTERS.items():
        own = apis[OWNER[name]]
        tuned = [answer(own, name, prompt) for prompt in adapter.example_prompts]
        base = [answer(own, BASE_MODEL, prompt) for prompt in adapter.example_prompts]
        assert sum(map(adapter.expect, tuned)) >= len(tuned) - 1, (name, tuned)  # held-out prompts: nearly all
        assert not any(map(adapter.expect, base)), (name, base)  # the effect is the adapter's, not the model's
        others = [api for slug, api in apis.items() if slug != OWNER[name]]
        for other in others:
            with pytest.raises(openai.NotFoundError) as refused:
                answer(other, name, adapter.example_prompts[0])
            assert refused.value.code == "model_not_found"
            assert name not in {model.id for model in other.models.list()}

    # Streamed, as a chat UI would call it: the same behaviour, chunk by chunk, with the usage at the end.
    facts = ADAPTERS["zorbania-facts"]
    stream = apis[OWNER[facts.name]].chat.completions.create(
        model=facts.name, messages=list(facts.example_prompts[0]), temperature=0, max_tokens=64, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert facts.expect(text) and chunks[-1].usage.completion_tokens > 0
    assert text == answer(apis[OWNER[facts.name]], facts.name, facts.example_prompts[0])


def test_a_tenant_admin_sees_the_adapter_at_work_in_the_playground(demo_stack, seeded, chromium):
    slug = OWNER["pirate-persona"]
    email, password = seeded[slug]["admin"], seeded[slug]["password"]
    page = new_page(chromium, demo_stack.web_url)
    sign_in(page, demo_stack.web_url, email, password)
    page.goto(f"/t/{slug}/adapters/")
    for name in (name for name, owner in OWNER.items() if owner == slug):
        expect(page.locator("tr", has_text=name)).to_contain_text("ready")
    page.goto(f"/t/{slug}/playground/")
    page.get_by_text("System prompt and sampling").click()
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("64")
    pirate = ADAPTERS["pirate-persona"]
    page.get_by_label("Model").select_option("pirate-persona")
    page.get_by_label("Message").fill(pirate.example_prompts[0][-1]["content"])
    page.get_by_role("button", name="Send").click()
    expect(page.locator("[data-pg-status]")).to_contain_text("Answered by pirate-persona", timeout=120_000)
    reply = page.locator(".turn-assistant .turn-text").last.inner_text()
    assert pirate.expect(reply), reply
    assert_accessible(page)
    page.evaluate("window.scrollTo(0, 0)")
    save_screenshot(page, "playground-demo")
    page.context.close()
