"""Adapters, the playground and engine status in a real browser (Chromium through Playwright) against the whole
stack: the browser PUTs adapter files straight to SeaweedFS on presigned URLs, the stack's Celery worker validates
them and warm-loads them on one of its LoRA engines (tiny random Llama, served as ``tiny``), the playground streams
through the gateway, and operators read the engines' /stats. Every page is checked with axe-core."""

import hashlib
import os
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from adapters.models import Adapter, AdapterVersion
from gateway.replicas import rendezvous_score
from tenants import services
from tenants.models import Role, UsageRecord
from tests.adapters.stack_client import Caller
from tests.console.browser import assert_accessible, new_page, save_screenshot, sign_in
from tests.tenants.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.stack, pytest.mark.slow]
CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
FINISHED_MS = 90_000  # validation with a warm load, or an answer, on a busy 2-core machine


@dataclass
class AdapterFiles:
    good: Path  # a PEFT folder for the stack's model: rank 8, alpha 16, q_proj and v_proj
    zipped: Path  # the same in a zip beside a 9 MiB README: over one 8 MiB part, so two presigned PUTs
    wrong: Path  # lora_B of layer 1's q_proj with the wrong shape
    wrong_reason: str


@pytest.fixture(scope="module")
def adapter_files(stack, tmp_path_factory) -> AdapterFiles:
    from engine.lora.format import peft_tensor_name
    from tests.adapters.conftest import fingerprint_of, served_model_dir_for
    from tests.support import peft_factory

    root = tmp_path_factory.mktemp("console-adapters")
    model_dir = served_model_dir_for(stack.env)
    good = peft_factory.make_peft_adapter(model_dir, root / "good")
    zipped = root / "support-bot.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_STORED) as archive:
        for name in (CONFIG, WEIGHTS):
            archive.write(good / name, f"support-bot/{name}")
        archive.writestr("support-bot/README.md", os.urandom(9 << 20))
    q_out = fingerprint_of(model_dir).module_shape("q_proj")[1]
    wrong = peft_factory.write_wrong_shape_adapter(good, root / "wrong", name=peft_tensor_name(1, "q_proj", "B"),
                                                   shape=(q_out // 2, 8))
    return AdapterFiles(good, zipped, wrong,
                        f"lora_B of layers.1.self_attn.q_proj has shape [{q_out // 2}, 8], expected [{q_out}, 8]")


@dataclass
class Lab:
    base_url: str
    tenant: object
    admin: object
    operator: object


@pytest.fixture
def lab(stack, chromium, transactional_db, fresh_quota_counters) -> Lab:
    tenant = services.tenant_create(name="Acme Robotics", slug="acme")
    admin = MembershipFactory(tenant=tenant, role=Role.ADMIN, user=UserFactory(email="ada@acme.test")).user
    return Lab(stack.web_url, tenant, admin, UserFactory(email="ops@platform.test", is_staff=True))


def drop_files(page: Page, target: str, paths: list[Path]) -> None:
    """Drag files from outside the page and drop them on ``target``, as a person does from a file manager."""
    import base64

    files = [{"name": path.name, "data": base64.b64encode(path.read_bytes()).decode()} for path in paths]
    transfer = page.evaluate_handle("""(files) => {
        const transfer = new DataTransfer();
        for (const f of files) {
            transfer.items.add(new File([Uint8Array.from(atob(f.data), c => c.charCodeAt(0))], f.name));
        }
        return transfer;
    }""", files)
    for event in ("dragenter", "dragover", "drop"):
        page.dispatch_event(target, event, {"dataTransfer": transfer})


# Every value the progress bar takes (a MutationObserver keeps each old value; the last is read at the end).
RECORD_PROGRESS = """() => {
    window.progressSeen = [];
    new MutationObserver(records => records.forEach(r => window.progressSeen.push(Number(r.oldValue))))
        .observe(document.querySelector("[data-progress]"), {attributes: true, attributeFilter: ["value"],
                                                               attributeOldValue: true});
}"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_admin_uploads_by_drag_and_drop_watches_validation_and_deletes(chromium, lab, adapter_files):
    files = adapter_files
    page = new_page(chromium, lab.base_url)
    sign_in(page, lab.base_url, lab.admin.email)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Adapters").click()
    expect(page.get_by_test_id("adapter-count")).to_contain_text("0 of")
    page.get_by_label("Name").fill("support-bot")
    page.get_by_label("Description").fill("Answers support tickets")
    drop_files(page, "[data-dropzone]", [files.good / CONFIG, files.good / WEIGHTS])
    expect(page.locator("[data-file-list] li")).to_have_count(2)
    assert_accessible(page)
    save_screenshot(page, "adapters-upload")
    page.get_by_role("button", name="Upload adapter").click()

    expect(page).to_have_url(f"{lab.base_url}/t/acme/adapters/support-bot/")  # validation is watched there
    expect(page.locator("#version-1")).to_have_attribute("data-status", "ready", timeout=FINISHED_MS)
    v1 = AdapterVersion.objects.get(adapter__tenant=lab.tenant, adapter__name="support-bot", number=1)
    assert v1.warm_loaded_at is not None  # one of the stack's LoRA engines loaded it before it became ready
    expect(page.get_by_test_id("config-rank")).to_have_text("8")
    expect(page.get_by_test_id("config-targets")).to_have_text("q_proj, v_proj")
    expect(page.get_by_test_id("config-sha256")).to_have_text(sha256(files.good / WEIGHTS))
    expect(page.get_by_test_id("config-engine-id")).to_have_text(v1.engine_id)

    puts = []
    page.on("request", lambda request: puts.append(request.url) if request.method == "PUT" else None)
    page.evaluate(RECORD_PROGRESS)
    page.get_by_label("Adapter files").set_input_files(files.zipped)
    page.get_by_role("button", name="Upload version").click()
    status = page.locator("[data-upload-status]")
    expect(status).to_have_text("Version 2 is ready and serving.", timeout=FINISHED_MS)
    progress = page.evaluate("window.progressSeen") + [page.locator("[data-progress]").evaluate("bar => bar.value")]
    assert progress[-1] == 100 and any(0 < value < 100 for value in progress), progress
    assert len(puts) == 2 and all(re.search(r"[?&]partNumber=[12]&", url + "&") for url in puts), puts
    expect(page.get_by_test_id("serving-version")).to_have_text("version 2")

    drop_files(page, "[data-dropzone]", [files.wrong / CONFIG, files.wrong / WEIGHTS])
    page.get_by_role("button", name="Upload version").click()
    expect(page.get_by_test_id("failure-v3")).to_contain_text(
        f"Version 3 failed validation: {files.wrong_reason}", timeout=FINISHED_MS)
    expect(status).to_have_text(f"Version 3 failed validation: {files.wrong_reason}")
    expect(page.get_by_test_id("serving-version")).to_have_text("version 2")
    assert_accessible(page)
    save_screenshot(page, "adapter-detail", full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete version 3").click()
    expect(page.locator("#version-3")).to_have_count(0)
    expect(page.locator("#messages")).to_contain_text("Version 3 of support-bot is deleted")

    page.goto("/t/acme/adapters/")
    row = page.get_by_role("row", name=re.compile("support-bot"))
    expect(row).to_contain_text("ready")
    expect(row).to_contain_text("version 2")
    expect(page.get_by_test_id("adapter-count")).to_contain_text("1 of")
    save_screenshot(page, "adapters")
    page.get_by_label("Name").fill("support-bot")  # taken: refused before any byte goes anywhere
    drop_files(page, "[data-dropzone]", [files.good / CONFIG, files.good / WEIGHTS])
    page.get_by_role("button", name="Upload adapter").click()
    expect(page.locator("#adapter-name-error")).to_contain_text("exists")
    expect(page.get_by_label("Name")).to_have_attribute("aria-invalid", "true")
    # The storage quota shrinks after the page was drawn: the registry refuses the upload, and the adapter
    # created for it is deleted again, so nothing half-made is left.
    stored = sum(v.size_bytes for v in AdapterVersion.objects.filter(adapter__tenant=lab.tenant, status="ready",
                                                                      deleted_at__isnull=True))
    services.quota_set(tenant=lab.tenant, changes={"max_adapter_storage_bytes": stored + 100})
    page.get_by_label("Name").fill("faq-bot")
    page.get_by_role("button", name="Upload adapter").click()
    expect(page.locator("[data-upload-status]")).to_contain_text("Upload failed: The upload is")
    expect(page.locator("[data-upload-status]")).to_contain_text("of adapter storage are left")
    assert not Adapter.objects.filter(tenant=lab.tenant, name="faq-bot", deleted_at__isnull=True).exists()

    page.get_by_role("link", name="support-bot").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete adapter \u201csupport-bot\u201d").click()
    expect(page).to_have_url(f"{lab.base_url}/t/acme/adapters/")
    expect(page.locator("#messages")).to_contain_text("is deleted")
    expect(page.locator("#adapter-list")).to_have_count(0)
    page.context.close()


# The lengths the assistant's answer takes as it is written: more than one means it was streamed.
WATCH_ANSWER = """() => {
    window.answerLengths = [];
    const transcript = document.querySelector("[data-transcript]");
    new MutationObserver(() => {
        const answers = transcript.querySelectorAll(".turn-assistant .turn-text");
        if (answers.length) window.answerLengths.push(answers[answers.length - 1].textContent.length);
    }).observe(transcript, {childList: true, subtree: true, characterData: true});
}"""


def ask(page: Page, model: str, message: str) -> dict[str, int]:
    """Send ``message`` to ``model`` in the playground; the token counts shown once the answer is complete."""
    page.get_by_label("Model").select_option(model)
    page.evaluate(WATCH_ANSWER)
    page.get_by_label("Message").fill(message)
    page.get_by_role("button", name="Send").click()
    expect(page.locator("[data-pg-status]")).to_contain_text(f"Answered by {model}", timeout=FINISHED_MS)
    lengths = page.evaluate("window.answerLengths")
    assert len(set(lengths)) >= 2 and lengths[-1] > 0, lengths  # written piece by piece
    return {name: int(page.get_by_test_id(name).inner_text())
            for name in ("prompt-tokens", "completion-tokens", "total-tokens")}


def usage_row(tenant, adapter: str) -> UsageRecord:
    """The request's usage row (written as the stream ends, a moment after the browser has its last byte)."""
    deadline = time.monotonic() + 30
    while (row := UsageRecord.objects.filter(tenant=tenant, adapter=adapter).first()) is None:
        assert time.monotonic() < deadline, f"no usage row for {adapter!r}"
        time.sleep(0.1)
    return row


def test_playground_streams_answers_billed_to_the_tenant_and_operators_see_the_engines(chromium, lab, stack,
                                                                                       adapter_files):
    caller = Caller(stack, lab.tenant)
    caller.create("support-bot")
    assert caller.upload_presigned("support-bot", [adapter_files.good / CONFIG,
                                                   adapter_files.good / WEIGHTS]).status_code == 202
    assert caller.wait("support-bot", [1])[1]["status"] == "ready"

    page = new_page(chromium, lab.base_url)
    sign_in(page, lab.base_url, lab.admin.email)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Playground").click()
    page.get_by_text("System prompt and sampling").click()
    page.get_by_label("Max tokens").fill("24")
    page.get_by_label("Temperature").fill("0")
    base = ask(page, "tiny", "the quick cat")
    row = usage_row(lab.tenant, "")
    assert row.playground and row.api_key_id is None
    assert (row.prompt_tokens, row.completion_tokens) == (base["prompt-tokens"], base["completion-tokens"])
    assert base["total-tokens"] == base["prompt-tokens"] + base["completion-tokens"]
    tuned = ask(page, "support-bot", "and the dog")
    row = usage_row(lab.tenant, "support-bot")
    assert (row.playground, row.prompt_tokens, row.completion_tokens) == (
        True, tuned["prompt-tokens"], tuned["completion-tokens"])
    assert tuned["prompt-tokens"] > base["prompt-tokens"]  # the conversation so far went with it
    expect(page.locator(".turn")).to_have_count(4)
    assert_accessible(page)
    page.evaluate("window.scrollTo(0, 0)")
    save_screenshot(page, "playground")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    # A click does not wait for the next page: wait until its chart is drawn.
    page.wait_for_function("() => window.Chart && Chart.getChart(document.getElementById('tokens-chart'))")
    today = page.evaluate("""Object.fromEntries(Chart.getChart(document.getElementById("tokens-chart")).data.datasets
                             .map(d => [d.label, d.data[d.data.length - 1]]))""")
    assert today == {"base model": base["total-tokens"], "support-bot": tuned["total-tokens"]}
    page.context.close()

    operator = new_page(chromium, lab.base_url)
    sign_in(operator, lab.base_url, lab.operator.email)
    operator.get_by_role("navigation", name="Main").get_by_role("link", name="Engine status").click()
    expect(operator.locator('[data-testid="replica"][data-state="up"]')).to_have_count(len(stack.engine_urls))
    # The gateway sent it to its rendezvous replica, which holds it in a slot (the replica that warm-loaded it
    # may hold it too); operators see it named by tenant and adapter.
    engine_id = AdapterVersion.objects.get(adapter__tenant=lab.tenant, adapter__name="support-bot").engine_id
    home = max(stack.engine_urls, key=lambda url: rendezvous_score(engine_id, url))
    served_by = operator.locator('[data-testid="replica"]', has_text=home)
    expect(served_by.get_by_role("row", name=re.compile(r"^slot \d+ Acme Robotics support-bot v1 "))).to_have_count(1)
    assert_accessible(operator)
    save_screenshot(operator, "engine-status", full_page=True)
    operator.context.close()
