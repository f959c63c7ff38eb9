"""Pages whose parts are still being built (the adapter registry, the gateway's playground, engine stats): they
say what will be there, and show no made-up data."""

from django.contrib.auth.decorators import login_required

from console.access import access_tenant, operator_required
from console.views.common import render_page

COMING = {
    "adapters": (
        "Adapters",
        "Your LoRA adapters with their status and versions; upload a PEFT folder or archive by drag and drop "
        "straight to storage with a progress bar; watch validation live, with any failure reason shown plainly; "
        "see each adapter's configuration and versions, and delete with confirmation.",
    ),
    "playground": (
        "Playground",
        "Pick an adapter (or the base model), send a prompt and watch the answer stream in with its token "
        "counts. Requests go through the same gateway as your API keys and count toward this tenant's usage.",
    ),
    "engines": (
        "Engine status",
        "Each engine replica's health, queue length, KV-cache use, resident adapters and adapter-slot hit rate, "
        "read from the engines' /stats.",
    ),
}


def _coming(request, page: str, *, access=None, nav: str):
    title, description = COMING[page]
    return render_page(request, "console/coming.html", {"title": title, "description": description},
                       access=access, nav=nav)


@login_required
def adapters(request, slug: str):
    return _coming(request, "adapters", access=access_tenant(request, slug), nav="adapters")


@login_required
def playground(request, slug: str):
    return _coming(request, "playground", access=access_tenant(request, slug), nav="playground")


@operator_required
def engines(request):
    return _coming(request, "engines", nav="operator-engines")
